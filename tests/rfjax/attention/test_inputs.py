"""The input forms of the FAVOR functions: empty axes (issue 19 item 6), integer steps and
matching decode states (issue 19 item 8), Flax-style (B, 1, 1, S) masks and raw projection
matrices (issue 20 item 2)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, projections

BATCH, LENGTH, HEADS, HEAD_DIM, VALUE_DIM, NUM_FEATURES = 2, 10, 3, 8, 4, 16


def make_inputs(batch=BATCH, length=LENGTH, key_length=LENGTH, heads=HEADS, value_dim=VALUE_DIM):
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    query = jax.random.normal(kq, (batch, length, heads, HEAD_DIM))
    key = jax.random.normal(kk, (batch, key_length, heads, HEAD_DIM))
    value = jax.random.normal(kv, (batch, key_length, heads, value_dim))
    return query, key, value


def projection():
    return projections.orthogonal(jax.random.key(1), HEAD_DIM, NUM_FEATURES)


# ----------------------------------------------------------------- empty axes

# FAVOR and its exact reference (softmax_attention raised a NumPy reduction error at T = 0).
ATTENTIONS = {
    "favor": lambda *qkv, **options: attention.favor_attention(*qkv, projection(), **options),
    "softmax": attention.softmax_attention,
}


@pytest.mark.parametrize(
    ("sizes", "causal"),
    [
        ({"batch": 0}, False),
        ({"batch": 0}, True),
        ({"length": 0, "key_length": 0}, False),
        ({"length": 0, "key_length": 0}, True),
        ({"length": 0}, False),
        ({"heads": 0}, True),
        ({"value_dim": 0}, True),
    ],
)
@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_empty_axes_give_empty_results(sizes, causal, name):
    attend = ATTENTIONS[name]
    query, key, value = make_inputs(**sizes)
    out = attend(query, key, value, causal=causal)
    assert out.shape == (*query.shape[:3], value.shape[-1])
    assert out.dtype == jnp.float32
    grads = jax.grad(lambda *x: jnp.sum(attend(*x, causal=causal)), argnums=(0, 1, 2))(
        query, key, value
    )
    assert [g.shape for g in grads] == [x.shape for x in (query, key, value)]


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_no_keys_gives_zero_rows(name):
    # S = 0 with T > 0 queries: every row attends to nothing, as a fully masked row: 0.
    attend = ATTENTIONS[name]
    query, key, value = make_inputs(key_length=0)
    out = attend(query, key, value)
    assert out.shape == (BATCH, LENGTH, HEADS, VALUE_DIM)
    assert np.all(np.asarray(out) == 0)
    fully_masked = attend(*make_inputs(), mask=jnp.zeros((BATCH, LENGTH), bool))
    np.testing.assert_array_equal(out, fully_masked)


def test_empty_inputs_check_the_arguments_and_give_empty_weights():
    """favor_attention checks eps and the implementation before returning an empty result
    (it returned zeros first); favor_attention_weights gives (B, N, T, S) zeros with no keys
    or no rows (a NumPy reduction error and a ZeroDivisionError before)."""
    query, key, value = make_inputs(key_length=0)
    with pytest.raises(ValueError, match="eps must be > 0"):
        attention.favor_attention(query, key, value, projection(), eps=-1.0)
    with pytest.raises(ValueError, match="fuses the feature maps"):
        attention.favor_attention(
            query, key, value, projection(), feature_map="relu",
            implementation="pallas_triton_interpret",
        )  # fmt: skip
    weights = attention.favor_attention_weights(query, key, projection())
    assert weights.shape == (BATCH, HEADS, LENGTH, 0)
    empty, _, _ = make_inputs(length=0, key_length=0)
    causal = attention.favor_attention_weights(empty, empty, projection(), causal=True)
    assert causal.shape == (BATCH, HEADS, 0, 0) and causal.dtype == jnp.float32


def test_invalid_projection_sizes():
    query, key, value = make_inputs()
    for shape in ((0, HEAD_DIM), (NUM_FEATURES,)):
        with pytest.raises(ValueError, match="projection"):
            attention.favor_attention(query, key, value, jnp.ones(shape))


# ----------------------------------------------------------------- steps and decode states


def test_redraw_key_step_must_be_an_integer_scalar():
    rng = jax.random.key(2)
    for step in (1.5, 3.0, jnp.float32(3), True):
        with pytest.raises(TypeError, match="step must be an integer"):
            attention.redraw_key(rng, step, redraw_interval=10)
    with pytest.raises(ValueError, match="step must be a scalar"):
        attention.redraw_key(rng, jnp.arange(2), redraw_interval=10)
    # Integers of any kind are fine, and equal.
    keys = [
        jax.random.key_data(attention.redraw_key(rng, s, redraw_interval=10))
        for s in (12, np.int64(12), jnp.int32(12))
    ]
    for k in keys[1:]:
        np.testing.assert_array_equal(k, keys[0])


def test_decode_state_of_the_wrong_shape_is_named():
    query, key, value = (x[:, 0] for x in make_inputs())
    narrow = projections.orthogonal(jax.random.key(3), HEAD_DIM, NUM_FEATURES // 2)
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, narrow)
    # Width NUM_FEATURES // 2 against a projection of NUM_FEATURES rows.
    with pytest.raises(ValueError, match=r"state .*kv_sum \(2, 3, 16, 4\).*got \(2, 3, 8, 4\)"):
        attention.favor_decode_step(state, query, key, value, projection())
    # A state made for another value dim, or for the antithetic map (width 2m).
    wrong_value = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM + 1, projection())
    with pytest.raises(ValueError, match="state"):
        attention.favor_decode_step(wrong_value, query, key, value, projection())
    antithetic = attention.favor_decode_init(
        BATCH, HEADS, VALUE_DIM, projection(), feature_map="positive_antithetic"
    )
    with pytest.raises(ValueError, match="state"):
        attention.favor_decode_step(antithetic, query, key, value, projection())
    # A state of a map with one shift per head (relu: log_offset (B, N, 1)), of the same width.
    relu = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection(), feature_map="relu")
    with pytest.raises(ValueError, match=r"log_offset \(2, 3, 16\); got .*, \(2, 3, 1\)"):
        attention.favor_decode_step(relu, query, key, value, projection())
    # The matching one works.
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection())
    _, out = attention.favor_decode_step(state, query, key, value, projection())
    assert out.shape == (BATCH, HEADS, VALUE_DIM)


# ----------------------------------------------------------------- masks and raw projections


@pytest.mark.parametrize("causal", [False, True])
def test_flax_style_key_padding_masks(causal):
    query, key, value = make_inputs()
    padding = jnp.arange(LENGTH)[None, :] < jnp.array([[LENGTH], [6]])
    flax_mask = nn.make_attention_mask(jnp.ones((BATCH, 1), bool), padding, dtype=bool)
    assert flax_mask.shape == (BATCH, 1, 1, LENGTH)
    run = attention.favor_attention
    expected = run(query, key, value, projection(), causal=causal, mask=padding)
    for mask in (flax_mask, padding[:, None, None]):
        got = run(query, key, value, projection(), causal=causal, mask=mask)
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(
        attention.softmax_attention(query, key, value, causal=causal, mask=flax_mask),
        attention.softmax_attention(query, key, value, causal=causal, mask=padding),
    )
    # A mask that depends on the query position is not key padding: a clear error.
    with pytest.raises(ValueError, match=r"mask.*\(B, 1, 1, S\)"):
        run(
            query,
            key,
            value,
            projection(),
            mask=nn.make_attention_mask(padding, padding, dtype=bool),
        )


def test_raw_projection_matrices():
    query, key, value = make_inputs()
    w = projection()
    np.testing.assert_array_equal(
        attention.favor_attention(query, key, value, w.matrix()),
        attention.favor_attention(query, key, value, w),
    )
    per_head = attention.draw_projection(jax.random.key(4), HEAD_DIM, NUM_FEATURES, num_heads=3)
    raw = attention.PerHead(per_head.stacked.matrix())
    np.testing.assert_array_equal(
        attention.favor_attention(query, key, value, raw, causal=True),
        attention.favor_attention(query, key, value, per_head, causal=True),
    )
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, w.matrix())
    assert state.kv_sum.shape == (BATCH, HEADS, NUM_FEATURES, VALUE_DIM)
    with pytest.raises(TypeError, match="projection must be a floating array"):
        attention.favor_attention(query, key, value, jnp.ones((NUM_FEATURES, HEAD_DIM), int))
    with pytest.raises(ValueError, match="dim == head_dim"):
        attention.favor_attention(query, key, value, jnp.ones((NUM_FEATURES, HEAD_DIM + 1)))
    with pytest.raises(ValueError, match="PerHead"):  # N stacked matrices must be marked
        attention.favor_attention(query, key, value, per_head.stacked.matrix())
