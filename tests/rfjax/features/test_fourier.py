"""Tests of ``rfjax.features._fourier``: Fourier and trigonometric estimates are exact at x == y
(and positive ones at y == -x), for every coupling."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels
from tests.support.feature_points import COUPLINGS, DEFAULT_COUPLINGS, X, draw
from tests.support.representatives import representatives


@pytest.mark.parametrize("coupling", representatives(COUPLINGS, DEFAULT_COUPLINGS))
def test_exact_cases(coupling):
    w = draw(coupling)
    x = jnp.asarray(X * 2.0, jnp.float32)
    # sin^2 + cos^2 = 1: Fourier and trigonometric estimates are exact at x == y.
    np.testing.assert_allclose(
        features.estimate(*[features.fourier_features(x, w)] * 2), 1.0, rtol=1e-6
    )
    np.testing.assert_allclose(
        features.estimate(*[features.trigonometric_features(x, w)] * 2),
        kernels.softmax(x, x),
        rtol=1e-6,
    )
    # exp(w.x) exp(-w.x) = 1: positive softmax estimates are exact at y == -x.
    for antithetic in (False, True):
        phi = functools.partial(features.positive_features, projection=w, antithetic=antithetic)
        np.testing.assert_allclose(
            features.estimate(phi(x), phi(-x)), kernels.softmax(x, -x), rtol=1e-6
        )
