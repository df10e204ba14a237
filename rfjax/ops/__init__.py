"""Fast operators as XLA ops: the fast Walsh-Hadamard transform, and a vectorised cosine.

``shifted_cos(t, s)`` = cos(t - s pi/2) in fused, vectorisable arithmetic (sin and cos of random
Fourier features in one pass; XLA:CPU's own sin/cos run element by element).

``fwht(x, axis=-1, normalize=False)`` computes H_n x along one axis in O(n log n), where H_n is
the Sylvester-Hadamard matrix (H_1 = 1, H_2n = [[H_n, H_n], [H_n, -H_n]]), unnormalised or scaled
by 1/sqrt(n) (then orthogonal). It works under ``jit``, ``vmap``, ``grad``/``vjp``/``jvp`` and on
sharded arrays; the kernel behind it is chosen per platform (see ``implementation``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax._validation import check_choice
from rfjax.ops._cos import shifted_cos
from rfjax.ops._fwht import IMPLEMENTATIONS, fwht_p, xla_butterfly

SUPPORTED_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def is_power_of_two(n: int) -> bool:
    """Whether the integer ``n`` is 1, 2, 4, 8, ..."""
    return n >= 1 and (n & (n - 1)) == 0


def _normalize_axis(axis: object, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis must be in [{-ndim}, {ndim - 1}] for an input of rank {ndim}, got {axis}"
        )
    return axis % ndim


def _check_operand(x: object) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype not in [jnp.dtype(t) for t in SUPPORTED_DTYPES]:
        raise TypeError(f"x must have dtype float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    return x


def fwht(
    x: jax.Array, *, axis: int = -1, normalize: bool = False, implementation: str = "auto"
) -> jax.Array:
    """Fast Walsh-Hadamard transform of ``x`` along ``axis``.

    y = H_n x along the axis, H_n the n x n Sylvester-Hadamard matrix (entries +-1, natural
    order, equal to ``scipy.linalg.hadamard(n)``), or y = H_n x / sqrt(n) when ``normalize``.
    H_n H_n = n I, so ``fwht(fwht(x)) == n * x`` and the normalised transform is its own inverse.
    Cost O(n log n) per vector.

    Half-precision inputs (float16, bfloat16) are accumulated in float32 and rounded once, so the
    result is the correctly computed transform rounded to the input dtype (relative error about
    one half-precision ulp of the output's largest entries).

    Args:
      x: floating array (float16, bfloat16, float32, float64) of any rank >= 1.
      axis: the axis to transform; its length n must be a power of two (see
        ``pad_to_power_of_two``).
      normalize: scale by 1/sqrt(n).
      implementation: ``"auto"`` (the C++ FFI kernel on CPU when it was built, the Pallas kernel
        on GPU, the pure-XLA butterfly otherwise), or one of ``"cpu"``, ``"pallas"``,
        ``"pallas_interpret"`` (the Pallas kernel in interpret mode, any backend), ``"xla"``.

    Returns:
      An array of the shape and dtype of ``x``.

    Raises:
      TypeError: for a non-floating ``x``, a non-integer ``axis``, a non-bool ``normalize``.
      ValueError: if the axis length is not a power of two, ``axis`` is out of range, or
        ``implementation`` is unknown.

    Examples:
      >>> import jax.numpy as jnp
      >>> fwht(jnp.array([1.0, 0.0, 0.0, 0.0]))
      Array([1., 1., 1., 1.], dtype=float32)

    References:
      Fino & Algazi, "Unified matrix treatment of the fast Walsh-Hadamard transform", 1976.
    """
    x = _check_operand(x)
    axis = _normalize_axis(axis, x.ndim)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r}")
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    n = x.shape[axis]
    if not is_power_of_two(n):
        raise ValueError(
            f"the length of axis {axis} must be a power of two, got {n} (shape "
            f"{x.shape}); pad with rfjax.ops.pad_to_power_of_two"
        )
    moved = jnp.moveaxis(x, axis, -1)
    y = fwht_p.bind(moved, normalize=normalize, implementation=implementation)
    return jnp.moveaxis(y, -1, axis)


def pad_to_power_of_two(x: jax.Array, *, axis: int = -1) -> jax.Array:
    """Appends zeros along ``axis`` up to the next power of two (no copy if already one).

    Args:
      x: array of rank >= 1.
      axis: the axis to pad.

    Returns:
      ``x`` with the axis length rounded up to a power of two, the new entries zero.
    """
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    axis = _normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    target = 1 << max(n - 1, 0).bit_length()
    if target == n:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, target - n)
    return jnp.pad(x, widths)


__all__ = [
    "IMPLEMENTATIONS",
    "fwht",
    "fwht_p",
    "is_power_of_two",
    "pad_to_power_of_two",
    "shifted_cos",
    "xla_butterfly",
]
