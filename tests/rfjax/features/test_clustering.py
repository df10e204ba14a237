"""Tests of ``rfjax.features._clustering``: k-means, the cluster-adapted diagonals (Eq. 17, 85-87)
and rejected cluster parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from tests.support.hybrid_points import DIM, NUM_FEATURES, blobs, cluster_parameters, f32


def test_kmeans_recovers_separated_clusters():
    means = np.array([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, -3.0, 1.0]])
    points = blobs(means, 40, 5)
    blob_means = points.reshape(3, 40, DIM).mean(axis=1)
    keys = jax.random.split(jax.random.key(2), 3)
    centres = jax.jit(jax.vmap(lambda k: features.kmeans(k, f32(points), 3)))(keys)
    for c in np.asarray(centres):
        order = np.argmin(((c[:, None, :] - blob_means[None]) ** 2).sum(-1), axis=1)
        assert sorted(order.tolist()) == [0, 1, 2]
        np.testing.assert_allclose(c, blob_means[order], atol=1e-5)
    labels = features.assign_clusters(f32(points), centres[0])
    labels = np.asarray(labels).reshape(3, 40)
    assert np.all(labels == labels[:, :1]) and len(set(labels[:, 0].tolist())) == 3
    random_init = features.kmeans(jax.random.key(3), f32(points), 3, init="random")
    assert random_init.shape == (3, DIM)


def test_cluster_adapted_diagonals_closed_forms():
    x = np.array([[0.7, -0.4, 0.3, 0.5]])
    y = np.array([[0.2, 0.6, 0.9, -0.1]])
    alpha = np.asarray(features.cluster_adapted_diagonals(f32(x), f32(y), matrix="complex"))[0, 0]
    np.testing.assert_allclose(alpha * x[0] + y[0] / alpha, 0.0, atol=1e-6)  # Eq. 17, 85-87
    real = np.asarray(features.cluster_adapted_diagonals(f32(x), f32(y)))[0, 0]
    loss = np.sum((real * x[0] + y[0] / real) ** 2)
    np.testing.assert_allclose(loss, 4 * np.sum(np.clip(x[0] * y[0], 0, None)), rtol=1e-5)
    # Degenerate coordinates: x = y = 0 -> 1, x = 0 != y -> max_scale, y = 0 != x -> 1/max_scale.
    degenerate = features.cluster_adapted_diagonals(
        f32([[0.0, 0.0, 0.5, 1.0]]), f32([[0.0, 0.3, 0.0, 1.0]]), max_scale=8.0
    )
    np.testing.assert_allclose(degenerate[0, 0], [1.0, 8.0, 1 / 8.0, 1.0], rtol=1e-6)


def test_mismatched_clusters_are_rejected():
    params = cluster_parameters("real")
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    bad = features.ClusterHybridParameters(
        params.query_centres, jnp.concatenate([params.key_centres] * 2), params.diagonals
    )
    with pytest.raises(ValueError, match="numbers of query and key clusters"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, bad, side="query")
    zero = features.ClusterHybridParameters(
        params.query_centres, params.key_centres, params.diagonals.at[0, 1, 2].set(0.0)
    )
    with pytest.raises(ValueError, match="invertible"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, zero, side="key")
    with pytest.raises(ValueError, match="num_clusters"):
        features.kmeans(jax.random.key(0), jnp.ones((3, DIM)), 4)
    with pytest.raises(ValueError, match="num_clusters"):
        features.kmeans(jax.random.key(0), jnp.ones((3, DIM)), 0)
    with pytest.raises(ValueError, match="same d"):
        features.fit_cluster_hybrid(jax.random.key(0), jnp.ones((5, DIM)), jnp.ones((5, 3)), 2, 2)
    with pytest.raises(ValueError, match="bandwidth"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, params, side="query", mixture="gaussian")
    with pytest.raises(ValueError, match="bandwidth"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, params, side="query", bandwidth=1.0)


def test_init_keeps_the_centres_that_are_set():
    """Given only the query centres, ``init`` replaced them with zeros too."""
    centres = jnp.arange(6.0).reshape(2, 3)
    fmap = features.ClusterHybridFeatureMap(query_centres=centres).init(jax.random.key(0), 3)
    np.testing.assert_array_equal(fmap.query_centres, centres)
    np.testing.assert_array_equal(fmap.key_centres, np.zeros((2, 3)))
    fmap = features.ClusterHybridFeatureMap(key_centres=centres).init(jax.random.key(0), 3)
    np.testing.assert_array_equal(fmap.key_centres, centres)
    np.testing.assert_array_equal(fmap.query_centres, np.zeros((2, 3)))
