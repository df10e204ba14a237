"""Smoke tests of the experiments at their quick sizes, through the public entry point."""

import os
import subprocess
import sys

import pytest

from configs import kernel_mse as kernel_mse_config
from experiments.outputs import read_csv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_kernel_mse_quick_run_writes_results_that_agree_with_theory(tmp_path):
    workdir = tmp_path / "kernel_mse"
    command = [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=configs/kernel_mse.py:quick",
        f"--workdir={workdir}",
    ]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "max |z|" in completed.stdout
    for name in ("results.csv", "mse_ratio.png", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    rows = read_csv(workdir / "results.csv")
    config = kernel_mse_config.get_config("quick")
    assert len(rows) == len(config.norms_of_sum) * len(config.couplings)
    for row in rows:
        if row["coupling"] != "simplex_plus":  # no closed form for SimRF+
            assert abs(float(row["z_score"])) <= 4.0, row
    smallest_v = {
        row["coupling"]: float(row["mse_mc"])
        for row in rows
        if float(row["v"]) == min(config.norms_of_sum)
    }
    assert smallest_v["simplex"] < smallest_v["orthogonal"] < smallest_v["gaussian"]


def test_config_variants():
    full, quick = kernel_mse_config.get_config(), kernel_mse_config.get_config("quick")
    assert full.dim == 64
    assert quick.num_draws < full.num_draws
    with pytest.raises(ValueError, match="config variant"):
        kernel_mse_config.get_config("huge")
