"""Shared data and transform of the tests of ``rfjax.linear_models``: a small regression problem
and a float64 random-feature transform (call it under ``jax.enable_x64``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureTransform,
)


def data(n=300, d=5, t=2, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(dtype)
    y = np.stack([np.sin(x[:, 0]) + 0.1 * rng.normal(size=n), x[:, 1] ** 2], axis=1)[:, :t]
    return x, y.astype(dtype)


def transform64(coupling="orthogonal", feature_map="positive", kernel="gaussian", d=5, m=16):
    projection = projections.get(coupling)(jax.random.key(1), d, m, dtype=jnp.float64)
    return RandomFeatureTransform(projection, features.get(feature_map)(), 1.5, kernel)
