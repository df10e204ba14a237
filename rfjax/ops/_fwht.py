"""The fast Walsh-Hadamard transform as a JAX primitive with several lowerings.

``fwht_p`` transforms the last axis of its operand. It is linear and symmetric (H^T = H), so its
JVP applies it to the tangent and its transpose applies it to the cotangent; its batching rule
keeps the batch axis in front of the transformed axis, so ``vmap`` calls the kernel once on the
batched array. Lowerings, chosen per platform when ``implementation="auto"``:

* ``"cpu"``: a C++ kernel registered with XLA through ``jax.ffi`` (built by the package's build;
  see ``rfjax.ops._fwht_cpu``), used on CPU when it was built;
* ``"pallas"``: a Pallas kernel for GPUs (``"pallas_interpret"`` runs it in interpret mode on
  any backend, for tests);
* ``"xla"``: a pure-XLA radix-2 butterfly, the fallback on every platform.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

IMPLEMENTATIONS = ("auto", "cpu", "pallas", "pallas_interpret", "xla")
HALF_TYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def accumulation_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """The dtype the transform accumulates in: float32 for half types, else ``dtype``."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) in HALF_TYPES else jnp.dtype(dtype)


def xla_butterfly(x: jax.Array, normalize: bool) -> jax.Array:
    """Pure-XLA radix-2 transform of the last axis: log2(n) stages of (a + b, a - b).

    Half-precision inputs are accumulated in float32 and rounded once at the end.
    """
    n = x.shape[-1]
    out_dtype = x.dtype
    y = x.astype(accumulation_dtype(x.dtype))
    lead = y.shape[:-1]
    half = 1
    while half < n:
        pairs = y.reshape(*lead, n // (2 * half), 2, half)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        half *= 2
    if normalize:
        y = y * (1.0 / np.sqrt(n))
    return y.astype(out_dtype)


fwht_p = Primitive("rfjax_fwht")


def _abstract_eval(x, *, normalize, implementation):
    del normalize, implementation
    return x.update(weak_type=False)  # keeps the sharding and shard_map's varying axes


fwht_p.def_abstract_eval(_abstract_eval)
fwht_p.def_impl(functools.partial(jax._src.dispatch.apply_primitive, fwht_p))


def _batch(args, dims, *, normalize, implementation):
    (x,), (dim,) = args, dims
    if dim == x.ndim - 1:  # the batch axis must not be the transformed one
        x, dim = jnp.moveaxis(x, dim, 0), 0
    return fwht_p.bind(x, normalize=normalize, implementation=implementation), dim


batching.primitive_batchers[fwht_p] = _batch


def _transpose(cotangent, x, *, normalize, implementation):
    del x
    if type(cotangent) is ad.Zero:
        return [cotangent]
    return [fwht_p.bind(cotangent, normalize=normalize, implementation=implementation)]


ad.deflinear2(fwht_p, _transpose)


def _register_lowerings() -> None:
    """Default (every platform): the XLA butterfly, unless a kernel is asked for or chosen."""
    from rfjax.ops import _fwht_cpu, _fwht_pallas

    def select(platform):
        def lower(x, *, normalize, implementation):
            chosen = implementation
            if chosen == "auto":
                if platform == "cpu" and _fwht_cpu.is_available():
                    chosen = "cpu"
                elif platform in ("cuda", "rocm") and _fwht_pallas.supports(x.shape, x.dtype):
                    chosen = "pallas"
                else:
                    chosen = "xla"
            if chosen == "cpu":
                if platform != "cpu":
                    raise ValueError(f"implementation='cpu' cannot run on platform {platform!r}")
                return _fwht_cpu.fwht_rows(x, normalize)
            if chosen == "pallas":
                return _fwht_pallas.fwht_rows(x, normalize, interpret=False)
            if chosen == "pallas_interpret":
                return _fwht_pallas.fwht_rows(x, normalize, interpret=True)
            return xla_butterfly(x, normalize)

        return mlir.lower_fun(lower, multiple_results=False)

    mlir.register_lowering(fwht_p, select("cpu"), platform="cpu")
    for platform in ("cuda", "rocm"):
        mlir.register_lowering(fwht_p, select(platform), platform=platform)
    mlir.register_lowering(fwht_p, select("other"))


_register_lowerings()
