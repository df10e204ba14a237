"""Tests of ``rfjax.features._polynomial``: the layout of the product features and the rows they
reject."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features
from tests.support.feature_points import COEFFICIENTS, POLY_ROWS, POLY_WIDTH, X, draw


def test_polynomial_layout():
    # Factor t of output feature k is row t * M + k.
    w = draw("gaussian", POLY_ROWS)
    x = jnp.asarray(X, jnp.float32)
    z = np.asarray(w(x), np.float64).reshape(-1, POLY_WIDTH)  # (T, M)
    c = COEFFICIENTS
    expected = (
        math.sqrt(c[0]) * z[0]
        + math.sqrt(c[1]) * z[1] * z[2]
        + math.sqrt(c[2]) * z[3] * z[4] * z[5]
    ) / math.sqrt(POLY_WIDTH)
    np.testing.assert_allclose(
        features.polynomial_features(x, w, coefficients=c), expected, rtol=1e-5
    )


def test_polynomial_rejects_coupled_rows():
    with pytest.raises(ValueError, match="block_size"):
        features.polynomial_features(
            X.astype(np.float32), draw("halton", POLY_ROWS), coefficients=COEFFICIENTS
        )
    with pytest.raises(ValueError, match="block_size"):
        features.polynomial_features(
            X.astype(np.float32), draw("orthogonal", 6 * 2), coefficients=COEFFICIENTS
        )
    # Degree 1 has no products, so any coupling works.
    out = features.polynomial_features(X.astype(np.float32), draw("halton", 5), coefficients=[2.0])
    np.testing.assert_allclose(
        out,
        math.sqrt(2.0) * features.linear_features(X.astype(np.float32), draw("halton", 5)),
        rtol=1e-6,
    )
