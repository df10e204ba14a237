"""Tests of ``rfjax.features._positive``: the row stabiliser of positive features."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features
from tests.support.feature_points import DIM, draw


@pytest.mark.parametrize("kernel", ["softmax", "gaussian"])
@pytest.mark.parametrize("antithetic", [False, True])
def test_row_stabiliser_rescales_each_input_by_its_largest_feature(kernel, antithetic):
    w = draw("simplex_plus", 8)
    xs = jax.random.normal(jax.random.key(4), (5, DIM))
    ys = jax.random.normal(jax.random.key(5), (6, DIM))
    phi = functools.partial(
        features.positive_features, projection=w, kernel=kernel, antithetic=antithetic
    )
    plain_x, plain_y = phi(xs), phi(ys)
    stable_x, stable_y = phi(xs, stabilizer="row"), phi(ys, stabilizer="row")
    np.testing.assert_allclose(stable_x.max(axis=-1), 1.0, rtol=1e-6)
    # phi_stab(x).phi_stab(y) exp(s(x) + s(y)) = phi(x).phi(y), with exp(s(x)) = max_j phi_j(x).
    scale = plain_x.max(axis=-1)[:, None] * plain_y.max(axis=-1)[None, :]
    np.testing.assert_allclose((stable_x @ stable_y.T) * scale, plain_x @ plain_y.T, rtol=1e-5)

    # Row-normalised attention weights are unchanged by stabilising the queries (xs).
    def attention(queries, keys):
        scores = queries @ keys.T
        return scores / scores.sum(-1, keepdims=True)

    np.testing.assert_allclose(attention(stable_x, plain_y), attention(plain_x, plain_y), rtol=1e-5)


def test_row_stabiliser_prevents_underflow():
    w = draw("gaussian", 8)
    x = jnp.full((DIM,), 8.0)  # |x|^2 / 2 = 128: exp(w.x - 128) underflows in float32
    assert float(features.positive_features(x, w).max()) < 1e-30
    stable = features.positive_features(x, w, stabilizer="row")
    assert float(stable.max()) == 1.0
