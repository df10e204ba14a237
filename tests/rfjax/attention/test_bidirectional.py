"""Tests of ``rfjax.attention._bidirectional``: sequences cut into padded blocks, and
bidirectional FAVOR attention over more than one block of keys (the last one padded) equal to
its explicit weights times the values."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import attention, projections
from rfjax.attention import _bidirectional


def test_in_blocks_pads_the_sequence_axis_and_moves_blocks_first():
    x = jnp.arange(2 * 5 * 3).reshape(2, 5, 3)
    blocks = _bidirectional.in_blocks(x, 2, fill=-1)
    assert blocks.shape == (3, 2, 2, 3)  # (T' / block, B, block, ...), T' = 6
    np.testing.assert_array_equal(blocks[1, 0], x[0, 2:4])
    np.testing.assert_array_equal(blocks[2, 1, 0], x[1, 4])
    np.testing.assert_array_equal(blocks[2, :, 1], -1)  # the padding


def test_keys_over_two_blocks_give_the_explicit_weights_times_the_values():
    length = _bidirectional.BIDIRECTIONAL_BLOCK + 8  # two blocks of keys, the second padded
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    query = 0.5 * jax.random.normal(kq, (1, length, 1, 4))
    key = 0.5 * jax.random.normal(kk, (1, length, 1, 4))
    value = jax.random.normal(kv, (1, length, 1, 2))
    projection = projections.gaussian(jax.random.key(1), 4, 8)
    out = attention.favor_attention(query, key, value, projection)
    weights = attention.favor_attention_weights(query, key, projection)
    np.testing.assert_allclose(
        out, jnp.einsum("bnts,bsnh->btnh", weights, value), rtol=2e-5, atol=2e-6
    )
