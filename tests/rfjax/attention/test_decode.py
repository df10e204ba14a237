"""Tests of ``rfjax.attention._decode``: decoding token by token and prefill equal causal
attention."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention
from tests.support.favor_inputs import (
    BATCH,
    CHUNK,
    HEADS,
    LENGTH,
    NUM_FEATURES,
    VALUE_DIM,
    float32_tolerance,
    make_inputs,
    per_head_projection,
    shared_projection,
)


@pytest.mark.parametrize("name", ["positive", "relu"])
def test_decode_matches_causal(name):
    query, key, value = make_inputs(11, scale=1.0)
    projection = per_head_projection()
    # Batch element 1 skips (masks) the keys of tokens 3 and 10.
    mask = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([3, 10])].set(False)
    full = attention.favor_attention(
        query, key, value, projection, feature_map=name, causal=True, mask=mask, chunk_size=CHUNK
    )
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, feature_map=name)
    step = jax.jit(
        functools.partial(attention.favor_decode_step, feature_map=name),
    )
    outs = []
    for t in range(LENGTH):
        state, out = step(state, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
        outs.append(out)
    np.testing.assert_allclose(
        jnp.stack(outs, 1), full, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )


@pytest.mark.parametrize(  # one shift per feature; one per key, unstabilised and stabilised
    "name", ["positive", "relu", "trigonometric"]
)
def test_prefill_gives_the_state_of_the_steps(name):
    # The prompt's output is causal FAVOR's; its state is that of a step per token (the same
    # shifts: maxima are exact), and steps after it equal causal FAVOR over the whole sequence.
    # (The trigonometric map: its keys' shifts are their log-scales, not 0 as unstabilised.)
    query, key, value = make_inputs(13, scale=1.0)
    projection = per_head_projection()
    mask = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([3, 17])].set(False)
    key = key.at[1, 3].set(jnp.nan)  # masked: reaches nothing
    prompt = 18  # not a whole number of chunks
    options = dict(feature_map=name, chunk_size=CHUNK)
    full = attention.favor_attention(
        query, key, value, projection, causal=True, mask=mask, **options
    )
    out, state = attention.favor_prefill(
        query[:, :prompt],
        key[:, :prompt],
        value[:, :prompt],
        projection,
        mask=mask[:, :prompt],
        **options,
    )
    np.testing.assert_array_equal(out, full[:, :prompt])
    step = jax.jit(functools.partial(attention.favor_decode_step, feature_map=name))
    stepped = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, feature_map=name)
    for t in range(prompt):
        stepped, _ = step(stepped, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
    np.testing.assert_array_equal(state.log_offset, stepped.log_offset)
    for got, expected in zip(state[:2], stepped[:2], strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=float32_tolerance(LENGTH, got))
    outs = []
    for t in range(prompt, LENGTH):
        state, out_t = step(state, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
        outs.append(out_t)
    # A signed map's rows divided by the floor eps exceed the values (as in the test below).
    largest = max(np.abs(value).max(), np.abs(full).max())
    np.testing.assert_allclose(
        jnp.stack(outs, 1),
        full[:, prompt:],
        rtol=0,
        atol=float32_tolerance(NUM_FEATURES + LENGTH, largest),
    )


def test_prefill_after_a_non_finite_key_or_value_decodes_nan_as_causal_favor():
    # An unmasked inf key at position 5 of sequence 0, head 1, and a NaN value at position 2 of
    # sequence 1, head 0: causal FAVOR's rows from there on of those heads are NaN; the
    # prefill's state is NaN for those heads only, so the steps after it are.
    query, key, value = make_inputs(15)
    key = key.at[0, 5, 1].set(jnp.inf)
    value = value.at[1, 2, 0, 3].set(jnp.nan)
    projection = per_head_projection()
    # Positive features: the per-feature state (_log_prefix.key_state) leaves such keys out.
    out, state = attention.favor_prefill(
        query[:, :8], key[:, :8], value[:, :8], projection, chunk_size=CHUNK
    )
    _, after = attention.favor_decode_step(state, query[:, 8], key[:, 8], value[:, 8], projection)
    poisoned = np.zeros(out.shape[:3], bool)
    poisoned[0, 5:, 1] = True
    poisoned[1, 2:, 0] = True
    np.testing.assert_array_equal(np.isnan(out).any(-1), poisoned)
    np.testing.assert_array_equal(np.isnan(after).any(-1), poisoned[:, -1])


def test_a_masked_step_leaves_the_state_unchanged_whatever_its_value():
    """A masked token (a finished sequence's padding) with a NaN value and an inf key: that
    sequence's state is unchanged bit for bit (its value is selected away, not multiplied by
    the key's zero features), the other sequence's step is the unmasked one's."""
    query, key, value = make_inputs(16)
    projection = shared_projection()
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection)
    step = jax.jit(attention.favor_decode_step)
    state, _ = step(state, query[:, 0], key[:, 0], value[:, 0], projection)
    token = (query[:, 1], key[:, 1].at[0].set(jnp.inf), value[:, 1].at[0].set(jnp.nan))
    mask = jnp.arange(BATCH) != 0
    masked, _ = step(state, *token, projection, mask=mask)
    unmasked, _ = step(state, *token, projection)
    for got, before, stepped in zip(masked, state, unmasked, strict=True):
        np.testing.assert_array_equal(got[0], before[0])
        np.testing.assert_array_equal(got[1:], stepped[1:])


@pytest.mark.parametrize("name", ["positive", "relu"])  # one shift per feature, one per key
def test_a_fully_masked_prompt_gives_the_empty_state(name):
    """Sequence 1's prompt wholly masked (left padding): its state is ``favor_decode_init``'s,
    zeros at the log floor, as the steps over masked tokens leave it (a shift of 0 there read
    the next key relative to 0, not to the floor)."""
    query, key, value = make_inputs(17)
    projection = shared_projection()
    mask = jnp.ones((BATCH, LENGTH), bool).at[1].set(False)
    _, state = attention.favor_prefill(
        query, key, value, projection, feature_map=name, mask=mask, chunk_size=CHUNK
    )
    empty = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, feature_map=name)
    for got, expected in zip(state, empty, strict=True):
        np.testing.assert_array_equal(got[1], expected[1])


def test_prefill_of_no_tokens_is_the_empty_state():
    query, key, value = make_inputs(14)
    projection = shared_projection()
    out, state = attention.favor_prefill(query[:, :0], key[:, :0], value[:, :0], projection)
    assert out.shape == (BATCH, 0, HEADS, VALUE_DIM)
    empty = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection)
    for got, expected in zip(state, empty, strict=True):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"batched \(B, T, N, H\)"):
        attention.favor_prefill(query[0], key[0], value[0], projection)


def test_a_step_mask_must_be_one_bool_per_sequence():
    """A decode step's mask is (B,) bools: a Python bool or a (B, 1) array raises naming the
    mask (a TypeError from indexing a bool before); a list of B bools is an array."""
    query, key, value = make_inputs(0)
    projection = shared_projection()
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection)
    token = (query[:, 0], key[:, 0], value[:, 0])
    for mask in (True, jnp.ones((BATCH, 1), bool)):
        with pytest.raises(ValueError, match=rf"mask must be a \(B,\) = \({BATCH},\) bool"):
            attention.favor_decode_step(state, *token, projection, mask=mask)
    listed = attention.favor_decode_step(state, *token, projection, mask=[True] * BATCH)
    array = attention.favor_decode_step(state, *token, projection, mask=jnp.ones(BATCH, bool))
    np.testing.assert_array_equal(listed[1], array[1])


def test_decoding_a_signed_map_clips_the_rows_causal_favor_clips():
    """The trigonometric map's estimated normalisers cross zero at |q|, |k| of about 2 sqrt(H):
    a step floors them at the signed maps' default ``eps``, as ``favor_attention`` does (a
    floor of the smallest normal number gave inf). The outputs divided by that floor are
    compared within ~(m + T) unit roundoffs of the largest."""
    query, key, value = make_inputs(11, scale=2.0)
    projection = per_head_projection()
    options = dict(feature_map="trigonometric")
    full = attention.favor_attention(
        query, key, value, projection, causal=True, chunk_size=CHUNK, **options
    )
    assert np.max(np.abs(full)) > np.max(np.abs(value))  # some rows are clipped
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, **options)
    step = jax.jit(functools.partial(attention.favor_decode_step, **options))
    outs = []
    for t in range(LENGTH):
        state, out = step(state, query[:, t], key[:, t], value[:, t], projection)
        outs.append(out)
    np.testing.assert_allclose(
        jnp.stack(outs, 1), full, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, full)
    )


def test_the_empty_state_accumulates_in_float32_at_least_with_a_shift_per_feature_or_key():
    """``favor_decode_init``: lower precisions accumulate in float32; the shift ``log_offset``
    is one per feature for exponential maps and one per head otherwise (``DecodeState``)."""
    projection = shared_projection()
    shapes = {"positive": NUM_FEATURES, "relu": 1}
    for name, width in shapes.items():
        state = attention.favor_decode_init(
            BATCH, HEADS, VALUE_DIM, projection, feature_map=name, dtype=jnp.bfloat16
        )
        assert {x.dtype for x in state} == {jnp.dtype(jnp.float32)}
        assert state.log_offset.shape == (BATCH, HEADS, width)


def test_prefill_runs_the_implementation_asked_for():
    """``favor_prefill``'s output is ``favor_attention``'s under its ``implementation``: the
    kernels in interpret mode (traced only), and the refusal of an unknown name."""
    query, key, value = make_inputs(15)
    projection = shared_projection()

    def prefill(implementation):
        return attention.favor_prefill(query, key, value, projection, implementation=implementation)

    program = str(jax.make_jaxpr(lambda: prefill("pallas_triton_interpret"))())
    assert "pallas_call" in program
    assert "pallas_call" not in str(jax.make_jaxpr(lambda: prefill("xla"))())
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'xla'"):
        prefill("pallas")
