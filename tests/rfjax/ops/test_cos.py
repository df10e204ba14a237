"""``rfjax.ops._cos``: ``shifted_cos`` is cos(t - s pi/2) and ``sin_cos`` is scale [sin, cos],
against NumPy in float64, at small and large arguments and through ``grad``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.ops import _cos, shifted_cos, sin_cos

T = np.array([-1e6, -40.0, -3.0, -0.5, 0.0, 1e-8, 0.7, 2.5, 13.0, 1e5, 3e8], np.float32)


def test_shifted_cos_is_the_cosine_shifted_by_quarter_turns():
    t64 = T.astype(np.float64)
    for turns in range(4):
        got = np.asarray(shifted_cos(jnp.asarray(T), turns), np.float64)
        np.testing.assert_allclose(got, np.cos(t64 - turns * np.pi / 2), atol=2e-6)


def test_sin_cos_stacks_scaled_sine_and_cosine_with_their_derivative():
    got = np.asarray(sin_cos(jnp.asarray(T), scale=0.5), np.float64)
    t64 = T.astype(np.float64)
    np.testing.assert_allclose(got, 0.5 * np.concatenate([np.sin(t64), np.cos(t64)]), atol=1e-6)
    grad = jax.grad(lambda t: sin_cos(t, scale=2.0)[0, 0])(jnp.full((1, 1), 0.3))  # d 2 sin t
    grad = grad[0, 0]
    np.testing.assert_allclose(grad, 2 * np.cos(0.3), rtol=1e-6)


def test_sin_cos_is_accurate_just_beyond_the_fast_range():
    """Every |t| in (FAST_RANGE, 2 FAST_RANGE] (float32): no element beyond that to turn the
    slow path on for the others, yet each goes through the exact reduction and stays within
    the stated 2.7e-7 of NumPy's float64 values, on XLA's path (whose slow path is behind a
    ``lax.cond`` on max |t|) and the kernel's. The fast path alone is off by 3.9e-7 there."""
    limit = _cos.FAST_RANGE[np.dtype(np.float32)]
    t = np.linspace(1.01 * limit, 2 * limit, 4001, dtype=np.float32)[None] * np.array([[1], [-1]])
    t = t.astype(np.float32)
    wide = t.astype(np.float64)
    exact = np.concatenate([np.sin(wide), np.cos(wide)], -1)
    for path in (_cos._xla_sin_cos, sin_cos):
        got = np.asarray(jax.jit(functools.partial(path, scale=1.0))(t), np.float64)
        assert np.abs(got - exact).max() <= 2.7e-7, path
