"""Tests for ``rfjax.linear_models``: streaming random-feature ridge regression."""

from __future__ import annotations

import itertools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureRidgeModel,
    RandomFeatureTransform,
    _model,
    array_blocks,
    fit_random_feature_ridge,
    native_kernel,
    ridge_statistics,
    solve_ridge,
    solve_ridge_path,
)
from tests.support.multiprocess import ROOT, cpu_environment


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _data(n=300, d=5, t=2, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(dtype)
    y = np.stack([np.sin(x[:, 0]) + 0.1 * rng.normal(size=n), x[:, 1] ** 2], axis=1)[:, :t]
    return x, y.astype(dtype)


def _transform64(coupling="orthogonal", feature_map="positive", kernel="gaussian", d=5, m=16):
    projection = projections.get(coupling)(jax.random.key(1), d, m, dtype=jnp.float64)
    return RandomFeatureTransform(projection, features.get(feature_map)(), 1.5, kernel)


def _closed_form(phi, y, alpha, fit_intercept):
    """Ridge on the explicit feature matrix, as textbook: [Phi 1] with an unpenalised 1."""
    if fit_intercept:
        design = np.concatenate([phi, np.ones((phi.shape[0], 1))], axis=1)
        penalty = alpha * np.diag(np.r_[np.ones(phi.shape[1]), 0.0])
    else:
        design, penalty = phi, alpha * np.eye(phi.shape[1])
    solution = np.linalg.solve(design.T @ design + penalty, design.T @ y)
    if fit_intercept:
        return solution[:-1], solution[-1]
    return solution, np.zeros(y.shape[1])


@pytest.mark.parametrize(
    "coupling,feature_map,kernel,fit_intercept",
    [
        ("orthogonal", "fourier", "gaussian", True),
        ("simplex", "positive_antithetic", "softmax", False),
        ("gaussian", "positive", "gaussian", True),
    ],
)
def test_equals_closed_form_ridge_on_the_feature_matrix(
    x64, coupling, feature_map, kernel, fit_intercept
):
    x, y = _data()
    transform = _transform64(coupling, feature_map, kernel)
    phi = np.asarray(transform(jnp.asarray(x)))
    model = fit_random_feature_ridge(
        transform, array_blocks(x, y, 64), 0.3, fit_intercept=fit_intercept, dtype=jnp.float64
    )
    weights, intercept = _closed_form(phi, y, 0.3, fit_intercept)
    np.testing.assert_allclose(model.weights, weights, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.intercept, intercept, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.predict(x), phi @ weights + intercept, rtol=1e-8, atol=1e-8)


def test_the_path_equals_one_solve_per_alpha(x64):
    x, y = _data()
    statistics = ridge_statistics(_transform64(), array_blocks(x, y), dtype=jnp.float64)
    alphas = [1e-3, 0.1, 10.0]
    path_weights, path_intercepts = solve_ridge_path(statistics, alphas)
    for index, alpha in enumerate(alphas):
        weights, intercept = solve_ridge(statistics, alpha)
        np.testing.assert_allclose(path_weights[index], weights, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(path_intercepts[index], intercept, rtol=1e-7, atol=1e-9)


def test_a_block_iterator_equals_the_in_memory_fit(x64):
    x, y = _data(n=257)
    transform = _transform64()
    whole = fit_random_feature_ridge(transform, [(x, y)], 0.1, block_rows=512, dtype=jnp.float64)
    # Ragged blocks (1, 7, 100, ...) re-cut into 32-row steps, one of them padded.
    cuts = [0, 1, 8, 108, 200, 257]
    ragged = ((x[a:b], y[a:b]) for a, b in itertools.pairwise(cuts))
    streamed = fit_random_feature_ridge(transform, ragged, 0.1, block_rows=32, dtype=jnp.float64)
    np.testing.assert_allclose(streamed.weights, whole.weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(streamed.intercept, whole.intercept, rtol=1e-9, atol=1e-12)


def test_a_memory_mapped_file_streams(x64, tmp_path):
    x, y = _data(n=200)
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=x.dtype, shape=x.shape)
    mapped[:] = x
    mapped.flush()
    transform = _transform64()
    reference = ridge_statistics(transform, [(x, y)], dtype=jnp.float64)
    streamed = ridge_statistics(
        transform,
        array_blocks(np.load(tmp_path / "x.npy", mmap_mode="r"), y, 48),
        dtype=jnp.float64,
    )
    np.testing.assert_allclose(streamed.gram, reference.gram, rtol=1e-12)
    assert int(streamed.count) == 200


def test_float32_statistics_are_close_to_float64(x64):
    x, y = _data()
    transform = _transform64()
    exact = ridge_statistics(transform, array_blocks(x, y), dtype=jnp.float64)
    single = ridge_statistics(transform, array_blocks(x, y), dtype=jnp.float32)
    assert single.gram.dtype == jnp.float32
    # 300 non-negative terms summed in float32: relative error <= 300 * 2^-24 (Higham, Eq. 4.4).
    np.testing.assert_allclose(single.gram, exact.gram, rtol=300 * 2.0**-24)


def test_the_model_is_a_pytree_with_its_projection():
    x, y = _data(dtype=np.float32)
    transform = RandomFeatureTransform(
        projections.get("gaussian")(jax.random.key(0), 5, 8), features.get("positive")()
    )
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0)
    leaves, treedef = jax.tree.flatten(model)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert isinstance(rebuilt, RandomFeatureRidgeModel)
    for projection_leaf in jax.tree.leaves(transform.projection):
        assert any(leaf is projection_leaf for leaf in leaves)
    np.testing.assert_array_equal(rebuilt.predict(x), model.predict(x))


def test_predict_streams_blocks_and_a_new_row_count_compiles_nothing():
    """predict equals the one-piece model on every row; counts of at least block_rows rows use
    one program whatever the count, fewer rows a power-of-two bucket (each compiled once), and
    leading axes and a traced input work as before."""
    x, y = _data(n=700, dtype=np.float32)
    transform = RandomFeatureTransform(
        projections.get("orthogonal")(jax.random.key(0), 5, 16),
        features.get("fourier")(),
        kernel="gaussian",
    )
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0)
    whole = np.asarray(_model._predict(model, jnp.asarray(x)))
    np.testing.assert_allclose(np.asarray(model.predict(x, block_rows=256)), whole, atol=1e-6)
    compiled = _model._predict._cache_size()
    for count in (699, 611, 256, 300):  # >= block_rows: the 256-row program alone
        np.testing.assert_allclose(
            np.asarray(model.predict(x[:count], block_rows=256)), whole[:count], atol=1e-6
        )
    assert _model._predict._cache_size() == compiled
    assert [_model.bucket_rows(n, 4096) for n in (1, 256, 257, 4095, 4096, 10**6)] == [
        256,
        256,
        512,
        4096,
        4096,
        4096,
    ]
    np.testing.assert_allclose(np.asarray(model.predict(x[:3])), whole[:3], atol=1e-6)
    assert model.predict(x.reshape(7, 100, 5)).shape == (7, 100, 2)
    traced = jax.jit(lambda m, v: m.predict(v))(model, x[:9])
    np.testing.assert_allclose(np.asarray(traced), whole[:9], atol=1e-6)
    with pytest.raises(TypeError, match="x must be a floating array"):
        model.predict(np.zeros((3, 5), np.int32))
    with pytest.raises(ValueError, match="last axis of size dim=5"):
        model.predict(np.zeros((3, 4), np.float32))


def test_native_kernel():
    assert native_kernel(features.get("fourier")()) == "gaussian"
    assert native_kernel(features.get("positive_antithetic")()) == "softmax"
    with pytest.raises(ValueError, match="not a registered map"):
        native_kernel(features.get("relu")())


def test_errors():
    projection = projections.get("gaussian")(jax.random.key(0), 3, 4)
    transform = RandomFeatureTransform(projection, features.get("positive")())
    x, y = np.zeros((4, 3), np.float32), np.zeros(4)
    with pytest.raises(ValueError, match="symmetric"):
        RandomFeatureTransform(projection, features.get("angular_hybrid")())
    with pytest.raises(ValueError, match="kernel='softmax' needs a softmax-kernel"):
        RandomFeatureTransform(projection, features.get("fourier")(), kernel="softmax")
    with pytest.raises(ValueError, match="lengthscale"):
        RandomFeatureTransform(projection, features.get("positive")(), lengthscale=0.0)
    with pytest.raises(TypeError, match="projection"):
        RandomFeatureTransform(np.zeros((4, 3)), features.get("positive")())
    with pytest.raises(TypeError, match="transform must be a Featurizer"):
        ridge_statistics(projection, [(x, y)])
    with pytest.raises(TypeError, match="x of block 0 must be a floating array"):
        ridge_statistics(transform, [(x.astype(np.int32), y)])
    with pytest.raises(ValueError, match="x of block 1 holds NaN"):
        ridge_statistics(transform, [(x, y), (np.full((2, 3), np.nan, np.float32), y[:2])])
    with pytest.raises(ValueError, match="block 1 has x of shape"):
        ridge_statistics(transform, [(x, y), (x, np.zeros((4, 2)))])
    with pytest.raises(ValueError, match="3 columns"):
        ridge_statistics(transform, [(np.zeros((4, 2), np.float32), y)])
    with pytest.raises(ValueError, match="at least one row"):
        ridge_statistics(transform, [])
    with pytest.raises(ValueError, match="same number of rows"):
        array_blocks(x, y[:3])
    with pytest.raises(ValueError, match="axis_name"):
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        ridge_statistics(transform, [(x, y)], mesh=mesh, axis_name="rows")
    with pytest.raises(TypeError, match="block_rows"):
        ridge_statistics(transform, [(x, y)], block_rows=2.5)
    with pytest.raises(ValueError, match="float32 or float64"):
        ridge_statistics(transform, [(x, y)], dtype=jnp.bfloat16)
    if not jax.config.jax_enable_x64:
        with pytest.raises(ValueError, match="jax_enable_x64"):
            ridge_statistics(transform, [(x, y)], dtype=jnp.float64)
    statistics = ridge_statistics(transform, [(x, y)])
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        solve_ridge(statistics, -1.0)
    with pytest.raises(ValueError, match="not numerically positive definite"):
        solve_ridge(statistics, 0.0)  # four equal rows: rank 0 after centring
    with pytest.raises(ValueError, match="alphas must be a non-empty"):
        solve_ridge_path(statistics, [])
    with pytest.raises(ValueError, match=r"alphas \[0.0\]"):
        solve_ridge_path(statistics, [0.0, 1.0])
    with pytest.raises(TypeError, match="fit_intercept"):
        solve_ridge(statistics, 1.0, fit_intercept=1)


_SHARDED_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from rfjax import features, projections
from rfjax.linear_models import RandomFeatureTransform, array_blocks, ridge_statistics

jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 4
rng = np.random.default_rng(0)
x, y = rng.normal(size=(1000, 6)), rng.normal(size=(1000, 3))
transform = RandomFeatureTransform(
    projections.get("simplex")(jax.random.key(0), 6, 32, dtype=jnp.float64),
    features.get("positive")(), 2.0, "gaussian")
phi = np.asarray(transform(jnp.asarray(x)))  # on one device
four = ridge_statistics(transform, array_blocks(x, y, 100), dtype=jnp.float64)
# 2 x 2 mesh: rows over "data", replicas over "model".
grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
two_by_two = ridge_statistics(transform, array_blocks(x, y, 100), dtype=jnp.float64, mesh=grid)
assert len(four.gram.sharding.device_set) == 4 and four.gram.sharding.is_fully_replicated
for stats in (four, two_by_two):
    assert int(stats.count) == 1000
    sums = {"gram": phi.T @ phi, "cross": phi.T @ y}
    sums.update(feature_sum=phi.sum(0), target_sum=y.sum(0))
    for name, expected in sums.items():
        np.testing.assert_allclose(getattr(stats, name), expected, rtol=1e-12, atol=1e-12)
print("OK")
"""


def test_sharded_over_four_devices_equals_one_device():
    # 4 forced CPU devices; unoptimised CPU code compiles several times faster.
    flags = "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
    result = subprocess.run(
        [sys.executable, "-c", _SHARDED_SCRIPT],
        cwd=ROOT,
        env=cpu_environment({"XLA_FLAGS": flags}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
