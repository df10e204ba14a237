"""Smoke tests of the HRF experiments at their quick sizes, run in-process (one JAX start-up)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import hrf_clustered as clustered_config
from configs import hrf_pointwise as pointwise_config
from configs import hrf_qmc as qmc_config
from experiments import hrf_clustered, hrf_qmc
from experiments.core import verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from rfjax import features


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
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    # The exactness at both ends is a computed verdict (float64 rounding only).
    assert "Theorem 3.5" in summary and "exact counts as below 1e-06" in summary
    stored = verdicts.read(str(tmp_path))
    assert stored["exact_ends"].outcome == Outcome.HOLDS
    assert set(stored) == set(config.claims)


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
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claim, our numbers, verdict" in summary
    assert len(result["comparisons"]) == len(config.datasets) * len(config.matchings)
    for verdict in verdicts.read(str(tmp_path)).values():
        assert verdict.sentence() in summary
    for dataset in config.datasets:
        hybrid = [r for r in rows if r["dataset"] == dataset and r["method"] == "HRF-ort"]
        assert len({r["mse"] for r in hybrid}) == 1  # the hybrid does not depend on matching
        widths = {r["matching"]: int(r["width"]) for r in rows if r["dataset"] == dataset}
        assert widths["width"] == int(hybrid[0]["width"])


def test_qmc_verdict_is_one_pooled_test_refuted_only_beyond_its_margin():
    config = qmc_config.get_config()
    config.datasets, config.matchings = ("wine",), ("projections",)

    def outcome(baseline_mse):
        rows = [
            {"dataset": "wine", "matching": "projections", "method": m, "mse": mse, "mse_se": 0.01}
            for m, mse in zip(config.methods, (1.0, 1.2, *baseline_mse), strict=True)
        ]
        judged = hrf_qmc.judge(rows, config).given
        assert judged["width_matched"].outcome == Outcome.NOT_TESTED  # not run
        return judged["projections_matched"].outcome

    assert outcome((1.1, 1.1, 1.1)) == Outcome.HOLDS  # 7 SE, pooled
    # One baseline 2.1 SE above, the others 7 SE: the pooled gap is resolved.
    assert outcome((1.1, 1.03, 1.1)) == Outcome.HOLDS
    # Every baseline 20% below HRF: against the claim beyond its 10% margin.
    assert outcome((0.8, 0.8, 0.8)) == Outcome.DOES_NOT_HOLD
    assert outcome((0.95, 0.95, 0.95)) == Outcome.NOT_RESOLVED  # within the margin


def test_boston_is_read_from_the_shipped_csv():
    data = hrf_qmc.load_dataset("boston")
    assert data.shape == (506, 13) and data.dtype == np.float64
    np.testing.assert_array_equal(data[0, :3], [0.00632, 18.0, 2.31])  # CRIM, ZN, INDUS
    assert np.all(np.isfinite(data))
    with pytest.raises(ValueError, match="allowed"):
        hrf_qmc.load_dataset("iris")


@pytest.mark.parametrize("loss_ratio", [0.1, 0.2, 0.6, 1.0])
def test_cluster_means_fix_the_angle_and_set_the_centre_loss(loss_ratio):
    query_means, key_means = hrf_clustered.cluster_means(jax.random.key(3), 16, loss_ratio, 0.6)
    np.testing.assert_allclose(np.linalg.norm(query_means, axis=1), 0.6, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(key_means, axis=1), 0.6, rtol=1e-12)
    np.testing.assert_allclose(query_means @ key_means.T, 0.0, atol=1e-12)  # orthogonal pairs
    assert not np.allclose(query_means[0], query_means[1])  # two distinct query clusters
    # L of Eq. 21 with the real diagonal A of Eq. 88 at the exact means, against FAVOR+'s.
    parameters = features.cluster_hybrid_parameters(
        jnp.asarray(query_means), jnp.asarray(key_means), matrix="real", max_scale=100.0
    )
    losses = hrf_clustered.centre_losses(parameters)
    favor = np.sum((query_means[:, None] + key_means[None]) ** 2, axis=-1)
    np.testing.assert_allclose(losses / favor, loss_ratio, rtol=1e-5)


def test_cluster_means_and_magnitude_ratio_reject_bad_input():
    assert hrf_clustered.magnitude_ratio(1.0) == 1.0
    rho = hrf_clustered.magnitude_ratio(0.3)
    assert 2 * rho / (1 + rho**2) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="loss_ratio must be in"):
        hrf_clustered.magnitude_ratio(0.0)
    with pytest.raises(ValueError, match="dim must be a power of two >= 8"):
        hrf_clustered.cluster_means(jax.random.key(0), 12, 0.5, 1.0)


def test_paper_table_3_never_separates_cluster_hrf_from_both_baselines():
    # The target (max below both mins) read off the paper's own Table 3.
    assert hrf_clustered.paper_separated_rows() == (0, 28)
    assert hrf_clustered.paper_interval(0, "cluster_hrf", 20) == pytest.approx((0.0016, 0.0183))
    assert hrf_clustered.paper_interval(3, "trigonometric", 200) == pytest.approx((0.0015, 0.0067))


def test_clustered_quick_run_geometry_and_verdicts(tmp_path):
    config = clustered_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    assert_files(tmp_path, ("results.csv", "configurations.csv", "mse_vs_m.png"))
    assert len(result["table"]) == len(config.configurations) * len(config.feature_counts)
    facts = {fact["configuration"]: fact for fact in result["facts"]}
    for name, loss_ratio, _ in config.configurations:
        fact = facts[name]
        assert fact["max_abs_cosine"] < 1e-12  # the angle is fixed whatever L is
        assert fact["L_ratio"] == pytest.approx(loss_ratio, abs=0.05)  # fitted centres
    # A smaller L needs unequal magnitudes, which amplify the noise around the centres.
    small, large = (facts[c[0]] for c in config.configurations[::2][:2])
    assert small["noise_gain"] > 2 * large["noise_gain"] > 2
    rows = read_csv(tmp_path / "results.csv")
    favor = [
        float(r["mse_mean"])
        for r in rows
        if r["estimator"] == "favor_plus" and int(r["num_features"]) == 20
    ]
    assert all(0.02 < value < 0.2 for value in favor), favor  # the paper's range at m = 20
    assert len(result["configurations"]) == len(config.configurations)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary and "0 of its 28" in summary
    stored = verdicts.read(str(tmp_path))
    assert stored["separation"].outcome == Outcome.NOT_TESTED
    assert stored["most_accurate"].outcome != Outcome.DOES_NOT_HOLD  # a quick variant


def test_hrf_config_variants():
    for module in (pointwise_config, qmc_config, clustered_config):
        full, quick = module.get_config(), module.get_config("quick")
        assert full.experiment == quick.experiment
        with pytest.raises(ValueError, match="config variant"):
            module.get_config("huge")
