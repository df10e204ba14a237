"""``benchmarks.sequence_parallel`` compares the right programs: the one-device program runs on
one device (under ``jax.set_mesh`` it was replicated on all four, timing four copies of the
work), and rows of separate processes merge into one JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT


def run_benchmark(json_path: str, device_counts: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    command = [
        sys.executable, "-m", "benchmarks.sequence_parallel", "--lengths", "64",
        "--time-up-to", "64", "--repeats", "1", "--modes", "causal", "--passes", "forward",
        "--device-counts", device_counts, "--json", json_path,
    ]  # fmt: skip
    completed = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.integration
def test_one_device_program_runs_on_one_device_and_processes_merge(tmp_path):
    path = str(tmp_path / "rows.json")
    run_benchmark(path, "one")
    run_benchmark(path, "all")
    with open(path) as f:
        rows = json.load(f)["rows"]
    assert [(row["devices"], row["program_devices"]) for row in rows] == [(1, 1), (4, 4)]
    assert all(row["median_s"] > 0 and row["repeats"] == 1 for row in rows)
