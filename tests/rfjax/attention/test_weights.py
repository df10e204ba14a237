"""Tests of ``rfjax.attention._weights``: the explicit FAVOR weights reproduce the attention output
(with asymmetric feature maps)."""

import jax.numpy as jnp
import numpy as np

from rfjax import attention, features
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
