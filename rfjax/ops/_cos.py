"""cos(t - s pi/2) in vectorisable arithmetic: one kernel for the sin and cos of random features.

XLA:CPU evaluates ``jnp.sin``/``jnp.cos`` element by element (about 8 ns per float32 value on the
build machines, against 0.4 ns for ``jnp.exp``), which made sin/cos random Fourier features several
times slower than NumPy's. ``shifted_cos`` reduces t = k (pi/2) + r, |r| <= pi/4 (Cody-Waite:
pi/2 split into three constants so that k * C1 is exact), evaluates the fdlibm (float64) or
Cephes (float32) minimax polynomials for sin r and cos r, and picks/negates one by the quadrant
(k - s) mod 4: only multiplies, adds, a round and selects, which XLA fuses and vectorises on every
backend. sin t is ``shifted_cos(t, 1)``. ``sin_cos(t)`` is the pair [sin t, cos t] of random
Fourier features from one reduction of each element: a primitive whose CPU lowering is a C++
kernel (``csrc/sincos_kernel.h``: the same arithmetic, vectorised for the CPU's instruction set,
one read of t and one write of each half; XLA:CPU's code for the two halves took 3-10x NumPy's
time per element, and a [t, t] or per-element shift array cost a pass and a buffer), and XLA
elsewhere.

The reduction is exact while k * C1 is: for |t| <= ``FAST_RANGE`` (2^14 in float32, 2^20 in
float64). Beyond it the error of r grows like |t| times the unit roundoff (at |t| = 10^6 in
float32 the polynomial returns values near 10^3, and NaN from about 10^20), so elements beyond
the range are computed by ``jnp.cos``/``jnp.sin`` instead, whose argument reduction is exact over
the whole float range. That slow path is behind a ``lax.cond`` on max |t|, so arrays inside the
range (random-feature arguments almost always are) pay one max-reduction and never evaluate it.

Accuracy (tested against NumPy, every finite t): float64 within 2.3e-16 absolute; float32 within
2.7e-7 absolute (2.66e-7 at t = 15644.088, the worst of every float32 in [2^13, 2^14], where
k * C2 rounds most). Half-precision inputs are computed in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.typing import ArrayLike

from rfjax._validation import check_real
from rfjax.ops import _fwht_cpu
from rfjax.ops._partition import explicit_spec

# |t| up to which the three-part Cody-Waite reduction is exact (k * C1 has no rounding error).
FAST_RANGE = {np.dtype(np.float64): 2.0**20, np.dtype(np.float32): 2.0**14}

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


def _reduce(t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(k, cos r, sin r) with t = r + k pi/2, |r| <= pi/4: Cody-Waite reduction and minimax
    polynomials (exact for |t| <= FAST_RANGE); k as int32."""
    dtype = np.dtype(t.dtype)
    c1, c2, c3 = _PIO2_SPLIT[dtype]
    k = jnp.round(t * (2.0 / np.pi))
    r = ((t - k * c1) - k * c2) - k * c3
    z = r * r
    sin_r = r + r * z * _horner(z, _SIN_COEFFS[dtype])
    cos_r = 1.0 - 0.5 * z + z * z * _horner(z, _COS_COEFFS[dtype])
    return k.astype(jnp.int32), cos_r, sin_r


def _reduced_cos(t: jax.Array, quarter_turns: jax.Array) -> jax.Array:
    """The fast path of ``shifted_cos`` (exact reduction for |t| <= FAST_RANGE)."""
    k, cos_r, sin_r = _reduce(t)
    # t - s pi/2 = r + (k - s) pi/2: quadrants 0..3 give cos r, -sin r, -cos r, sin r.
    return _select_quadrant((k - quarter_turns) & 3, cos_r, sin_r)


def _select_quadrant(quadrant: jax.Array, cos_value: jax.Array, sin_value: jax.Array) -> jax.Array:
    """cos(r + q pi/2) from cos r and sin r: q = 0..3 give cos r, -sin r, -cos r, sin r."""
    value = jnp.where((quadrant & 1) == 1, sin_value, cos_value)
    return jnp.where((quadrant == 1) | (quadrant == 2), -value, value)


def _library_cos(t: jax.Array, quarter_turns: jax.Array) -> jax.Array:
    """cos(t - s pi/2) from ``jnp.cos``/``jnp.sin`` of t itself (exact reduction, slow on CPU)."""
    return _select_quadrant((-quarter_turns) & 3, jnp.cos(t), jnp.sin(t))


def _check_floating(t: ArrayLike) -> jax.Array:
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError(f"t must be a floating array, got dtype {t.dtype}")
    return t


def _xla_sin_cos(t: jax.Array, scale: float) -> jax.Array:
    """``sin_cos`` of a float32/float64 t in XLA: the halves as two selects of one reduction,
    the slow path behind a ``lax.cond`` whose only operand is t."""
    limit = FAST_RANGE[np.dtype(t.dtype)]

    def scaled(values: jax.Array) -> jax.Array:
        return values if scale == 1.0 else jnp.asarray(scale, values.dtype) * values

    def fast(t: jax.Array) -> jax.Array:
        k, cos_r, sin_r = _reduce(t)
        sin_t = _select_quadrant((k - 1) & 3, cos_r, sin_r)  # sin t = cos(t - pi/2)
        return scaled(jnp.concatenate([sin_t, _select_quadrant(k & 3, cos_r, sin_r)], axis=-1))

    def with_library(t: jax.Array) -> jax.Array:
        outside = jnp.abs(t) > limit
        values = fast(jnp.where(outside, jnp.zeros_like(t), t))
        library = scaled(jnp.concatenate([jnp.sin(t), jnp.cos(t)], axis=-1))
        return jnp.where(jnp.concatenate([outside, outside], axis=-1), library, values)

    # whether any |t| > limit, as a float max (XLA:CPU materialises a boolean reduction's
    # operand); NaN counts as inside: the fast path gives NaN for it, as the library does
    beyond = jnp.max(jnp.where(jnp.abs(t) > limit, 1.0, 0.0).astype(t.dtype), initial=0.0) > 0
    return lax.cond(beyond, with_library, fast, t)


def _kernel_constants(dtype: np.dtype) -> dict[str, np.ndarray | np.floating]:
    """The reduction's and polynomials' constants for the C++ kernel, in ``dtype``."""
    return {
        "split": np.asarray(_PIO2_SPLIT[dtype], dtype),
        "sine": np.asarray(_SIN_COEFFS[dtype], dtype),
        "cosine": np.asarray(_COS_COEFFS[dtype], dtype),
        "limit": dtype.type(FAST_RANGE[dtype]),
    }


sin_cos_p = Primitive("rfjax_sin_cos")


def _abstract_eval(t, *, scale):
    del scale
    return t.update(shape=(*t.shape[:-1], 2 * t.shape[-1]), weak_type=False)


@functools.cache
def _compiled(scale: float):
    return jax.jit(lambda t: sin_cos_p.bind(t, scale=scale))


sin_cos_p.def_abstract_eval(_abstract_eval)
sin_cos_p.def_impl(lambda t, *, scale: _compiled(scale)(t))  # eager: compiled once per scale


def _jvp(primals, tangents, *, scale):
    (t,), (dt,) = primals, tangents
    y = sin_cos_p.bind(t, scale=scale)
    if type(dt) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    m = t.shape[-1]
    # d(scale sin t) = scale cos t dt, d(scale cos t) = -scale sin t dt
    return y, jnp.concatenate([y[..., m:] * dt, -y[..., :m] * dt], axis=-1)


def _batch(args, dims, *, scale):
    (t,), (dim,) = args, dims
    if dim == t.ndim - 1:  # the pairs lie along the last axis: keep the batch axis off it
        t, dim = jnp.moveaxis(t, dim, 0), 0
    return sin_cos_p.bind(t, scale=scale), dim


ad.primitive_jvps[sin_cos_p] = _jvp
batching.primitive_batchers[sin_cos_p] = _batch


def _lowering(platform: str):
    def rule(ctx, t, *, scale):
        aval = ctx.avals_in[0]
        kernel = (
            platform == "cpu"
            and _fwht_cpu.is_available("sin_cos")
            and explicit_spec(aval) is None  # explicitly sharded: XLA's partitioner
        )
        if kernel:
            constants = _kernel_constants(np.dtype(aval.dtype))
            fn = functools.partial(_fwht_cpu.sin_cos_rows, scale=scale, constants=constants)
        else:
            fn = functools.partial(_xla_sin_cos, scale=scale)
        return mlir.lower_fun(fn, multiple_results=False)(ctx, t)

    return rule


mlir.register_lowering(sin_cos_p, _lowering("cpu"), platform="cpu")
mlir.register_lowering(sin_cos_p, _lowering("other"))


def sin_cos(t: ArrayLike, *, scale: float = 1.0) -> jax.Array:
    """scale * [sin t, cos t] along the last axis, in one elementwise pass over t.

    The values of ``shifted_cos`` with shifts 1 and 0 (the same reduction, polynomials and
    accuracy), from one reduction of each element of t written straight into the two halves of
    the result, times ``scale`` (in the result's dtype, as ``scale * sin_cos(t)`` would be): no
    [t, t] or per-element shift array is formed. The random Fourier features' sin/cos pair
    (``rfjax.features.fourier_features``). On CPU a C++ kernel (``csrc/sincos_kernel.h``,
    vectorised for the CPU's instruction set, rows split over XLA's threads) evaluates it
    operation by operation as written here, without fused multiply-adds, and its elements beyond
    ``FAST_RANGE`` by the C library's sin and cos; elsewhere (and on CPU without the kernel, or
    on an explicitly sharded t) XLA does, the slow path behind one ``lax.cond`` on t. The two
    agree to 1 ulp (XLA may fuse a multiply and an add). Its derivative is scale [cos t, -sin t]
    from the result.

    Args:
      t: floating array ``(..., m)`` (float16, bfloat16, float32 or float64), rank >= 1.
      scale: a real factor (static).

    Returns:
      ``(..., 2m)``: scale sin t, then scale cos t, in the dtype of ``t``.

    Raises:
      TypeError: if ``t`` is not floating or ``scale`` is not a real number.
      ValueError: if ``t`` is a scalar or ``scale`` is not finite.

    Examples:
      >>> import jax.numpy as jnp
      >>> t = jnp.array([[0.0, 3.0]])
      >>> sin_cos(t, scale=2.0).shape
      (1, 4)
      >>> bool(jnp.allclose(sin_cos(t), jnp.concatenate([jnp.sin(t), jnp.cos(t)], -1), atol=1e-6))
      True
    """
    t = _check_floating(t)
    if t.ndim < 1:
        raise ValueError(f"t must have rank >= 1 (pairs lie along its last axis), got {t.shape}")
    scale = check_real("scale", scale)
    if t.dtype in (jnp.float32, jnp.float64):
        return sin_cos_p.bind(t, scale=scale)
    values = sin_cos_p.bind(t.astype(jnp.float32), scale=1.0).astype(t.dtype)
    return values if scale == 1.0 else jnp.asarray(scale, t.dtype) * values


def shifted_cos(t: ArrayLike, quarter_turns: ArrayLike = 0) -> jax.Array:
    """cos(t - quarter_turns * pi/2) elementwise (see the module docstring for accuracy).

    ``shifted_cos(t, 0) = cos t``, ``shifted_cos(t, 1) = sin t``, ``shifted_cos(t, 2) = -cos t``.
    Finite inputs give finite results in [-1, 1] over the whole float range (elements with
    |t| > ``FAST_RANGE`` go through ``jnp.cos``/``jnp.sin``); inf and NaN give NaN.

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
    t = _check_floating(t)
    quarter_turns = jnp.asarray(quarter_turns)
    if not jnp.issubdtype(quarter_turns.dtype, jnp.integer):
        raise TypeError(f"quarter_turns must be integers, got dtype {quarter_turns.dtype}")
    out_dtype = t.dtype
    if t.dtype not in (jnp.float32, jnp.float64):
        t = t.astype(jnp.float32)
    shape = jnp.broadcast_shapes(t.shape, quarter_turns.shape)
    t = jnp.broadcast_to(t, shape)
    # + zeros_like(t): quarter_turns varies over the shard_map mesh axes that t varies over, or
    # the cond below, vmapped with a batched predicate, mixes varying and invariant operands.
    quarter_turns = jnp.broadcast_to(quarter_turns.astype(jnp.int32), shape) + jnp.zeros_like(
        t, jnp.int32
    )
    # Elements beyond the fast range (and +-inf) enter the fast path as 0, so that it (and its
    # derivative) stays finite there; NaN goes through it and stays NaN.
    outside = jnp.abs(t) > FAST_RANGE[np.dtype(t.dtype)]
    fast = _reduced_cos(jnp.where(outside, jnp.zeros_like(t), t), quarter_turns)
    value = lax.cond(
        jnp.any(outside),
        lambda: jnp.where(outside, _library_cos(t, quarter_turns), fast),
        lambda: fast,
    )
    return value.astype(out_dtype)
