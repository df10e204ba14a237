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
from jax.interpreters import mlir
from jax.typing import ArrayLike

from rfjax._validation import as_array
from rfjax.ops import _fwht_cpu


def _xla_update(c: jax.Array, a: jax.Array) -> jax.Array:
    product = jnp.matmul(a.T, a, precision=lax.Precision.HIGHEST)
    lower = jnp.arange(c.shape[0])[:, None] >= jnp.arange(c.shape[1])[None, :]
    return jnp.where(lower, c + product, c)


# A primitive (not a platform_dependent of an ffi_call), so that its result has c's type,
# including the mesh axes it varies over inside shard_map.
symmetric_rank_update_p = Primitive("rfjax_symmetric_rank_update")
symmetric_rank_update_p.def_abstract_eval(lambda c, a: c.update(weak_type=False))
_compiled = jax.jit(lambda c, a: symmetric_rank_update_p.bind(c, a))
symmetric_rank_update_p.def_impl(lambda c, a: _compiled(c, a))  # eager: one compiled program


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
    they agree to rounding.

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
