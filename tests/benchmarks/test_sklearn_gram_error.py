"""``benchmarks.sklearn_gram_error``: the error is |Z Z^T - K|_F / |K|_F, seeds are paired
across transformers, and each row's statistics are over its own errors (made-up errors)."""

import numpy as np
import pytest
from sklearn.kernel_approximation import RBFSampler

from benchmarks import sklearn_gram_error


class _Fixed:
    def __init__(self, z):
        self.z = z

    def fit_transform(self, x):
        return self.z


def test_the_error_is_the_relative_frobenius_error_of_the_gram_matrix():
    z = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 2.0]])
    exact = np.eye(3)
    want = np.linalg.norm(z @ z.T - exact) / np.sqrt(3)
    assert sklearn_gram_error.relative_error(_Fixed(z), np.zeros((3, 1)), exact) == want


def _error(index, seed):
    """A made-up error of transformer ``index`` at ``seed``: its paired differences from the
    reference's (index 0) vary with the seed, less than its own errors do."""
    return 0.1 * (1 + index) + 0.01 * (1 + index / 4) * seed**2


def test_rows_pair_seeds_and_take_each_transformers_own_errors(monkeypatch):
    names = list(sklearn_gram_error.VARIANTS)
    seen = []

    def made_up(transformer, x, exact):
        options = getattr(transformer, "features", None), getattr(transformer, "coupling", None)
        name = names[0] if isinstance(transformer, RBFSampler) else "{}/{}".format(*options)
        seen.append((len(x), name, transformer.random_state))
        return _error(names.index(name), transformer.random_state)

    monkeypatch.setattr(sklearn_gram_error, "relative_error", made_up)
    rows = sklearn_gram_error.benchmark(30, 16, 3)
    assert seen == [(30, name, seed) for _ in range(2) for name in names for seed in range(3)]
    seeds = np.arange(3)
    reference = _error(0, seeds)
    for row in rows:
        errors = _error(names.index(row["transformer"]), seeds)
        assert row["mean"] == pytest.approx(errors.mean())
        assert row["se"] == pytest.approx(errors.std(ddof=1) / np.sqrt(3))
        assert row["ratio"] == pytest.approx(errors.mean() / reference.mean())
        difference = errors - reference
        assert row["paired_diff_se"] == pytest.approx(difference.std(ddof=1) / np.sqrt(3))
