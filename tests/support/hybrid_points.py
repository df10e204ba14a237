"""Shared points of the tests of the hybrid feature maps and their parts (complex-exponential
features, clusters): pairs at given norms and angle in R^DIM, fixed well-conditioned matrices A,
and separated clusters of queries and keys with the cluster-hybrid parameters fitted to them."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features

DIM = 4


NUM_FEATURES = 8  # m: two blocks of d rows for the orthogonal coupling


def pair(norm_x: float, norm_y: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """x, y in R^DIM with the given norms and angle between them."""
    x = np.zeros(DIM)
    y = np.zeros(DIM)
    x[0] = norm_x
    y[0] = norm_y * math.cos(angle)
    y[1] = norm_y * math.sin(angle)
    return x, y


def f32(v: np.ndarray) -> jax.Array:
    return jnp.asarray(v, jnp.float32)


# A genuinely complex, well-conditioned matrix (fixed).
RNG = np.random.default_rng(7)


COMPLEX_A = (
    0.5 * (RNG.standard_normal((DIM, DIM)) + 1j * RNG.standard_normal((DIM, DIM))) / 2
    + 0.8 * np.eye(DIM)
).astype(np.complex64)


REAL_A = (0.4 * RNG.standard_normal((DIM, DIM)) + np.eye(DIM)).astype(np.float32)


QUERY_MEANS = np.array([[0.5, -0.4, 0.3, 0.2], [-0.4, 0.3, -0.5, 0.4]])


KEY_MEANS = np.array([[-0.3, 0.5, 0.4, -0.2], [0.4, 0.4, -0.3, -0.5]])


CLUSTER_SPREAD = 0.05


def blobs(means: np.ndarray, per_cluster: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [m + CLUSTER_SPREAD * rng.standard_normal((per_cluster, DIM)) for m in means]
    )


@functools.cache
def cluster_parameters(matrix: str) -> features.ClusterHybridParameters:
    return features.fit_cluster_hybrid(
        jax.random.key(11),
        f32(blobs(QUERY_MEANS, 60, 0)),
        f32(blobs(KEY_MEANS, 50, 1)),
        2,
        2,
        matrix=matrix,
    )
