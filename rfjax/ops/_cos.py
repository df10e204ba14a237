"""cos(t - s pi/2) in vectorisable arithmetic: one kernel for the sin and cos of random features.

XLA:CPU evaluates ``jnp.sin``/``jnp.cos`` element by element (about 8 ns per float32 value on the
build machines, against 0.4 ns for ``jnp.exp``), which made sin/cos random Fourier features several
times slower than NumPy's. ``shifted_cos`` reduces t = k (pi/2) + r, |r| <= pi/4 (Cody-Waite:
pi/2 split into three constants so that k * C1 is exact), evaluates the fdlibm (float64) or
Cephes (float32) minimax polynomials for sin r and cos r, and picks/negates one by the quadrant
(k - s) mod 4: only multiplies, adds, a round and selects, which XLA fuses and vectorises on every
backend. sin t is ``shifted_cos(t, 1)``, so [sin t, cos t] is one elementwise pass over [t, t]
with shifts [1, 0] (faster on XLA:CPU than concatenating two results).

Accuracy (tested against NumPy): float64 within 2e-16 absolute for |t| <= 1e5; float32 within
6e-7 absolute for |t| <= 1e4. Beyond |t| ~ 2^16 (float32) or 2^20 (float64) pi/2 the reduction
is no longer exact and the absolute error grows like |t| times the unit roundoff, which is also
the uncertainty of t itself in that precision. Half-precision inputs are computed in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# pi/2 = C1 + C2 + C3; C1 has few significant bits so that k * C1 is exact for moderate k.
_PIO2_SPLIT = {
    np.dtype(np.float64): (
        1.57079632673412561417e00,
        6.07710050630396597660e-11,
        2.02226624879595063154e-21,
    ),
    np.dtype(np.float32): (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8),
}
# sin r = r + r^3 (S1 + r^2 (S2 + ...)); cos r = 1 - r^2/2 + r^4 (C1 + r^2 (C2 + ...)).
_SIN_COEFFS = {
    np.dtype(np.float64): (
        -1.66666666666666324348e-01,
        8.33333333332248946124e-03,
        -1.98412698298579493134e-04,
        2.75573137070700676789e-06,
        -2.50507602534068634195e-08,
        1.58969099521155010221e-10,
    ),
    np.dtype(np.float32): (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4),
}
_COS_COEFFS = {
    np.dtype(np.float64): (
        4.16666666666666019037e-02,
        -1.38888888888741095749e-03,
        2.48015872894767294178e-05,
        -2.75573143513906633035e-07,
        2.08757232129817482790e-09,
        -1.13596475577881948265e-11,
    ),
    np.dtype(np.float32): (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5),
}


def _horner(z: jax.Array, coefficients: tuple[float, ...]) -> jax.Array:
    """c0 + z (c1 + z (c2 + ...))."""
    result = jnp.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        result = c + z * result
    return result


def shifted_cos(t: jax.Array, quarter_turns: jax.Array | int = 0) -> jax.Array:
    """cos(t - quarter_turns * pi/2) elementwise (see the module docstring for accuracy).

    ``shifted_cos(t, 0) = cos t``, ``shifted_cos(t, 1) = sin t``, ``shifted_cos(t, 2) = -cos t``.

    Args:
      t: floating array (float16, bfloat16, float32 or float64).
      quarter_turns: integers (any integer dtype or Python int), broadcastable against ``t``.

    Returns:
      An array of the broadcast shape and the dtype of ``t``.

    Raises:
      TypeError: if ``t`` is not floating or ``quarter_turns`` is not integer.

    Examples:
      >>> import jax.numpy as jnp
      >>> shifted_cos(jnp.array([0.0, 0.0]), jnp.array([0, 1]))
      Array([1., 0.], dtype=float32)
    """
    t = jnp.asarray(t)
    quarter_turns = jnp.asarray(quarter_turns)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError(f"t must be a floating array, got dtype {t.dtype}")
    if not jnp.issubdtype(quarter_turns.dtype, jnp.integer):
        raise TypeError(f"quarter_turns must be integers, got dtype {quarter_turns.dtype}")
    out_dtype = t.dtype
    if t.dtype not in (jnp.float32, jnp.float64):
        t = t.astype(jnp.float32)
    dtype = np.dtype(t.dtype)
    c1, c2, c3 = _PIO2_SPLIT[dtype]
    k = jnp.round(t * (2.0 / np.pi))
    r = ((t - k * c1) - k * c2) - k * c3
    z = r * r
    sin_r = r + r * z * _horner(z, _SIN_COEFFS[dtype])
    cos_r = 1.0 - 0.5 * z + z * z * _horner(z, _COS_COEFFS[dtype])
    # t - s pi/2 = r + (k - s) pi/2: quadrants 0..3 give cos r, -sin r, -cos r, sin r.
    quadrant = (k.astype(jnp.int32) - quarter_turns.astype(jnp.int32)) & 3
    value = jnp.where((quadrant & 1) == 1, sin_r, cos_r)
    value = jnp.where((quadrant == 1) | (quadrant == 2), -value, value)
    return value.astype(out_dtype)
