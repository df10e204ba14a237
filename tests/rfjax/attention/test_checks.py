"""Tests of ``rfjax.attention._checks``: FAVOR attention's argument checks name the argument."""

import jax
import jax.numpy as jnp
import pytest

from rfjax import attention, projections
from tests.support.favor_inputs import (
    BATCH,
    LENGTH,
    make_inputs,
    per_head_projection,
    shared_projection,
)


def test_argument_errors():
    query, key, value = make_inputs(25)
    projection = shared_projection()
    run = attention.favor_attention
    with pytest.raises(ValueError, match="key"):
        run(query, key[..., :4], value, projection)
    with pytest.raises(ValueError, match="causal"):
        run(query, key[:, :5], value[:, :5], projection, causal=True)
    # Keys and values of another batch, or values of other heads, are named.
    with pytest.raises(ValueError, match=r"key must have shape \(B, S, N, H\) = \(2, S"):
        run(query, key[:1], value[:1], projection)
    with pytest.raises(ValueError, match=r"value must have shape \(B, S, N, H_v\)"):
        run(query, key, value[:, :, :1], projection)
    with pytest.raises(TypeError, match="stabilize must be None or a bool"):
        run(query, key, value, projection, stabilize=1)
    with pytest.raises(TypeError, match="mask"):
        run(query, key, value, projection, mask=jnp.ones((BATCH, LENGTH)))
    with pytest.raises(ValueError, match="mask"):
        run(query, key, value, projection, mask=jnp.ones((BATCH, 3), bool))
    with pytest.raises(ValueError, match="stabilize"):
        run(query, key, value, projection, feature_map="relu", stabilize=True)
    with pytest.raises(ValueError, match="feature_map"):
        run(query, key, value, projection, feature_map="cosine")
    with pytest.raises(ValueError, match="chunk_size"):
        run(query, key, value, projection, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="dim"):
        run(query, key, value, projections.gaussian(jax.random.key(0), 4, 8))
    with pytest.raises(TypeError, match="floating"):
        run(query.astype(jnp.int32), key, value, projection)
    with pytest.raises(TypeError, match="projection"):
        run(query, key, value, "gaussian")
    # N stacked draws must be marked PerHead, with one entry per head.
    stacked = per_head_projection().stacked
    with pytest.raises(ValueError, match="PerHead"):
        run(query, key, value, stacked)
    with pytest.raises(ValueError, match="leading axis N = 3"):
        run(query, key, value, attention.PerHead(jax.tree.map(lambda w: w[:2], stacked)))
    with pytest.raises(TypeError, match="FeatureMap"):
        run(query, key, value, projection, feature_map=lambda x, p: x)
