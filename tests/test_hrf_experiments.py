"""Smoke tests of the HRF experiments at their quick sizes, run in-process (one JAX start-up)."""

import math

import numpy as np
import pytest

from configs import hrf_clustered as clustered_config
from configs import hrf_pointwise as pointwise_config
from configs import hrf_qmc as qmc_config
from experiments import hrf_qmc
from experiments.main import run_experiment
from experiments.outputs import read_csv


def assert_files(workdir, names):
    for name in (*names, "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name


def test_pointwise_quick_hybrid_is_exact_at_both_ends(tmp_path):
    config = pointwise_config.get_config("quick")
    run_experiment(config, str(tmp_path))
    assert_files(tmp_path, ("results.csv", "summary.csv", "relative_error.png"))
    rows = read_csv(tmp_path / "results.csv")
    assert len(rows) == len(config.radii) * config.num_angles * 4

    def error(radius, estimator, theta, column="rel_error_mc"):
        (row,) = [
            r
            for r in rows
            if float(r["radius"]) == radius
            and r["estimator"] == estimator
            and math.isclose(float(r["theta"]), theta, abs_tol=1e-12)
        ]
        return float(row[column])

    for radius in config.radii:
        for theta in (0.0, math.pi):
            # Zero variance at both ends (Theorem 3.5): only rounding is left (float64).
            assert error(radius, "angular_hybrid", theta) < 1e-6
            assert error(radius, "angular_hybrid", theta, "rel_error_theory") < 1e-12
        # Each base estimator is exact at one end only.
        assert error(radius, "trigonometric", math.pi) > 0.1
        assert error(radius, "positive", 0.0) > 0.1
        assert error(radius, "gaussian_hybrid", 0.0) > 0.1
    # The trig estimator is bounded, so its Monte Carlo error is reliable: within 5 SE.
    for row in rows:
        if row["estimator"] == "trigonometric" and float(row["rel_error_theory"]) > 0:
            z = (float(row["rel_error_mc"]) - float(row["rel_error_theory"])) / float(
                row["rel_error_se"]
            )
            assert abs(z) <= 5.0, row


def test_qmc_quick_table_is_complete(tmp_path):
    config = qmc_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    assert_files(tmp_path, ("results.csv", "mse.png"))
    rows = read_csv(tmp_path / "results.csv")
    assert len(rows) == len(config.datasets) * len(config.matchings) * len(config.methods)
    assert len(result["table"]) == len(config.datasets) * len(config.matchings)
    missing = {n.split(":")[0] for n in result["notes"]}
    for row in rows:
        if row["method"] not in missing:
            assert float(row["mse"]) > 0 and math.isfinite(float(row["mse"])), row
    for dataset in config.datasets:
        hybrid = [r for r in rows if r["dataset"] == dataset and r["method"] == "HRF-ort"]
        assert len({r["mse"] for r in hybrid}) == 1  # the hybrid does not depend on matching
        widths = {r["matching"]: int(r["width"]) for r in rows if r["dataset"] == dataset}
        assert widths["width"] == int(hybrid[0]["width"])


def test_boston_is_read_from_the_shipped_csv():
    data = hrf_qmc.load_dataset("boston")
    assert data.shape == (506, 13) and data.dtype == np.float64
    np.testing.assert_array_equal(data[0, :3], [0.00632, 18.0, 2.31])  # CRIM, ZN, INDUS
    assert np.all(np.isfinite(data))
    with pytest.raises(ValueError, match="allowed"):
        hrf_qmc.load_dataset("iris")


def test_clustered_quick_cluster_hrf_wins_on_concentrated_clusters(tmp_path):
    config = clustered_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    assert_files(tmp_path, ("results.csv", "mse_vs_m.png"))
    assert len(result["table"]) == len(config.configurations) * len(config.feature_counts)
    rows = read_csv(tmp_path / "results.csv")
    name = config.configurations[0][0]  # small L (exact at the centres), small sigma
    for m in config.feature_counts:
        mean = {
            r["estimator"]: float(r["mse_mean"])
            for r in rows
            if r["configuration"] == name and int(r["num_features"]) == m
        }
        assert mean["cluster_hrf"] < mean["favor_plus"] / 3, mean
        assert mean["cluster_hrf"] < mean["trigonometric"] / 3, mean
    assert max(result["losses"][name]) < 1e-2  # L of Eq. 21 ~ 0 at every pair of centres


def test_hrf_config_variants():
    for module in (pointwise_config, qmc_config, clustered_config):
        full, quick = module.get_config(), module.get_config("quick")
        assert full.experiment == quick.experiment
        with pytest.raises(ValueError, match="config variant"):
            module.get_config("huge")
