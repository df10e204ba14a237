"""Tests of ``rfjax.features._clustering``: k-means, the cluster-adapted diagonals (Eq. 17, 85-87)
and rejected cluster parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from tests.support.hybrid_points import (
    DIM,
    KEY_MEANS,
    NUM_FEATURES,
    QUERY_MEANS,
    blobs,
    cluster_parameters,
    f32,
)


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


def test_assign_clusters_is_the_nearest_centre():
    rng = np.random.default_rng(4)
    points, centres = rng.normal(size=(50, DIM)), rng.normal(size=(5, DIM))
    distances = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
    labels = features.assign_clusters(f32(points), f32(centres))
    np.testing.assert_array_equal(labels, np.argmin(distances, axis=1))


def test_kmeans_plus_plus_seeds_one_centre_per_separated_cluster():
    # Without Lloyd steps the centres are the seeds: D(x)^2 sampling (distance to the nearest
    # centre so far) picks each far blob once; uniform sampling, or the distance to the
    # farthest centre, picks a covered blob again for some of these keys.
    means = 10.0 * np.array([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, -3.0, 1.0]])
    points = f32(blobs(means, 40, 5))
    keys = jax.random.split(jax.random.key(6), 16)
    seeds = jax.jit(jax.vmap(lambda k: features.kmeans(k, points, 3, num_iterations=0)))(keys)
    for centres in np.asarray(seeds):
        nearest_mean = np.argmin(((centres[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
        assert sorted(nearest_mean.tolist()) == [0, 1, 2]


@pytest.mark.parametrize("init", ["kmeans++", "random"])
def test_an_empty_cluster_keeps_its_centre(init):
    # Coinciding points: both centres start on them and the second cluster stays empty (ties go
    # to the lowest index); its centre must stay there, not move to the origin.
    points = jnp.broadcast_to(jnp.arange(1.0, DIM + 1.0), (3, DIM))
    centres = features.kmeans(jax.random.key(0), points, 2, num_iterations=2, init=init)
    np.testing.assert_array_equal(centres, points[:2])


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
    # Complex: only x y > 0 takes the imaginary root; the degenerate choices stay real.
    degenerate = features.cluster_adapted_diagonals(
        f32([[0.0, 0.0, 0.5, 1.0]]), f32([[0.0, 0.3, 0.0, 1.0]]), matrix="complex", max_scale=8.0
    )
    np.testing.assert_allclose(degenerate[0, 0], [1.0, 8.0, 1 / 8.0, 1j], rtol=1e-6)
    with pytest.raises(ValueError, match="max_scale must be > 1"):
        features.cluster_adapted_diagonals(f32(x), f32(y), max_scale=1.0)


@pytest.mark.parametrize("side", ["query", "key"])
def test_gaussian_mixture_leaves_the_rest_to_the_default_estimator(side):
    # The last two blocks are SM++ features and +-(sum_i g_i) times them (Def. H.1 as
    # reconstructed), g_i = e^(-|x - r_i|^2 / (2 tau^2)) over the side's own centres, divided
    # by max(1, sum_i g_i): rows near a centre (sum > 1) and far from all (sum < 1).
    params = cluster_parameters("complex")
    centres = params.query_centres if side == "query" else params.key_centres
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = jnp.stack([centres[0], centres[0] + 0.8])
    phi = features.cluster_hybrid_features(
        x, w, params, side=side, mixture="gaussian", bandwidth=0.5
    )
    default, scaled = phi[:, -4 * NUM_FEATURES : -2 * NUM_FEATURES], phi[:, -2 * NUM_FEATURES :]
    np.testing.assert_allclose(default, features.positive_features(x, w, antithetic=True))
    g = np.exp(-((np.asarray(x)[:, None] - np.asarray(centres)[None]) ** 2).sum(-1) / 0.5)
    total = g.sum(-1) / np.maximum(1.0, g.sum(-1))
    assert total[0] == 1.0 and total[1] < 0.5  # both cases
    sign = 1.0 if side == "query" else -1.0
    np.testing.assert_allclose(scaled, sign * total[:, None] * default, rtol=1e-5)


@pytest.mark.parametrize("matrix", ["real", "complex"])
def test_zero_one_features_fire_only_in_the_blocks_of_the_nearest_centres(matrix):
    # Def. H.2: a query nearest r_i has nonzero features only in the blocks (i, j) for all j, a
    # key nearest r'_j only in (i, j) for all i (each side by its own centres); every other
    # entry is exactly 0 (its log is far below any shift attention applies, not merely small).
    params = features.cluster_hybrid_parameters(f32(QUERY_MEANS), f32(KEY_MEANS), matrix=matrix)
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = f32(QUERY_MEANS + 0.01)  # nearest query centres 0, 1; nearest key centres 1, 0
    nearest = {
        side: np.argmin(((np.asarray(x)[:, None] - np.asarray(c)[None]) ** 2).sum(-1), axis=1)
        for side, c in (("query", params.query_centres), ("key", params.key_centres))
    }
    assert np.any(nearest["query"] != nearest["key"])  # the sides' centres must matter
    for side in features.SIDES:
        phi = features.cluster_hybrid_features(x, w, params, side=side)
        blocks = np.asarray(phi).reshape(len(x), 2, 2, -1)  # (row, i, j, width)
        for row, cluster in enumerate(nearest[side]):
            active = np.zeros((2, 2), bool)
            if side == "query":
                active[cluster, :] = True
            else:
                active[:, cluster] = True
            assert np.all(blocks[row][~active] == 0) and np.all(blocks[row][active] != 0)


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
    # k = n is allowed, and both seedings pick k distinct points: each point its own centre.
    three = jnp.arange(3.0 * DIM).reshape(3, DIM)
    for init in ("kmeans++", "random"):
        for key in jax.random.split(jax.random.key(0), 4):
            seeds = np.asarray(features.kmeans(key, three, 3, num_iterations=0, init=init))
            np.testing.assert_array_equal(seeds[np.argsort(seeds[:, 0])], three)
    with pytest.raises(ValueError, match="real diagonals"):
        features.cluster_hybrid_log_features(
            jnp.ones(DIM), w, cluster_parameters("complex"), side="query"
        )
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


def test_the_map_fits_and_scales_with_its_own_options():
    # num_iterations and max_scale reach the fit and the diagonals (not their defaults, 25 and
    # 10): the map is fit_cluster_hybrid and cluster_hybrid_log_features with them.
    queries, keys = (f32(blobs(m, 10, seed)) for m, seed in ((QUERY_MEANS, 2), (KEY_MEANS, 3)))
    fmap = features.ClusterHybridFeatureMap(num_iterations=0, max_scale=1.1)
    fmap = fmap.fit(jax.random.key(0), queries, keys)
    want = features.fit_cluster_hybrid(
        jax.random.key(0), queries, keys, 2, 2, num_iterations=0, max_scale=1.1
    )
    assert np.any(np.isclose(np.asarray(want.diagonals), 1.1))  # the bound is reached
    np.testing.assert_array_equal(fmap.query_centres, want.query_centres)
    np.testing.assert_array_equal(fmap.key_centres, want.key_centres)
    w = projections.gaussian(jax.random.key(1), DIM, NUM_FEATURES)
    for side, points in (("query", queries), ("key", keys)):
        np.testing.assert_array_equal(
            fmap.log_features(points, w, side=side),
            features.cluster_hybrid_log_features(points, w, want, side=side),
        )
