"""The structured-coupling chain y_b = N_b [S] (H D_{b,k}) ... (H D_{b,1}) x as one primitive.

This is what fast ORF and fast SimRF apply (``rfjax.projections.hd_orthogonal``/``fast_simplex``):
per block b, k Rademacher diagonals D (``signs``), the normalised Hadamard matrix H, optionally
the simplex map S (``apply_simplex``) and the row norms N (``norms``). ``hd_chain_p`` lowers to
the fused kernel of the backend (``FwhtBackend.chain`` in ``rfjax.ops._fwht_backends``: the C++
kernel on CPU, every stage of a row's block in L1; Pallas TPU, one HBM read of x and one write
of y, every stage in VMEM) where it takes the operand, and otherwise to the composition of
``fwht`` calls with the same implementation and elementwise products (``chain_reference``),
which XLA fuses around the transforms.

Rules: linear in x, so its JVP in x is the chain of the tangent and its transpose is
``jax.linear_transpose`` of the reference; a JVP in the signs or norms (a projection that is
being differentiated) goes through the reference. ``vmap`` over x alone keeps one kernel call;
``vmap`` over the factors (per-head projections) runs the reference under ``vmap``. On x with an
sharded x the fused kernel runs per shard of its leading axes, the factors replicated
(explicit axes: ``jax.shard_map``; automatic axes: ``custom_partitioning``; see
``rfjax.ops._partition``); the composition's ``fwht`` calls run per shard by themselves, and an
explicitly sharded transformed axis goes through the composition, whose ``fwht`` calls transform
it across devices.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import PartitionSpec

from rfjax._validation import as_array
from rfjax.ops._fwht import fwht_p, kernel_effects
from rfjax.ops._fwht_backends import fwht_backend, fwht_backends, resolve_fwht
from rfjax.ops._partition import auto_rows, explicit_spec, requires_devices


def apply_simplex(z: jax.Array, *, axis: int = -1) -> jax.Array:
    """S z along ``axis`` in O(d) per vector (SimRF App. B.2.1), S the matrix of Eq. 9 rows.

    With sigma = sum_{j<d} z_j: (Sz)_i = sqrt(d/(d-1)) z_i - (sqrt(d)+1)/(d-1)^{3/2} sigma for
    i < d, and (Sz)_d = sigma/sqrt(d-1). The last coordinate of z is ignored (S has a zero last
    column).

    Args:
      z: array whose ``axis`` has length d >= 2.
      axis: the axis S acts on.

    Returns:
      S z, of the shape and dtype of ``z``.

    Raises:
      TypeError: if ``z`` is not floating or ``axis`` is not an integer.
      ValueError: if ``axis`` is out of range or its length d is < 2.

    Examples:
      >>> import jax.numpy as jnp
      >>> jnp.round(apply_simplex(jnp.array([1.0, 0.0])), 4)  # d = 2: the directions are +-1
      Array([-1.,  1.], dtype=float32)

    References:
      Reid et al., "Simplex Random Features", ICML 2023, arXiv:2301.13856, Eq. 9, App. B.2.1.
    """
    z = as_array("z", z)
    if not jnp.issubdtype(z.dtype, jnp.floating):
        raise TypeError(f"z must be a floating array, got dtype {z.dtype}")
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an integer, got {axis!r} of type {type(axis).__name__}")
    if not -z.ndim <= axis < z.ndim:
        raise ValueError(f"axis {axis} is out of range for z of shape {z.shape}")
    z = jnp.moveaxis(z, axis, -1)
    d = z.shape[-1]
    if d < 2:
        raise ValueError(
            f"apply_simplex needs the axis length d >= 2 (a regular simplex of d unit vectors "
            f"in R^d); got d = {d} for z of shape {z.shape} and axis={axis}"
        )
    # The last coordinate by a mask, not by slicing: elementwise operations and a sum keep an
    # axis sharded across devices as it is (a slice of d - 1 entries cannot be split evenly).
    last = jnp.arange(d) == d - 1
    sigma = jnp.sum(jnp.where(last, jnp.zeros_like(z), z), axis=-1, keepdims=True)
    scaled = math.sqrt(d / (d - 1)) * z - (math.sqrt(d) + 1) / (d - 1) ** 1.5 * sigma
    out = jnp.where(last, sigma / math.sqrt(d - 1), scaled)
    return jnp.moveaxis(out, -1, axis)


def chain_reference(
    x: jax.Array,
    signs: jax.Array,
    norms: jax.Array,
    *,
    simplex: bool,
    implementation: str = "auto",
) -> jax.Array:
    """``(..., p) -> (..., B, p)``: the chain as ``fwht`` calls and products (the reference).

    The same map as ``hd_chain`` (see there for the arguments), unfused: each rotation is one
    ``fwht`` (with ``implementation``), the diagonals, S and N elementwise products between.
    """
    y = x[..., None, :]
    for stage in range(signs.shape[-2]):
        y = fwht_p.bind(y * signs[..., stage, :], normalize=True, implementation=implementation)
    if simplex:
        y = apply_simplex(y, axis=-1)
    return y * norms


def _fused_backend(implementation: str, platform: str, x_aval):
    """The backend whose fused kernel this lowering uses, or None for the composition of
    ``fwht`` calls.

    ``"auto"``: the fused kernel of the backend compiled for ``platform`` that has one (the C++
    kernel on CPU, Pallas TPU on TPU), where it takes the operand. A named backend: its own
    fused kernel where it takes the operand (raising off its platforms).
    """
    p, dtype = x_aval.shape[-1], x_aval.dtype
    if implementation == "auto":
        compiled = [fwht_backend(name) for name in fwht_backends(platform=platform)]
        candidates = [backend for backend in compiled if backend.platforms and backend.chain]
    else:
        resolve_fwht(implementation, platform)  # raises off its platform
        candidates = [fwht_backend(implementation)]
    for backend in candidates:
        if backend.chain_takes(p, dtype):
            return backend
    return None


hd_chain_p = Primitive("rfjax_hd_chain")


@functools.cache
def _effects(implementation: str, x_shape, signs_shape, dtype, simplex: bool):
    """The ordered callbacks of a simulator (Pallas' TPU interpret mode): its fused kernel's, or
    its ``fwht`` kernel's where the composition runs (else none)."""
    backend = None if implementation == "auto" else fwht_backend(implementation)
    if backend is None or not backend.simulated:
        return frozenset()
    if not backend.chain_takes(x_shape[-1], dtype):
        return kernel_effects(implementation, (*x_shape[:-1], 1, x_shape[-1]), dtype, True)
    x, signs = jax.ShapeDtypeStruct(x_shape, dtype), jax.ShapeDtypeStruct(signs_shape, dtype)
    norms = jax.ShapeDtypeStruct((signs_shape[0], x_shape[-1]), dtype)
    kernel = functools.partial(backend.chain_kernel(), simplex=simplex)
    return frozenset(jax.make_jaxpr(kernel)(x, signs, norms).effects)


def _abstract_eval(x, signs, norms, *, simplex, implementation):
    del norms
    spec = tuple(x.sharding.spec)
    out = x.update(  # keeps the mesh and shard_map's varying axes of x
        shape=(*x.shape[:-1], signs.shape[0], x.shape[-1]),
        weak_type=False,
        sharding=x.sharding.update(spec=PartitionSpec(*spec[:-1], None, spec[-1])),
    )
    return out, _effects(implementation, tuple(x.shape), tuple(signs.shape), x.dtype, simplex)


@functools.cache
def _compiled(simplex: bool, implementation: str):
    def apply(x, signs, norms):
        return hd_chain_p.bind(x, signs, norms, simplex=simplex, implementation=implementation)

    return jax.jit(apply)


hd_chain_p.def_effectful_abstract_eval(_abstract_eval)
hd_chain_p.def_impl(
    lambda x, signs, norms, *, simplex, implementation: _compiled(simplex, implementation)(
        x, signs, norms
    )
)
requires_devices(hd_chain_p)  # its lowering partitions kernels under automatic axes


def _jvp(primals, tangents, *, simplex, implementation):
    x, signs, norms = primals
    dx, dsigns, dnorms = tangents
    y = hd_chain_p.bind(x, signs, norms, simplex=simplex, implementation=implementation)
    if type(dsigns) is ad.Zero and type(dnorms) is ad.Zero:  # linear in x
        if type(dx) is ad.Zero:
            return y, ad.Zero.from_primal_value(y)
        dy = hd_chain_p.bind(dx, signs, norms, simplex=simplex, implementation=implementation)
        return y, dy
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    reference = functools.partial(chain_reference, simplex=simplex, implementation=implementation)
    return y, jax.jvp(reference, primals, tangents)[1]


def _transpose(cotangent, x, signs, norms, *, simplex, implementation):
    if ad.is_undefined_primal(signs) or ad.is_undefined_primal(norms):
        raise NotImplementedError(
            "hd_chain is transposed in x only (its JVP in the factors is not)"
        )
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval), None, None]

    del implementation
    linear = jax.linear_transpose(
        lambda v: chain_reference(v, signs, norms, simplex=simplex),
        jax.ShapeDtypeStruct(x.aval.shape, x.aval.dtype),
    )
    return [linear(cotangent)[0], None, None]


ad.primitive_jvps[hd_chain_p] = _jvp
ad.primitive_transposes[hd_chain_p] = _transpose


def _batch(args, dims, *, simplex, implementation):
    x, signs, norms = args
    x_dim, signs_dim, norms_dim = dims
    if signs_dim is None and norms_dim is None:
        # The leading axes of x are free batch axes: put the mapped one in front.
        x = jnp.moveaxis(x, x_dim, 0)
        out = hd_chain_p.bind(x, signs, norms, simplex=simplex, implementation=implementation)
        return out, 0
    reference = functools.partial(chain_reference, simplex=simplex, implementation=implementation)
    out = jax.vmap(reference, in_axes=dims)(x, signs, norms)
    return out, 0


batching.primitive_batchers[hd_chain_p] = _batch


def _fused_per_shard(kernel, x_aval, simplex: bool, effects):
    """The fused ``kernel`` per shard of the leading axes of x: a ``shard_map`` under explicit
    axes, ``custom_partitioning`` under automatic ones (but for a simulator's ordered callbacks,
    which it cannot carry: XLA gathers those)."""
    fn = functools.partial(kernel, simplex=simplex)
    spec = explicit_spec(x_aval)
    if spec is None:
        return fn if effects else auto_rows(fn, "... p, b k p, b p -> ... b p")
    out_spec = PartitionSpec(*spec[:-1], None, None)
    return jax.shard_map(
        fn,
        mesh=x_aval.sharding.mesh,
        in_specs=(PartitionSpec(*spec), PartitionSpec(), PartitionSpec()),
        out_specs=out_spec,
        check_vma=False,  # per shard by construction; a Pallas output records no mesh axes
    )


def _lowering(platform: str):
    def rule(ctx, x, signs, norms, *, simplex, implementation):
        x_aval = ctx.avals_in[0]
        backend = _fused_backend(implementation, platform, x_aval)
        spec = explicit_spec(x_aval)
        if spec is not None and spec[-1] is not None:
            backend = None  # a sharded transformed axis: fwht's distributed transform
        if backend is None:
            fn = functools.partial(chain_reference, simplex=simplex, implementation=implementation)
        else:
            signs_aval = ctx.avals_in[1]
            effects = _effects(
                implementation, tuple(x_aval.shape), tuple(signs_aval.shape), x_aval.dtype, simplex
            )
            fn = _fused_per_shard(backend.chain_kernel(), x_aval, simplex, effects)
        return mlir.lower_fun(fn, multiple_results=False)(ctx, x, signs, norms)

    return rule


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    mlir.register_lowering(hd_chain_p, _lowering(_platform), platform=_platform)
mlir.register_lowering(hd_chain_p, _lowering("other"))
