"""Tests of ``rfjax.attention._per_head``: per-head feature maps, redraw keys and projection
draws."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import attention, features
from tests.support.favor_inputs import (
    HEAD_DIM,
    HEADS,
    NUM_FEATURES,
    make_inputs,
    per_head_projection,
)


def test_per_head_feature_map_parameters():
    # A PerHead map (here one sign projection per head) equals each head run on its own.
    query, key, value = make_inputs(27)
    projection = per_head_projection()
    template = features.AngularHybridFeatureMap(num_sign_features=2)
    keys = jax.random.split(jax.random.key(28), HEADS)
    maps = attention.PerHead(jax.vmap(lambda k: template.init(k, HEAD_DIM))(keys))
    run = functools.partial(attention.favor_attention, eps=1e-3)
    out = run(query, key, value, projection, feature_map=maps)
    for n in range(HEADS):
        head = slice(n, n + 1)
        single = run(
            query[:, :, head],
            key[:, :, head],
            value[:, :, head],
            projection.head(n),
            feature_map=maps.head(n),
        )
        np.testing.assert_allclose(out[:, :, head], single, rtol=1e-5, atol=1e-6)
    # Different heads' sign projections give different outputs than one shared map.
    shared = run(query, key, value, projection, feature_map=maps.head(0))
    assert not np.allclose(shared[:, :, 1:], out[:, :, 1:])


def test_redraw_key_and_draw_projection():
    rng = jax.random.key(24)
    keys = [attention.redraw_key(rng, step, redraw_interval=10) for step in (0, 9, 10)]
    data = [jax.random.key_data(k) for k in keys]
    np.testing.assert_array_equal(data[0], data[1])
    assert not np.array_equal(data[1], data[2])
    traced = jax.jit(lambda s: attention.redraw_key(rng, s, redraw_interval=10))(jnp.int32(9))
    np.testing.assert_array_equal(jax.random.key_data(traced), data[0])
    shared = attention.draw_projection(keys[0], HEAD_DIM, NUM_FEATURES, coupling="gaussian")
    assert shared.matrix().shape == (NUM_FEATURES, HEAD_DIM)
