"""Tests of ``rfjax.features._fourier``: Fourier and trigonometric estimates are exact at x == y
(and positive ones at y == -x), for every coupling; cosine features are their formula."""

import functools

import jax
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


def test_cosine_features_are_the_documented_formula():
    """psi(x) = sqrt(2/m) cos(W x / l + b) entrywise, against float64 NumPy, for offsets the
    caller gives (any b, not only draws of ``random_offsets``, under which cos(W x / l - b)
    has the same law and every statistical test passed); and ``random_offsets`` spans
    [0, 2 pi)."""
    w = draw("gaussian")
    m = w.num_features
    offsets = jnp.linspace(0.1, 6.0, m, dtype=jnp.float32)
    x = jnp.asarray(X, jnp.float32)
    got = features.cosine_features(x, w, offsets, lengthscale=1.5)
    matrix = np.asarray(w.matrix(), np.float64)
    want = np.sqrt(2 / m) * np.cos(np.asarray(x, np.float64) @ matrix.T / 1.5 + np.asarray(offsets))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    drawn = np.asarray(features.random_offsets(jax.random.key(0), 4096))
    assert drawn.min() >= 0 and drawn.max() < 2 * np.pi
    assert drawn.min() < 0.01 and drawn.max() > 2 * np.pi - 0.01
