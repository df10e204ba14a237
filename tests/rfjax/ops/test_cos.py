"""``rfjax.ops._cos``: ``shifted_cos`` is cos(t - s pi/2) and ``sin_cos`` is scale [sin, cos],
against NumPy in float64, at small and large arguments and through ``grad``."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.ops import shifted_cos, sin_cos

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
