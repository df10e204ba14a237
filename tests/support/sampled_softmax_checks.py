"""What the tests of ``rfjax.sampled_softmax`` share: a small problem (queries and class
embeddings of a 40-class vocabulary), the feature options of its random-feature proposals, and a
check that sampled classes follow a distribution."""

from __future__ import annotations

import math

import jax
import numpy as np

VOCAB, DIM = 40, 6
FEATURE_OPTIONS = {
    "num_features": 6,
    "num_coefficient_features": 3,
    "temperature": 0.5,
    "coupling": "gaussian",
}


def problem(num_queries: int = 3) -> tuple[jax.Array, jax.Array]:
    """``(queries (num_queries, DIM), embeddings (VOCAB, DIM))`` at fixed keys."""
    queries = 0.7 * jax.random.normal(jax.random.key(10), (num_queries, DIM))
    embeddings = 0.7 * jax.random.normal(jax.random.key(11), (VOCAB, DIM))
    return queries, embeddings


def assert_frequencies_match(samples, probabilities) -> None:
    """Per query: chi-square within df + 4 sd (sd = sqrt(2 df)) and every cell within 4.5 SE."""
    samples, probabilities = np.asarray(samples), np.asarray(probabilities, np.float64)
    draws = samples.shape[1]
    for row, p in zip(samples, probabilities, strict=True):
        counts = np.bincount(row, minlength=len(p))
        assert np.all(counts[p == 0] == 0)
        support = p > 0
        expected = draws * p[support]
        chi2 = np.sum((counts[support] - expected) ** 2 / expected)
        df = support.sum() - 1
        assert chi2 < df + 4 * math.sqrt(2 * df), (chi2, df)
        se = np.sqrt(p * (1 - p) / draws)
        assert np.all(np.abs(counts / draws - p) <= 4.5 * se + 1e-12)
