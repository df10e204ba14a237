"""The heads as attention receives them (``rfjax.nn._attention_inputs``): cosine scores at a
learned temperature per head, grouped key/value heads repeated as Flax groups them, and a
rotary embedding applied to each head's ``(L, H)`` slice."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rfjax.nn._attention_inputs import cosine_scores, repeat_kv_heads, rotate

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 5, 4, 8


def _heads(num_heads=HEADS, seed=0):
    return jax.random.normal(jax.random.key(seed), (BATCH, LENGTH, num_heads, HEAD_DIM))


def test_cosine_scores_are_the_temperature_times_the_cosine():
    query, key = _heads(seed=0), _heads(seed=1)
    temperature = jnp.array([0.5, 1.0, 2.0, 7.0])
    q, k = cosine_scores(query, key, jnp.log(temperature))
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(HEAD_DIM)
    unit = [x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (query, key)]
    cosines = jnp.einsum("btnh,bsnh->bnts", *unit)
    np.testing.assert_allclose(scores, temperature[:, None, None] * cosines, rtol=1e-5, atol=1e-6)


def test_grouped_heads_are_read_as_flax_groups_them():
    """Query head i reads key/value head i // (N / N_kv): the same output as Flax's grouped
    ``dot_product_attention``."""
    query, key, value = _heads(seed=0), _heads(2, seed=1), _heads(2, seed=2)
    repeated_key, repeated_value = repeat_kv_heads(key, value, HEADS)
    for i in range(HEADS):
        np.testing.assert_array_equal(repeated_key[:, :, i], key[:, :, i // 2])
        np.testing.assert_array_equal(repeated_value[:, :, i], value[:, :, i // 2])
    np.testing.assert_allclose(
        nnx.dot_product_attention(query, repeated_key, repeated_value),
        nnx.dot_product_attention(query, key, value),
        rtol=1e-5,
        atol=1e-6,
    )
    same = repeat_kv_heads(query, query, HEADS)
    assert same[0] is query and same[1] is query


def test_rotary_embedding_applies_to_each_head():
    rope = nnx.RoPE()
    x = _heads()
    positions = jnp.array([3, 1, 4, 1, 5])
    for given, got in ((None, rotate(rope, x, None)), (positions, rotate(rope, x, positions))):
        for n in range(HEADS):
            head = x[:, :, n]
            expected = rope(head) if given is None else rope(head, given)
            np.testing.assert_allclose(got[:, :, n], expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(rotate(rope, x, None), rotate(rope, x, positions))
