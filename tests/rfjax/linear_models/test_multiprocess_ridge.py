"""The random-feature ridge fit on two processes (jax.distributed on localhost, gloo) equals one.

Each process passes only its own rows (process 0 the first 600, process 1 the other 400, so the
two stream different numbers of blocks); ``rfjax.linear_models.ridge_statistics`` sums each
process's statistics on its devices and adds them across processes with one ``psum``. The
weights every process solves for must equal those of one process fitted on all rows to 1e-6
(float64: the two runs differ only in the order of the float64 additions of the Gram sums).
"""

from __future__ import annotations

import concurrent.futures
import sys

import numpy as np
import pytest

from tests.support.multiprocess import run_processes

# Unoptimised CPU code compiles several times faster (as in test_multiprocess.py).
ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
from rfjax import features, projections
from rfjax.linear_models import RandomFeatureTransform, array_blocks, fit_random_feature_ridge

flags = dict(arg[2:].split("=", 1) for arg in sys.argv[1:])
jax.config.update("jax_enable_x64", True)
jax.distributed.initialize(
    flags["coordinator_address"], int(flags["num_processes"]), int(flags["process_id"])
)
rng = np.random.default_rng(0)
x = rng.normal(size=(1000, 6))
y = np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], axis=1)
if jax.process_count() == 2:
    rows = slice(0, 600) if jax.process_index() == 0 else slice(600, 1000)
    x, y = x[rows], y[rows]
transform = RandomFeatureTransform(
    projections.get("orthogonal")(jax.random.key(0), 6, 24, dtype=jnp.float64),
    features.get("positive")(), 2.0, "gaussian")
model = fit_random_feature_ridge(
    transform, array_blocks(x, y, 128), 0.1, block_rows=128, dtype=jnp.float64)
print("devices", jax.device_count(), "processes", jax.process_count())
np.save(flags["out"].format(jax.process_index()), np.concatenate([np.asarray(model.weights).ravel(),
                                      np.asarray(model.intercept)]))
"""


@pytest.mark.integration
def test_two_processes_fit_the_ridge_of_one(tmp_path):
    def run(processes):
        command = [sys.executable, "-c", SCRIPT, f"--out={tmp_path}/{processes}_{{}}.npy"]
        return run_processes(command, processes, env=ENV, timeout_s=300)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the two runs side by side
        runs = dict(zip((1, 2), pool.map(run, (1, 2)), strict=True))
    for processes, results in runs.items():
        for result in results:
            assert result.returncode == 0, (processes, result.process_id, result.stderr[-3000:])
            assert f"devices {processes} processes {processes}" in result.stdout
    single = np.load(tmp_path / "1_0.npy")
    for process in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"2_{process}.npy"), single, rtol=1e-6)
