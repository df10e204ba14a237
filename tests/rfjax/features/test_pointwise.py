"""Tests of ``rfjax.features._pointwise``: the angular and arc-cosine features' conventions at x =
0."""

import math

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
