"""Tests of ``rfjax.linear_models._blocks``: ragged block iterators and memory-mapped files stream
to the in-memory result."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np

from rfjax.linear_models import (
    array_blocks,
    fit_random_feature_ridge,
    ridge_statistics,
)
from tests.support.ridge_data import data, transform64


def test_a_block_iterator_equals_the_in_memory_fit(float64):
    x, y = data(n=257)
    transform = transform64()
    whole = fit_random_feature_ridge(transform, [(x, y)], 0.1, block_rows=512, dtype=jnp.float64)
    # Ragged blocks (1, 7, 100, ...) re-cut into 32-row steps, one of them padded.
    cuts = [0, 1, 8, 108, 200, 257]
    ragged = ((x[a:b], y[a:b]) for a, b in itertools.pairwise(cuts))
    streamed = fit_random_feature_ridge(transform, ragged, 0.1, block_rows=32, dtype=jnp.float64)
    np.testing.assert_allclose(streamed.weights, whole.weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(streamed.intercept, whole.intercept, rtol=1e-9, atol=1e-12)


def test_a_memory_mapped_file_streams(float64, tmp_path):
    x, y = data(n=200)
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=x.dtype, shape=x.shape)
    mapped[:] = x
    mapped.flush()
    transform = transform64()
    reference = ridge_statistics(transform, [(x, y)], dtype=jnp.float64)
    streamed = ridge_statistics(
        transform,
        array_blocks(np.load(tmp_path / "x.npy", mmap_mode="r"), y, 48),
        dtype=jnp.float64,
    )
    np.testing.assert_allclose(streamed.gram, reference.gram, rtol=1e-12)
    assert int(streamed.count) == 200
