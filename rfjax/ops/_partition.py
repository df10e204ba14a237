"""Transforms of the last axis on sharded arrays: per shard, with no gather.

A kernel that is a custom call (the C++ FFI kernel, a Pallas kernel) is opaque to XLA's SPMD
partitioner, which by default replicates its operand across devices first (an all-gather) and
slices the result. Two public mechanisms avoid that, one per sharding mode of JAX:

* Explicit sharding (``jax.make_mesh``'s default axis type: the operand's type carries its
  sharding): ``per_shard`` expands the kernel into a ``jax.shard_map`` over the operand's mesh
  with the operand's spec as in and out spec, so every device runs the kernel on its shard.
  If the transformed axis itself is sharded over p devices (p a power of two dividing n; several
  mesh axes allowed), the body is a distributed transform: with n = p m and the vector split
  into p contiguous blocks x_j, H_n = H_p (x) H_m, so y_j = sum_j' H_p[j, j'] (H_m x_j'); each
  device transforms its block, then log2 p butterfly stages across devices (``lax.ppermute``
  with the partner j xor 2^s) add and subtract the blocks. Each device sends and receives
  log2 p blocks and nothing is replicated. Half types cross devices in float32 and are rounded
  once, like the local transform.
* Automatic sharding (``Auto`` axes, the partitioner decides after tracing): the pure-XLA
  implementations (``"xla"``, ``"matmul"``) are partitioned by XLA like any XLA code. The C++
  kernel's FFI targets are registered with ``jax.ffi.register_ffi_target_as_batch_partitionable``
  and each call is tagged with its number of leading (batch) axes, so XLA splits the call along
  those axes (a sharded transformed axis is gathered along that axis alone first). Shardy,
  however, does not propagate a sharding through a foreign call: the call runs per shard, but
  its result is gathered unless the program fixes its sharding (``jit(...,
  out_shardings=...)``, ``with_sharding_constraint``). A Pallas kernel is compiled for one
  shape and cannot be re-partitioned after tracing: XLA gathers its operand. Both limits are
  specific to automatic sharding; with explicit axes (above) every kernel runs per shard.

``jax.experimental.custom_partitioning`` (the other documented mechanism) was rejected: its
lowering needs the device assignment, which JAX only provides for primitives registered in a
private registry, so a primitive with its own AD and batching rules cannot use it with public
APIs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from rfjax.ops._fwht_xla import accumulation_dtype

Kernel = Callable[[jax.Array, bool], jax.Array]  # (x, normalize) -> H x along the last axis


def explicit_spec(aval) -> tuple | None:
    """The operand's sharding spec padded to its rank if it names mesh axes, else None."""
    sharding = getattr(aval, "sharding", None)
    spec = tuple(getattr(sharding, "spec", ()) or ())
    if not any(entry is not None for entry in spec):
        return None
    return spec + (None,) * (len(aval.shape) - len(spec))


def _mesh_axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _distributed(x: jax.Array, kernel: Kernel, normalize: bool, axes, p: int) -> jax.Array:
    """The transform of vectors split in p blocks over ``axes``, inside ``shard_map``."""
    y = kernel(x.astype(accumulation_dtype(x.dtype)), False)  # H_m x_j
    index = lax.axis_index(axes)
    bit = 1
    while bit < p:
        partner = lax.ppermute(y, axes, perm=[(j, j ^ bit) for j in range(p)])
        y = jnp.where((index & bit) != 0, partner - y, y + partner)
        bit *= 2
    if normalize:
        y = y * (1.0 / math.sqrt(x.shape[-1] * p))
    return y.astype(x.dtype)


def per_shard(kernel: Kernel, aval, normalize: bool) -> Callable[[jax.Array], jax.Array]:
    """``x -> kernel(x, normalize)``, as a ``shard_map`` when ``aval`` has an explicit sharding."""
    spec = explicit_spec(aval)
    if spec is None:
        return lambda x: kernel(x, normalize)
    mesh = aval.sharding.mesh
    axes = _mesh_axes(spec[-1])
    p = math.prod(mesh.shape[a] for a in axes)

    def body(x):
        if p == 1:
            return kernel(x, normalize)
        return _distributed(x, kernel, normalize, axes, p)

    # check_vma=False: the body is per shard by construction (a foreign kernel's output type
    # does not record which mesh axes it varies over).
    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=PartitionSpec(*spec),
        out_specs=PartitionSpec(*spec),
        check_vma=False,
    )
