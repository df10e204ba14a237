"""The estimator zoo's quick run: every row has its Monte Carlo MSE, the closed forms agree
within 4 SE, the fitted SADERF beats FAVOR+ (paired, beyond 4 SE), and the outputs exist."""

import csv
import os
import subprocess
import sys

import pytest

from configs import estimator_zoo as zoo_config
from experiments import estimator_zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_run_ranks_every_pair_and_agrees_with_the_closed_forms(tmp_path):
    workdir = tmp_path / "estimator_zoo"
    command = [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=configs/estimator_zoo.py:quick",
        f"--workdir={workdir}",
    ]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    for name in ("results.csv", "heatmap.png", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    with open(workdir / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    config = zoo_config.get_config("quick")
    assert len(rows) == len(config.feature_maps) * len(config.couplings)
    mses = [float(row["mse_mc"]) for row in rows]
    assert mses == sorted(mses)
    with_theory = [row for row in rows if row["mse_theory"] != "nan"]
    assert len(with_theory) >= 3
    for row in with_theory:
        assert abs(float(row["z_score"])) <= 4.0, row
    saderf = next(r for r in rows if (r["feature_map"], r["coupling"]) == ("saderf", "gaussian"))
    assert float(saderf["ratio_z"]) < -4.0, saderf


def test_config_validation_names_the_field():
    config = zoo_config.get_config("quick")
    config.feature_maps = ("fourier",)  # the Gaussian kernel's map: not in the softmax zoo
    with pytest.raises(ValueError, match="feature_maps"):
        estimator_zoo.validate_config(config)
    config = zoo_config.get_config("quick")
    config.cosines = (1.5,)
    with pytest.raises(ValueError, match="cosines"):
        estimator_zoo.validate_config(config)
