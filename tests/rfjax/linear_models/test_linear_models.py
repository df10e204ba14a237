"""Tests across ``rfjax.linear_models`` (streaming random-feature ridge regression): argument
checks of every entry point and a fit sharded over four devices. Each module's own tests are in
the file named for it (``test_model.py``, ``test_solve.py``, ...)."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureTransform,
    array_blocks,
    ridge_statistics,
    solve_ridge,
    solve_ridge_path,
)
from tests.support.multiprocess import ROOT, cpu_environment


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


@pytest.mark.integration
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
