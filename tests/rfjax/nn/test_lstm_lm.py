"""Tests of ``rfjax.nn._lstm_lm``: the LSTM language model on empty batches."""

import jax
import jax.numpy as jnp
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
