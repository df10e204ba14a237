"""Tests of ``rfjax.features._pointwise``: the angular and arc-cosine features' conventions at x =
0."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features
from tests.support.feature_points import DIM, draw


def test_zero_input_conventions():
    w = draw("gaussian", 16)
    zero = jnp.zeros(DIM)
    np.testing.assert_array_equal(features.angular_features(zero, w), 0.0)
    np.testing.assert_allclose(features.arccos_features(zero, w, order=0), 0.5 * math.sqrt(2 / 16))
    np.testing.assert_array_equal(features.arccos_features(zero, w, order=1), 0.0)


def test_a_nan_input_gives_nan_features_under_jit():
    """Order 0: step(NaN) * NaN**0 was 0 * 1 = 0, hiding the NaN (the exact kernel is NaN)."""
    w = draw("gaussian", 16)
    x = jnp.zeros((2, DIM)).at[0, 0].set(jnp.nan).at[1].set(1.0)
    for order in (0, 1, 2):
        out = jax.jit(lambda a, n=order: features.arccos_features(a, w, order=n))(x)
        assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1])), order
