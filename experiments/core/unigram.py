"""The count unigram model of a language model's training tokens: the trivial model of the
language-model studies (their training check's reference: ``lstm_lm``, ``performer_lm``), the
LSTM's ``unigram`` proposal, and the frequent words whose share a model's softmax is measured by.

A model that predicts every word by its training frequency, p(w) = (count(w) + 1) / (N + V)
(add-one smoothing, so that a word absent from a small training subset keeps a probability),
reaches the count unigram perplexity exp(-mean log p(target)) on a split (PTB test: 639.8, 639.3
without the smoothing); a language model that has learned anything from its context is far
below it. The ``unigram`` proposal draws
the negatives of a sampled softmax from p (a fixed proposal, as TensorFlow's
``fixed_unigram_candidate_sampler``; Jean et al. 2015, Bengio and Senecal 2008).

``top_words`` are the ``TOP_WORDS`` most frequent training words; a model's *top mass* is the
mean over positions of its softmax probability on them, their *share* the fraction of targets
that are among them (PTB test: 0.31). A model whose top mass far exceeds the share over-predicts
the frequent words: the end state of a sampled softmax whose negatives rarely include them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

TOP_WORDS = 10  # the "top-10 mass": the model's softmax mass on the 10 most frequent words


def log_probabilities(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """log p(w) = log((count(w) + 1) / (N + V)) of the N training ``tokens``, ``(V,)`` float32.

    Raises:
      ValueError: if a token id lies outside [0, V).

    Examples:
      >>> import numpy as np
      >>> np.round(np.exp(log_probabilities(np.array([0, 0, 0, 1, 2]), 3)), 2)
      array([0.5 , 0.25, 0.25], dtype=float32)
    """
    tokens = np.asarray(tokens).reshape(-1)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(
            f"tokens must be ids in [0, {vocab_size}), got ids from {tokens.min()} to "
            f"{tokens.max()}"
        )
    counts = np.bincount(tokens, minlength=vocab_size) + 1.0
    return np.log(counts / counts.sum()).astype(np.float32)


def perplexity(log_unigram: np.ndarray, targets: np.ndarray) -> float:
    """The count unigram model's perplexity exp(-mean log p(target)) on ``targets``."""
    return float(np.exp(-np.mean(np.asarray(log_unigram, np.float64)[np.asarray(targets)])))


def top_words(log_unigram: np.ndarray) -> np.ndarray:
    """The ids of the ``TOP_WORDS`` most frequent words (most frequent first)."""
    return np.argsort(-np.asarray(log_unigram), kind="stable")[:TOP_WORDS]


def sample(
    key: jax.Array, log_unigram: jax.Array, num_queries: int, num_samples: int
) -> tuple[jax.Array, jax.Array]:
    """``num_samples`` negatives per query from the unigram distribution, with replacement, and
    their log-probabilities (``rfjax.nn.sample_proposal``'s return convention), ``(N, M)``.

    By inverse CDF: one cumulative table of the V probabilities and a binary search per draw,
    O(V + N M log V) (``jax.random.categorical`` would draw N M V Gumbel variables)."""
    cdf = jnp.cumsum(jnp.exp(log_unigram))
    # 1 - U lies in (0, 1]: the first word whose CDF reaches it has positive probability.
    u = (1.0 - jax.random.uniform(key, (num_queries, num_samples), cdf.dtype)) * cdf[-1]
    samples = jnp.minimum(jnp.searchsorted(cdf, u), log_unigram.shape[-1] - 1)
    return samples, jnp.take(log_unigram, samples)
