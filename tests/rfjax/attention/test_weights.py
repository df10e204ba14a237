"""Tests of ``rfjax.attention._weights``: the explicit FAVOR weights reproduce the attention output
(with asymmetric feature maps)."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import attention, features
from rfjax.attention import _weights
from tests.support.favor_inputs import (
    BATCH,
    CHUNK,
    HEADS,
    LENGTH,
    NUM_FEATURES,
    float32_tolerance,
    make_inputs,
    reference_features,
    reference_linear_attention,
    shared_projection,
)


def test_asymmetric_feature_maps_and_weights():
    # A query map and a key map: here positive queries with ReLU keys, to check the roles.
    query, key, value = make_inputs(3, key_length=LENGTH + 5)
    projection = shared_projection()
    maps = features.FeatureMapPair(features.PositiveFeatureMap(), features.ReluFeatureMap())
    out = attention.favor_attention(query, key, value, projection, feature_map=maps)
    w = projection.matrix()
    phi_q = reference_features("positive", query, w)
    phi_k = reference_features("relu", key, w)
    expected = reference_linear_attention(phi_q, phi_k, value, causal=False)
    np.testing.assert_allclose(
        out, expected, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )
    # The explicit weights reproduce the output: A @ V.
    for causal in (False, True):
        q, k, v = make_inputs(4)
        a = attention.favor_attention_weights(q, k, projection, causal=causal)
        assert a.shape == (BATCH, HEADS, LENGTH, LENGTH)
        np.testing.assert_allclose(jnp.sum(a, -1), 1.0, atol=1e-6)
        if causal:
            assert np.all(np.triu(np.asarray(a), 1) == 0)
        out = attention.favor_attention(q, k, v, projection, causal=causal, chunk_size=CHUNK)
        np.testing.assert_allclose(
            out,
            jnp.einsum("bnts,bsnh->btnh", a, v),
            rtol=0,
            atol=float32_tolerance(NUM_FEATURES + LENGTH, v),
        )


def test_causal_log_scores_are_the_same_formed_a_few_rows_at_a_time():
    # The causal weights of exponential maps form (rows, S, m) exponents per step: 3 rows of 8
    # here (the last block partial) give the scores of all 8 at once; with each row's own shift
    # its largest term is 1, so its largest score (a sum of 4 terms) lies in [1, 4].
    keys = jax.random.split(jax.random.key(0), 2)
    log_q = 30.0 * jax.random.normal(keys[0], (8, 4))
    log_k = 30.0 * jax.random.normal(keys[1], (8, 4))
    allowed = jnp.tril(jnp.ones((8, 8), bool)).at[:, 2].set(False)
    width = log_k.size
    parallel = _weights.ROW_BLOCK_ELEMENTS // (3 * width)
    at_once = _weights.causal_log_scores(log_q, log_k, allowed, parallel=1)
    by_three = _weights.causal_log_scores(log_q, log_k, allowed, parallel=parallel)
    np.testing.assert_array_equal(by_three, at_once)
    np.testing.assert_array_equal(jnp.where(allowed, at_once, 0), at_once)
    rows_with_keys = allowed.any(1)
    largest = np.asarray(at_once.max(1))[np.asarray(rows_with_keys)]
    assert np.all((largest >= 1 - 1e-6) & (largest <= 4 + 1e-5)), largest
