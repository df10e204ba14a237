"""The symmetric rank-k update c + a^T a in one triangle: the Gram matrix of streamed rows.

On CPU, BLAS ``syrk`` (SciPy's BLAS, called from the C++ library through ``jax.ffi``,
``rfjax.ops._fwht_cpu``) computes only the lower triangle: half the multiply-adds of the general
product ``a.T @ a`` that XLA would compute. Elsewhere, and without the compiled library, XLA
computes the full product and keeps its lower triangle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.typing import ArrayLike

from rfjax._validation import as_array
from rfjax.ops import _fwht_cpu


def _lower(c: jax.Array) -> jax.Array:
    """The mask of the lower triangle (with the diagonal) of the last two axes of ``c``."""
    return jnp.arange(c.shape[-2])[:, None] >= jnp.arange(c.shape[-1])[None, :]


def _xla_update(c: jax.Array, a: jax.Array) -> jax.Array:
    product = jnp.matmul(jnp.swapaxes(a, -1, -2), a, precision=lax.Precision.HIGHEST)
    return jnp.where(_lower(c), c + product, c)


# A primitive (not a platform_dependent of an ffi_call), so that its result has c's type,
# including the mesh axes it varies over inside shard_map.
symmetric_rank_update_p = Primitive("rfjax_symmetric_rank_update")
symmetric_rank_update_p.def_abstract_eval(lambda c, a: c.update(weak_type=False))
_compiled = jax.jit(lambda c, a: symmetric_rank_update_p.bind(c, a))
symmetric_rank_update_p.def_impl(lambda c, a: _compiled(c, a))  # eager: one compiled program


def _batch(args, dims):
    """``vmap``: XLA's batched product (the BLAS kernel takes one matrix)."""
    c, a = (x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims, strict=True))
    size = next(x.shape[0] for x, d in zip((c, a), dims, strict=True) if d is not None)
    c = jnp.broadcast_to(c, (size, *c.shape[-2:]))
    return _xla_update(c, a), 0


def _jvp(primals, tangents):
    """d(c + a^T a) = dc + da^T a + a^T da in the lower triangle, dc above it."""
    c, a = primals
    dc, da = (ad.instantiate_zeros(t) for t in tangents)
    cross = jnp.matmul(da.T, a, precision=lax.Precision.HIGHEST)
    tangent = dc + jnp.where(_lower(c), cross + cross.T, jnp.zeros_like(c))
    return symmetric_rank_update_p.bind(c, a), tangent


batching.primitive_batchers[symmetric_rank_update_p] = _batch
ad.primitive_jvps[symmetric_rank_update_p] = _jvp


def _lowering(platform: str):
    def rule(ctx, c, a):
        kernel = platform == "cpu" and _fwht_cpu.is_available("gram_update")
        fn = _fwht_cpu.gram_update if kernel else _xla_update
        return mlir.lower_fun(fn, multiple_results=False)(ctx, c, a)

    return rule


mlir.register_lowering(symmetric_rank_update_p, _lowering("cpu"), platform="cpu")
mlir.register_lowering(symmetric_rank_update_p, _lowering("other"))


def symmetric_rank_update(c: ArrayLike, a: ArrayLike) -> jax.Array:
    """c + a^T a in the lower triangle, c elsewhere: a Gram matrix summed over blocks of rows.

    Entries (i, j) with j <= i are c_ij + sum_r a_ri a_rj; the entries above the diagonal are
    those of c, unchanged. Summing the updates of a stream of row blocks into zeros gives the
    lower triangle of A^T A for all rows; ``jnp.tril(g) + jnp.tril(g, -1).T`` is the whole
    matrix. On CPU with rfjax's compiled kernels, BLAS ``syrk`` (SciPy's), which computes only
    that triangle (b m (m + 1) / 2 multiply-adds instead of the general product's b m^2);
    otherwise XLA's ``a.T @ a`` at ``Precision.HIGHEST``. The two sum in different orders, so
    they agree to rounding. It works under ``jit``, ``vmap`` (XLA's batched product) and
    ``grad``/``jvp``.

    Args:
      c: ``(m, m)``, float32 or float64.
      a: ``(b, m)``, the dtype of ``c``.

    Returns:
      ``(m, m)`` in the dtype of ``c``.

    Raises:
      TypeError: if ``c`` or ``a`` is not float32/float64 or their dtypes differ.
      ValueError: if the shapes are not ``(m, m)`` and ``(b, m)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> symmetric_rank_update(jnp.zeros((2, 2)), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
      Array([[10.,  0.],
             [14., 20.]], dtype=float32)
    """
    c, a = as_array("c", c), as_array("a", a)
    if c.dtype not in (jnp.float32, jnp.float64) or a.dtype != c.dtype:
        raise TypeError(
            f"c and a must both be float32 or both float64, got {c.dtype} and {a.dtype}"
        )
    if c.ndim != 2 or a.ndim != 2 or c.shape != (a.shape[1], a.shape[1]):
        raise ValueError(f"c must be (m, m) and a (b, m), got {c.shape} and {a.shape}")
    return symmetric_rank_update_p.bind(c, a)
