"""Tests of ``rfjax.attention._bidirectional``: sequences cut into padded blocks, and
bidirectional FAVOR attention over more than one block of keys (the last one padded) equal to
its explicit weights times the values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_a_block_of_padding_after_the_keys_keeps_their_sums():
    """A batch whose second sequence is padding from the second block of keys on: its last
    block's keys all masked (log-features at the floor) must leave the running shift, and the
    sums relative to it, as they are. A shift taken from each block alone fell to the floor
    there and rescaled the sums by exp(shift - floor) = inf: NaN rows."""
    length = 2 * _bidirectional.BIDIRECTIONAL_BLOCK
    kq, kk, kv = jax.random.split(jax.random.key(4), 3)
    query = 0.5 * jax.random.normal(kq, (2, length, 1, 4))
    key = 0.5 * jax.random.normal(kk, (2, length, 1, 4))
    value = jax.random.normal(kv, (2, length, 1, 2))
    mask = jnp.stack(
        [jnp.ones(length, bool), jnp.arange(length) < _bidirectional.BIDIRECTIONAL_BLOCK - 5]
    )
    projection = projections.gaussian(jax.random.key(5), 4, 8)
    out = attention.favor_attention(query, key, value, projection, mask=mask)
    weights = attention.favor_attention_weights(query, key, projection, mask=mask)
    np.testing.assert_allclose(
        out, jnp.einsum("bnts,bsnh->btnh", weights, value), rtol=2e-5, atol=2e-6
    )


@pytest.mark.parametrize(
    "blocks",
    [
        3,  # over STORED_BLOCKS: each block's features formed again (``jax.checkpoint``)
        pytest.param(2, marks=pytest.mark.statistical),  # unrolled, the features kept
    ],
)
def test_gradients_over_several_blocks_are_those_of_the_explicit_weights(blocks):
    """Differentiated over more than one block, the backward pass keeps each block's features
    (up to ``STORED_BLOCKS`` blocks) or forms them again: either way the gradients are those of
    the explicit weights."""
    length = (blocks - 1) * _bidirectional.BIDIRECTIONAL_BLOCK + 8  # the last block padded
    kq, kk, kv = jax.random.split(jax.random.key(2), 3)
    query = 0.5 * jax.random.normal(kq, (1, length, 1, 4))
    key = 0.5 * jax.random.normal(kk, (1, length, 1, 4))
    value = jax.random.normal(kv, (1, length, 1, 2))
    projection = projections.gaussian(jax.random.key(3), 4, 8)

    def favor(q, k, v):
        return attention.favor_attention(q, k, v, projection)

    def explicit(q, k, v):
        weights = attention.favor_attention_weights(q, k, projection)
        return jnp.einsum("bnts,bsnh->btnh", weights, v)

    def gradients(attend):
        grad = jax.grad(lambda *x: jnp.sum(jnp.sin(attend(*x))), argnums=(0, 1, 2))
        return jax.jit(grad)(query, key, value)

    for got, want in zip(gradients(favor), gradients(explicit), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_forward_and_backward_keep_no_feature_tensor_of_the_sequence():
    """XLA's temporaries of the jitted forward + backward at T = 4,096 (8 blocks; 4 heads of
    64, m = 128) stay under 3x one (B, T, N, m) float32 feature tensor: each block's features
    are formed again in the backward pass. Storing them for every block took 9.4x (75 MiB)."""
    shape = jax.ShapeDtypeStruct((1, 4096, 4, 64), jnp.float32)
    projection = projections.orthogonal(jax.random.key(0), 64, 128)

    def loss(q, k, v):
        return jnp.sum(attention.favor_attention(q, k, v, projection))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    features = 4096 * 4 * 128 * 4
    assert compiled.memory_analysis().temp_size_in_bytes <= 3 * features
