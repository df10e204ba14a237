"""Tests of ``rfjax.nn._lstm_lm``: the LSTM language model on empty batches."""

import jax
import jax.numpy as jnp

from rfjax.nn import LSTMLanguageModel


def test_lstm_language_model_on_empty_batches():
    model = LSTMLanguageModel(vocab_size=10, hidden_size=8, num_layers=1)
    variables = model.init(jax.random.key(0), jnp.ones((1, 3), int), train=False)
    for shape in ((0, 3), (2, 0)):
        queries, _ = model.apply(variables, jnp.ones(shape, int), train=False)
        assert queries.shape == (*shape, 8)
