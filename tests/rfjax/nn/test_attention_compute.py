"""Attention over heads as ``PerformerAttention`` computes it (``rfjax.nn._attention_compute``),
called directly: a traced causality runs the FAVOR variant it selects, a prefill and the steps
after it equal causal FAVOR, a prefill only starts a sequence, exact attention isolates a
non-finite row, and the key/value cache step writes, masks and isolates as documented."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention import favor_decode_init
from rfjax.nn._attention_compute import (
    decode_heads,
    favor_heads,
    isolating_non_finite,
    kv_cache_step,
)
from rfjax.nn._attention_draws import draw_heads
from rfjax.nn._attention_masks import FavorMask

BATCH, LENGTH, HEADS, HEAD_DIM, NUM_FEATURES = 2, 6, 2, 4, 8


def _heads():
    """Queries, keys and values ``(B, T, N, H)`` and one draw per head."""
    q, k, v = 0.5 * jax.random.normal(jax.random.key(0), (3, BATCH, LENGTH, HEADS, HEAD_DIM))
    projection, feature_map = draw_heads(
        jax.random.key(1),
        jax.random.key(2),
        head_dim=HEAD_DIM,
        num_heads=HEADS,
        num_features=NUM_FEATURES,
        coupling="gaussian",
        feature_map="positive",
    )
    return q, k, v, projection, feature_map


def _prefill(state, prompt, mask):
    """``decode_heads`` on the first ``prompt`` tokens of ``_heads()`` (a prefill)."""
    q, k, v, projection, feature_map = _heads()
    return decode_heads(
        state,
        jnp.int32(0),
        q[:, :prompt],
        k[:, :prompt],
        v[:, :prompt],
        projection,
        feature_map,
        mask,
        chunk_size=2,
        eps=None,
    )


def test_a_traced_causality_runs_the_variant_it_selects():
    q, k, v, projection, feature_map = _heads()

    def attend(causal):
        mask = FavorMask(None, causal)
        return favor_heads(q, k, v, projection, feature_map, mask, chunk_size=2, eps=None)

    causal, bidirectional = attend(True), attend(False)
    assert not np.allclose(causal, bidirectional)  # the selection matters here
    for flag, expected in ((True, causal), (False, bidirectional)):
        np.testing.assert_allclose(jax.jit(attend)(jnp.bool_(flag)), expected, atol=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_a_prefill_and_the_steps_after_it_equal_causal_favor(padded):
    # padded: batch 1's keys 1 (in the prefill) and LENGTH - 1 (a step) masked, the prefill
    # given the (B, T) key padding mask, each step its token's (B, 1, 1, 1) mask.
    q, k, v, projection, feature_map = _heads()
    padding = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([1, LENGTH - 1])].set(False)
    padding = padding if padded else None
    expected = favor_heads(
        q, k, v, projection, feature_map, FavorMask(padding, True), chunk_size=2, eps=None
    )
    state = favor_decode_init(
        BATCH, HEADS, HEAD_DIM, projection, feature_map=feature_map, dtype=jnp.float32
    )
    prompt = LENGTH - 2
    prefill_mask = None if padding is None else padding[:, :prompt]
    state, prefilled = _prefill(state, prompt, prefill_mask)
    outputs = [prefilled]
    for t in range(prompt, LENGTH):
        at = slice(t, t + 1)
        state, out = decode_heads(
            state,
            jnp.int32(t),
            q[:, at],
            k[:, at],
            v[:, at],
            projection,
            feature_map,
            None if padding is None else padding[:, t].reshape(BATCH, 1, 1, 1),
            chunk_size=2,
            eps=None,
        )
        outputs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, atol=1e-5)


def test_a_prefill_after_the_first_token_raises():
    q, k, v, projection, feature_map = _heads()
    state = favor_decode_init(BATCH, HEADS, HEAD_DIM, projection, feature_map=feature_map)

    def prefill(index):
        return decode_heads(
            state, index, q, k, v, projection, feature_map, None, chunk_size=2, eps=None
        )

    with pytest.raises(ValueError, match="cache_index 3"):
        prefill(jnp.int32(3))
    with pytest.raises(Exception, match="cache_index 3"):  # at run time under jit
        jax.block_until_ready(jax.jit(prefill)(jnp.int32(3)))


def test_a_prefill_given_a_mask_over_the_whole_cache_says_what_it_covers():
    # A Flax decode loop gives the exact kind's mask over the cache's L positions; the
    # Performer's prefill takes its T tokens' mask, and a (B, L) one raised favor_mask's
    # generic mask-form error, which says nothing of decoding.
    _, _, _, projection, feature_map = _heads()
    state = favor_decode_init(BATCH, HEADS, HEAD_DIM, projection, feature_map=feature_map)
    with pytest.raises(ValueError, match=r"a prefill's mask covers its T = 4 tokens"):
        _prefill(state, 4, jnp.ones((BATCH, LENGTH), bool))


def test_exact_attention_isolates_a_non_finite_row():
    q, k, v, _, _ = _heads()
    k = k.at[0, 3, 1].set(jnp.nan)  # batch 0, key 3, head 1
    q = q.at[1, 2, 0].set(jnp.inf)  # batch 1, query 2, head 0
    every = jnp.ones((BATCH, HEADS, LENGTH, LENGTH), bool)  # causal with a mask: NNX's call
    for causal, mask in ((False, None), (True, None), (True, every)):

        def attend(query, key, value, causal=causal, mask=mask):
            return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=causal)

        out = np.asarray(isolating_non_finite(attend, q, k, v, mask, causal=causal))
        bad = np.zeros(out.shape[:3], bool)  # (B, T, N)
        bad[0, 3 if causal else 0 :, 1] = True  # the rows that read key 3 of head 1
        bad[1, 2, 0] = True  # the query's own row
        np.testing.assert_array_equal(np.isnan(out).any(-1), bad)
        assert np.isfinite(out[~bad]).all()


def test_a_masked_non_finite_value_reaches_no_row():
    """Flax's attention multiplies a masked key's zero weight by its value: a NaN value there
    would reach every row (0 * NaN) without the isolation."""
    q, k, v, _, _ = _heads()
    v = v.at[0, 3, 1].set(jnp.nan)  # batch 0, key 3, head 1
    mask = jnp.broadcast_to(jnp.arange(LENGTH) != 3, (BATCH, HEADS, LENGTH, LENGTH))
    attend = functools.partial(nn.dot_product_attention, mask=mask)
    assert np.isnan(attend(q, k, v)).any()  # the isolation matters here
    assert np.isfinite(isolating_non_finite(attend, q, k, v, mask)).all()


def test_the_cache_step_writes_masks_and_isolates_non_finite_tokens():
    """A prefill of 2 tokens, then one token at position 2: each written at its positions (a
    head whose key is not finite as a NaN key and a zero value), each query seeing the
    positions up to its own."""
    capacity = 5
    empty = jnp.zeros((BATCH, capacity, HEADS, HEAD_DIM))
    _, k, v, _, _ = _heads()
    k = k.at[1, 0, 0, 2].set(jnp.nan)  # batch 1, token 0, head 0
    key, value, mask = kv_cache_step(empty, empty, jnp.int32(0), k[:, :2], v[:, :2], None)
    seen = np.arange(capacity)[None, :] <= np.arange(2)[:, None]
    np.testing.assert_array_equal(mask, np.broadcast_to(seen, (BATCH, 1, 2, capacity)))
    key, value, mask = kv_cache_step(key, value, jnp.int32(2), k[:, 2:3], v[:, 2:3], None)
    np.testing.assert_array_equal(mask, np.broadcast_to(np.arange(capacity) <= 2, mask.shape))
    written = k[:, :3].at[1, 0, 0].set(jnp.nan)  # that head's key only
    np.testing.assert_array_equal(key[:, :3], written)
    np.testing.assert_array_equal(value[:, :3], v[:, :3].at[1, 0, 0].set(0.0))
    assert not np.asarray(key[:, 3:]).any() and not np.asarray(value[:, 3:]).any()
    with pytest.raises(ValueError, match="cache_index 1"):
        kv_cache_step(empty, empty, jnp.int32(1), k[:, :2], v[:, :2], None)
    with pytest.raises(ValueError, match="holds L = 5 positions"):
        kv_cache_step(empty, empty, jnp.int32(0), k, v, None)


def test_tokens_past_the_cache_raise_or_read_nan():
    """A full cache took a token at its last position (``dynamic_update_slice`` clamps the
    index), overwriting it: attention over the wrong keys, silently. Now a concrete index
    raises, and a traced one makes the call's rows (and the later ones') NaN."""
    capacity = 3
    empty = jnp.zeros((BATCH, capacity, HEADS, HEAD_DIM))
    q, k, v, _, _ = _heads()
    with pytest.raises(ValueError, match=r"holds L = 3 positions .* full after 3 tokens"):
        kv_cache_step(empty, empty, jnp.int32(3), k[:, :1], v[:, :1], None)

    @jax.jit
    def attend(index):
        key, value, mask = kv_cache_step(empty, empty, index, k[:, :1], v[:, :1], None)
        return key, nn.dot_product_attention(q[:, :1], key, value, mask=mask)

    key, out = attend(jnp.int32(2))  # the last position: fits
    np.testing.assert_array_equal(key[:, 2], k[:, 0])
    assert np.isfinite(out).all()
    key, out = attend(jnp.int32(3))
    assert np.isnan(key[:, 2]).all() and np.isnan(out).all()
