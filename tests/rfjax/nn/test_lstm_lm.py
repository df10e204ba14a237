"""Tests of ``rfjax.nn._lstm_lm``: the LSTM language model on empty batches, its causal
recurrence through every layer, the tied output table and dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import LSTMLanguageModel, logit_temperature


def test_lstm_language_model_on_empty_batches():
    model = LSTMLanguageModel(vocab_size=10, hidden_size=8, num_layers=1)
    variables = model.init(jax.random.key(0), jnp.ones((1, 3), int), train=False)
    for shape in ((0, 3), (2, 0)):
        queries, _ = model.apply(variables, jnp.ones(shape, int), train=False)
        assert queries.shape == (*shape, 8)


def test_bad_tokens_and_dropout_rates_raise_naming_them():
    """A token -1 wrapped to class V - 1 and V gave NaN; a dropout rate of 1.5 zeroed every
    output and -0.5 rescaled them, without an error."""
    model = LSTMLanguageModel(vocab_size=10, hidden_size=8, num_layers=1)
    variables = model.init(jax.random.key(0), jnp.ones((1, 3), int), train=False)
    for bad in (-1, 10):
        with pytest.raises(ValueError, match=r"tokens must hold ids in \[0, 10\)"):
            model.apply(variables, jnp.array([[1, bad, 2]]), train=False)
    for rate in (1.5, -0.5, 1.0):
        bad_rate = LSTMLanguageModel(vocab_size=10, hidden_size=8, num_layers=1, dropout_rate=rate)
        with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\)"):
            bad_rate.init(jax.random.key(0), jnp.ones((1, 3), int), train=False)


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0.0, "big"])
def test_a_bad_initial_logit_scale_raises_naming_it(scale):
    """inf passed the "> 0" check and gave queries of +-inf; NaN was refused as "must be > 0",
    and a string raised a comparison error."""
    model = LSTMLanguageModel(
        vocab_size=10, hidden_size=8, logits="cosine", initial_logit_scale=scale
    )
    with pytest.raises((TypeError, ValueError), match="initial_logit_scale must be"):
        model.init(jax.random.key(0), jnp.ones((1, 3), int), train=False)


def test_cosine_logits_are_the_scale_times_the_cosine():
    """logits="cosine": o_i = s cos(q, e_i) with s = initial_logit_scale at init, and
    ``logit_temperature`` is 1/s."""
    model = LSTMLanguageModel(
        vocab_size=10, hidden_size=8, num_layers=1, logits="cosine", initial_logit_scale=4.0
    )
    tokens = jnp.array([[1, 2, 3]])
    variables = model.init(jax.random.key(0), tokens, train=False)
    queries, table = model.apply(variables, tokens, train=False)
    logits = queries @ table.T
    norms = jnp.linalg.norm(queries, axis=-1, keepdims=True) * jnp.linalg.norm(table, axis=-1)
    assert jnp.allclose(norms, 4.0, rtol=1e-5)  # |sqrt(s) q_bar| |sqrt(s) e_bar| = s
    assert jnp.all(jnp.abs(logits) <= 4.0 * (1 + 1e-5))
    assert float(logit_temperature(variables)) == pytest.approx(0.25)


def _lstm(**options) -> tuple[LSTMLanguageModel, dict]:
    model = LSTMLanguageModel(vocab_size=10, hidden_size=8, **options)
    return model, model.init(jax.random.key(0), jnp.ones((1, 4), int), train=False)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_queries_read_the_past_through_every_layer(num_layers):
    """The query at t depends on the tokens before t (the LSTMs' state, from a zero state) and
    never on later ones; every layer is a parameterised LSTM; logits="dot" ties the output
    table to the embedding."""
    model, variables = _lstm(num_layers=num_layers)
    assert sorted(variables["params"]) == [
        *(f"OptimizedLSTMCell_{i}" for i in range(num_layers)),
        "embedding",
    ]
    tokens = jnp.array([[1, 2, 3, 4]])
    queries, table = model.apply(variables, tokens, train=False)
    np.testing.assert_array_equal(table, variables["params"]["embedding"]["embedding"])
    changed_first = model.apply(variables, tokens.at[0, 0].set(7), train=False)[0]
    changed_last = model.apply(variables, tokens.at[0, 3].set(7), train=False)[0]
    assert np.all(np.abs(changed_first[0, 1:] - queries[0, 1:]) > 0)
    np.testing.assert_array_equal(changed_last[0, :3], queries[0, :3])


def test_dropout_acts_on_embeddings_and_outputs_in_training_only():
    """train=False: the outputs of dropout_rate=0. train=True: no layer, queries are the
    embeddings with a fraction p zeroed and the rest scaled by 1 / (1 - p); one layer, a
    fraction p of the LSTM's outputs is zeroed."""
    tokens = jax.random.randint(jax.random.key(1), (4, 50), 0, 10)
    for layers in (0, 1):
        model, variables = _lstm(num_layers=layers, dropout_rate=0.5)
        plain = _lstm(num_layers=layers, dropout_rate=0.0)[0].apply(variables, tokens, train=False)
        np.testing.assert_array_equal(model.apply(variables, tokens, train=False)[0], plain[0])
        queries, _ = model.apply(variables, tokens, train=True, rngs={"dropout": jax.random.key(2)})
        zeroed = np.mean(np.asarray(queries) == 0)
        assert abs(zeroed - 0.5) < 0.05, zeroed  # 1,600 Bernoulli(1/2): SE 0.0125
        if layers == 0:
            kept = np.asarray(queries) != 0
            np.testing.assert_allclose(
                np.asarray(queries)[kept], 2 * np.asarray(plain[0])[kept], rtol=1e-6
            )
