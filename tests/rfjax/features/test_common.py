"""Tests of ``rfjax.features._common``: the kernel estimate from two feature arrays."""

import jax
import numpy as np
import pytest

from rfjax import features


def test_estimate():
    a = jax.random.normal(jax.random.key(0), (3, 8))
    b = jax.random.normal(jax.random.key(1), (3, 8))
    np.testing.assert_allclose(
        features.estimate(a, b), np.sum(np.asarray(a) * np.asarray(b), -1), rtol=1e-6
    )
    np.testing.assert_allclose(features.estimate(a[:, None], b[None]), a @ b.T, rtol=1e-5)

    with pytest.raises(ValueError, match="batch axes of features_x and features_y must"):
        features.estimate(a, b[:2])  # (3, 8) and (2, 8): a TypeError from jnp before
