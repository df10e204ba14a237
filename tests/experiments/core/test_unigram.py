"""The count unigram model (experiments.core.unigram): the language-model studies' trivial model
and the LSTM's unigram proposal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.core import unigram


def test_add_one_probabilities_and_their_perplexity():
    tokens = np.array([0, 0, 0, 0, 1, 1, 2])  # counts 4, 2, 1 (+1 each): 5/10, 3/10, 2/10
    log_p = unigram.log_probabilities(tokens, 4)  # word 3 never occurs: 1/11
    np.testing.assert_allclose(np.exp(log_p), [5 / 11, 3 / 11, 2 / 11, 1 / 11], rtol=1e-6)
    targets = np.array([0, 1, 3])
    expected = np.exp(-np.mean(np.log([5 / 11, 3 / 11, 1 / 11])))
    assert unigram.perplexity(log_p, targets) == pytest.approx(expected, rel=1e-6)
    # A uniform model's perplexity is the vocabulary size.
    assert unigram.perplexity(np.log(np.full(4, 0.25)), targets) == pytest.approx(4.0)
    assert list(unigram.top_words(log_p)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, 4\)"):
        unigram.log_probabilities(np.array([0, 4]), 4)


def test_the_unigram_proposal_draws_from_the_word_frequencies():
    log_p = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    samples, log_q = unigram.sample(jax.random.key(0), log_p, 500, 40)
    assert samples.shape == log_q.shape == (500, 40)
    np.testing.assert_allclose(log_q, log_p[samples])
    frequencies = np.bincount(np.asarray(samples).ravel(), minlength=4) / samples.size
    se = np.sqrt(np.exp(log_p) * (1 - np.exp(log_p)) / samples.size)
    assert np.all(np.abs(frequencies - np.exp(log_p)) < 4 * se)
