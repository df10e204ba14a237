"""Tests of ``rfjax.features._common``: the kernel estimate from two feature arrays."""

import jax
import numpy as np

from rfjax import features


def test_estimate():
    a = jax.random.normal(jax.random.key(0), (3, 8))
    b = jax.random.normal(jax.random.key(1), (3, 8))
    np.testing.assert_allclose(
        features.estimate(a, b), np.sum(np.asarray(a) * np.asarray(b), -1), rtol=1e-6
    )
    np.testing.assert_allclose(features.estimate(a[:, None], b[None]), a @ b.T, rtol=1e-5)
