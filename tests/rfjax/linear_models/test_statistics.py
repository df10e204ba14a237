"""Tests of ``rfjax.linear_models._statistics``: float32 sufficient statistics against float64."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from rfjax.linear_models import (
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
