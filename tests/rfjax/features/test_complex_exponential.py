"""Tests of ``rfjax.features._complex_exponential``: special cases, the real-valued implementation
of the complex estimator and rejected matrices."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections, theory
from tests.support.hybrid_points import COMPLEX_A, DIM, NUM_FEATURES, f32, pair


def test_ce_special_cases_reproduce_trigonometric_and_positive():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x, y = f32(pair(0.7, 0.9, 1.1)[0]), f32(pair(0.7, 0.9, 1.1)[1])

    def ce(matrix):
        return features.estimate(
            features.complex_exponential_features(x, w, matrix, side="query"),
            features.complex_exponential_features(y, w, matrix, side="key"),
        )

    trig = features.estimate(
        features.trigonometric_features(x, w), features.trigonometric_features(y, w)
    )
    positive = features.estimate(features.positive_features(x, w), features.positive_features(y, w))
    np.testing.assert_allclose(ce(1j * jnp.eye(DIM)), trig, rtol=1e-5)
    np.testing.assert_allclose(ce(jnp.eye(DIM)), positive, rtol=1e-5)
    # Widths: 2m for complex A, m for real A; a diagonal (d,) equals the dense diag(alpha).
    assert features.complex_exponential_features(x, w, 1j * jnp.eye(DIM), side="query").shape == (
        2 * NUM_FEATURES,
    )
    assert features.complex_exponential_features(x, w, jnp.eye(DIM), side="key").shape == (
        NUM_FEATURES,
    )
    alpha = jnp.asarray([0.5 + 0.2j, -1.0j, 1.3, 0.7 - 0.7j], jnp.complex64)
    for side, u in (("query", x), ("key", y)):
        np.testing.assert_allclose(
            features.complex_exponential_features(u, w, alpha, side=side),
            features.complex_exponential_features(u, w, jnp.diag(alpha), side=side),
            rtol=1e-5,
            atol=1e-6,
        )


def test_ce_real_features_are_the_real_part_of_the_complex_estimator():
    w = projections.gaussian(jax.random.key(1), DIM, NUM_FEATURES)
    x, y = pair(0.6, 0.8, 2.0)
    a = COMPLEX_A.astype(np.complex128)
    omega = np.asarray(w.matrix(), np.float64)
    ax, by = a @ x, np.linalg.inv(a.T) @ y
    psi_x = np.exp(omega @ ax - np.sum(ax * ax) / 2) / math.sqrt(NUM_FEATURES)
    psi_y = np.exp(omega @ by - np.sum(by * by) / 2) / math.sqrt(NUM_FEATURES)
    bilinear = np.sum(psi_x * psi_y)  # Eq. 16: no conjugation
    got = features.estimate(
        features.complex_exponential_features(f32(x), w, COMPLEX_A, side="query"),
        features.complex_exponential_features(f32(y), w, COMPLEX_A, side="key"),
    )
    np.testing.assert_allclose(got, bilinear.real, rtol=1e-5)


def test_singular_matrix_is_rejected():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = jnp.ones(DIM)
    singular = jnp.eye(DIM).at[2, 2].set(0.0)
    for matrix in (singular, jnp.diagonal(singular), jnp.ones((DIM, DIM), jnp.complex64)):
        with pytest.raises(ValueError, match="invertible"):
            features.complex_exponential_features(x, w, matrix, side="key")
        with pytest.raises(ValueError, match="invertible"):
            theory.complex_exponential_mse(np.ones(DIM), np.ones(DIM), np.asarray(matrix), 4)
    with pytest.raises(ValueError, match="shape"):
        features.complex_exponential_features(x, w, jnp.eye(DIM + 1), side="query")
    with pytest.raises(TypeError, match="matrix"):
        features.complex_exponential_features(x, w, jnp.eye(DIM, dtype=jnp.int32), side="query")
    with pytest.raises(ValueError, match="side"):
        features.complex_exponential_features(x, w, jnp.eye(DIM), side="value")
