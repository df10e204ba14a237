"""Transforms of the last axis on sharded arrays: per shard, with no gather.

A kernel that is a custom call (the C++ FFI kernel, a Pallas kernel) is opaque to XLA's SPMD
partitioner, which by default replicates its operand across devices first (an all-gather) and
slices the result. One mechanism per sharding mode of JAX avoids that:

* Explicit sharding (``jax.make_mesh``'s default axis type: the operand's type carries its
  sharding): ``per_shard`` expands the kernel into a ``jax.shard_map`` over the operand's mesh
  with the operand's spec as in and out spec, so every device runs the kernel on its shard.
* Automatic sharding (``Auto`` axes, a plain ``jax.sharding.Mesh``: the partitioner decides
  after tracing): ``auto_per_shard`` wraps the kernel in ``jax.experimental.custom_partitioning``
  with a Shardy sharding rule (``... n -> ... n``: every axis of the result is sharded like the
  same axis of the operand), JAX's documented mechanism for a custom op under Shardy. Shardy
  propagates the operand's sharding through the call, and the partition callback lowers the
  kernel again for the shard's shape, so every kernel, compiled for one shape or not, runs per
  shard. ``auto_rows`` does the same for a kernel with replicated side operands (the fused
  structured-coupling chain).

In both modes a sharded transformed axis (split over p devices, p a power of two dividing n;
several mesh axes allowed) is a distributed transform: with n = p m and the vector split into p
contiguous blocks x_j, H_n = H_p (x) H_m, so y_j = sum_j' H_p[j, j'] (H_m x_j'); each device
transforms its block, then log2 p butterfly stages across devices (``lax.ppermute`` with the
partner j xor 2^s) add and subtract the blocks. Each device sends and receives log2 p blocks and
nothing is replicated. Half types cross devices in float32 and are rounded once, like the local
transform. Under automatic axes a transformed axis split otherwise (p not a power of two, or not
dividing n) is gathered along that axis alone.

``custom_partitioning`` needs the device assignment when its caller is lowered, which JAX hands
only to programs whose jaxpr holds a primitive listed in ``prim_requires_devices_during_lowering``
(JAX's own ``custom_partitioning_p`` and cuDNN attention are; Transformer Engine registers its
primitives the same way). The kernels here are lowered inside rfjax's own primitives (which carry
the AD and batching rules that ``custom_partitioning`` lacks), so ``requires_devices`` lists those
primitives there. That registry is the one private JAX name this module uses; without it (another
JAX version) ``AUTO_PARTITIONING`` is False and automatic axes fall back to XLA's default (an
all-gather of the operand).

Limits: Pallas' TPU and Mosaic GPU interpret modes (simulators on CPU, for tests) call back into
Python with ordered effects, which ``custom_partitioning`` cannot carry: under automatic axes their
operand is gathered (explicit axes run them per shard). Inside ``shard_map`` over every mesh axis
the kernel is already local and is called directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from rfjax.ops._fwht_xla import accumulation_dtype

try:  # the registry behind custom_partitioning's device assignment (see the module doc)
    from jax._src import dispatch as _dispatch

    _NEEDS_DEVICES: set | None = _dispatch.prim_requires_devices_during_lowering
except (ImportError, AttributeError):  # pragma: no cover - another JAX version
    _NEEDS_DEVICES = None

AUTO_PARTITIONING = _NEEDS_DEVICES is not None

Kernel = Callable[[jax.Array, bool], jax.Array]  # (x, normalize) -> H x along the last axis


def requires_devices(primitive) -> None:
    """Lets ``primitive``'s lowering use ``custom_partitioning`` (see the module doc)."""
    if _NEEDS_DEVICES is not None:
        _NEEDS_DEVICES.add(primitive)


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


def _local(kernel: Kernel, normalize: bool, axes, p: int) -> Callable[[jax.Array], jax.Array]:
    """The per-device body: the kernel on the shard, distributed when the vectors span p > 1."""
    if p == 1:
        return lambda x: kernel(x, normalize)
    return lambda x: _distributed(x, kernel, normalize, axes, p)


def per_shard(kernel: Kernel, aval, normalize: bool) -> Callable[[jax.Array], jax.Array]:
    """``x -> kernel(x, normalize)``, as a ``shard_map`` when ``aval`` has an explicit sharding."""
    spec = explicit_spec(aval)
    if spec is None:
        return lambda x: kernel(x, normalize)
    mesh = aval.sharding.mesh
    axes = _mesh_axes(spec[-1])
    p = math.prod(mesh.shape[a] for a in axes)
    # check_vma=False: the body is per shard by construction (a foreign kernel's output type
    # does not record which mesh axes it varies over).
    return jax.shard_map(
        _local(kernel, normalize, axes, p),
        mesh=mesh,
        in_specs=PartitionSpec(*spec),
        out_specs=PartitionSpec(*spec),
        check_vma=False,
    )


def _named_spec(sharding, ndim: int) -> tuple | None:
    """A ``NamedSharding``'s spec padded to ``ndim``; None for a sharding without mesh axes."""
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec)
    return spec + (None,) * (ndim - len(spec))


def _same_as_operand(mesh, arg_shapes, result_shape):
    """The result's sharding under GSPMD (Shardy reads the sharding rule instead)."""
    del mesh, result_shape
    return arg_shapes[0].sharding


def _closed(fn: Callable) -> Callable:
    """``fn`` behind ``jit``: a kernel that closes over arrays (Pallas' interpret mode) becomes a
    closed function, as ``custom_partitioning`` needs."""
    return jax.jit(fn)


def auto_per_shard(kernel: Kernel, normalize: bool) -> Callable[[jax.Array], jax.Array]:
    """``x -> kernel(x, normalize)`` partitioned per shard under automatic sharding (module doc).

    Raises (when partitioned):
      NotImplementedError: if the transformed axis is split by a sharding that names no mesh
        axes (not a ``NamedSharding``), so that the blocks cannot be exchanged.
    """
    if not AUTO_PARTITIONING:
        return lambda x: kernel(x, normalize)

    @custom_partitioning
    def transform(x):
        return _closed(lambda v: kernel(v, normalize))(x)

    def partition(mesh, arg_shapes, result_shape):
        del result_shape
        (arg,) = arg_shapes
        n = arg.shape[-1]
        spec = _named_spec(arg.sharding, arg.ndim)
        if spec is None:
            if arg.sharding.shard_shape(arg.shape)[-1] != n:
                raise NotImplementedError(
                    f"fwht under automatic sharding: the transformed axis (length {n}) is split "
                    f"by {arg.sharding}, which names no mesh axes; shard it with a NamedSharding"
                )
            return mesh, _closed(_local(kernel, normalize, (), 1)), arg.sharding, (arg.sharding,)
        axes = _mesh_axes(spec[-1])
        p = math.prod(mesh.shape[a] for a in axes)
        if p > 1 and (p & (p - 1) or n % p):  # not a power-of-two split: gather this axis
            spec, axes, p = (*spec[:-1], None), (), 1
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        return mesh, _closed(_local(kernel, normalize, axes, p)), sharding, (sharding,)

    transform.def_partition(
        partition,
        infer_sharding_from_operands=_same_as_operand,
        sharding_rule="... n -> ... n",
    )
    return transform


def auto_rows(fn: Callable[..., jax.Array], sharding_rule: str) -> Callable[..., jax.Array]:
    """``fn(x, *factors)`` partitioned over the leading axes of x under automatic sharding.

    ``fn`` maps x of shape ``(..., p)`` and replicated factor operands to ``(..., *tail)``;
    every device applies it to its rows of x. ``sharding_rule`` is its Shardy rule (the factors
    of the last axis of x and of the other operands are marked as needing replication).
    """
    if not AUTO_PARTITIONING:
        return fn

    @custom_partitioning
    def apply(x, *factors):
        return _closed(fn)(x, *factors)

    def partition(mesh, arg_shapes, result_shape):
        x, *factors = arg_shapes
        lead = _named_spec(x.sharding, x.ndim)
        if lead is None:
            raise NotImplementedError(
                f"under automatic sharding, x is sharded by {x.sharding}, which names no mesh "
                f"axes; shard it with a NamedSharding"
            )
        lead = lead[:-1]
        tail = (None,) * (result_shape.ndim - len(lead))
        replicated = [NamedSharding(mesh, PartitionSpec()) for _ in factors]
        in_shardings = (NamedSharding(mesh, PartitionSpec(*lead, None)), *replicated)
        out_sharding = NamedSharding(mesh, PartitionSpec(*lead, *tail))
        return mesh, _closed(fn), out_sharding, in_shardings

    def infer(mesh, arg_shapes, result_shape):
        spec = _named_spec(arg_shapes[0].sharding, arg_shapes[0].ndim) or ()
        lead = spec[:-1]
        return NamedSharding(mesh, PartitionSpec(*lead, *(None,) * (result_shape.ndim - len(lead))))

    operand_rules, _ = sharding_rule.split("->")
    # every named factor (not the leading "...") stays replicated; listed in order of appearance
    names = [f for f in operand_rules.replace(",", " ").split() if f != "..."]
    factors = dict.fromkeys(names)
    apply.def_partition(
        partition,
        infer_sharding_from_operands=infer,
        sharding_rule=sharding_rule,
        need_replication_factors=tuple(factors),
    )
    return apply
