"""Tests of ``rfjax.linear_models._statistics``: float32 sufficient statistics against float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureTransform,
    array_blocks,
    ridge_statistics,
)
from tests.support.ridge_data import data, transform64


def test_float32_statistics_are_close_to_float64(float64):
    x, y = data()
    transform = transform64()
    exact = ridge_statistics(transform, array_blocks(x, y), dtype=jnp.float64)
    single = ridge_statistics(transform, array_blocks(x, y), dtype=jnp.float32)
    assert single.gram.dtype == jnp.float32
    # 300 non-negative terms summed in float32: relative error <= 300 * 2^-24 (Higham, Eq. 4.4).
    np.testing.assert_allclose(single.gram, exact.gram, rtol=300 * 2.0**-24)


def _transform32():
    projection = projections.get("orthogonal")(jax.random.key(1), 5, 16, dtype=jnp.float32)
    return RandomFeatureTransform(projection, features.get("positive")(), 1.5, "gaussian")


def test_targets_are_summed_in_the_statistics_dtype(float64):
    """A float32 transform with float64 statistics: y stays float64 (it was cast to the
    transform's float32, and Y^T 1 of 1e8 + k lost its units: 5000001224 for 5000001225)."""
    x, _ = data(n=50)
    y = 1e8 + np.arange(50.0)
    statistics = ridge_statistics(_transform32(), array_blocks(x, y), dtype=jnp.float64)
    assert float(statistics.target_sum[0]) == y.sum()


@pytest.mark.parametrize("name", ["x", "y"])
def test_values_beyond_the_dtype_raise_naming_them(float64, name):
    """Finite float64 values beyond float32's range became infinite in the cast: NaN statistics
    and, from solve_ridge, a positive-definiteness error blaming the sums' precision."""
    x, y = data(n=50, t=1)
    (x if name == "x" else y)[3, 0] = 1e39
    with pytest.raises(ValueError, match=rf"{name} of block 0 holds values up to .* float32"):
        ridge_statistics(_transform32(), array_blocks(x, y), dtype=jnp.float32)


def test_a_gram_matrix_over_the_cap_is_refused_before_compiling():
    """A transform of 2^15 features asks for a 4 GiB Gram matrix in float32: refused, naming
    the width, before any block is featurised (XLA's CPU runtime aborts the interpreter on an
    allocation it cannot make)."""
    projection = projections.get("gaussian")(jax.random.key(1), 5, 2**15, dtype=jnp.float32)
    transform = RandomFeatureTransform(projection, features.get("positive")(), 1.5, "gaussian")
    x, y = data(n=8)
    with pytest.raises(ValueError, match=r"transform.width=32768 implies Phi\^T Phi"):
        ridge_statistics(transform, array_blocks(x, y))
