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


@pytest.mark.integration
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


@pytest.mark.integration
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


def test_qmc_overall_verdict_needs_both_matchings_to_agree():
    config = qmc_config.get_config()
    config.datasets = ("wine",)

    def overall(projections_mse, width_mse):
        rows = [
            {"dataset": "wine", "matching": matching, "method": m, "mse": mse, "mse_se": 0.01}
            for matching, baseline in (("projections", projections_mse), ("width", width_mse))
            for m, mse in zip(config.methods, (1.0, 1.2, baseline, baseline, baseline), strict=True)
        ]
        return hrf_qmc.judge(rows, config).given["overall"]

    assert overall(1.5, 1.5).outcome == Outcome.HOLDS
    assert overall(0.5, 0.5).outcome == Outcome.DOES_NOT_HOLD
    # The sizing decides: the paper's claim is not tested without it.
    split = overall(1.5, 0.5)
    assert split.outcome == Outcome.NOT_TESTED
    assert "holds with the same projections" in split.evidence
    assert "does not hold with the same width" in split.evidence


def test_boston_is_read_from_the_shipped_csv():
    data = hrf_qmc.load_dataset("boston")
    assert data.shape == (506, 13) and data.dtype == np.float64
    np.testing.assert_array_equal(data[0, :3], [0.00632, 18.0, 2.31])  # CRIM, ZN, INDUS
    assert np.all(np.isfinite(data))
    with pytest.raises(ValueError, match="allowed"):
        hrf_qmc.load_dataset("iris")


def real_diagonal_losses(query_means, key_means):
    """L of Eq. 21 with the real diagonal A of Eq. 88 at the exact means, per pair."""
    parameters = features.cluster_hybrid_parameters(
        jnp.asarray(query_means), jnp.asarray(key_means), matrix="real", max_scale=100.0
    )
    return hrf_clustered.centre_losses(parameters)


@pytest.mark.parametrize("agreeing", [4, 6, 8, 12])
@pytest.mark.parametrize("product", [0.2, 0.6, 1.0])
def test_sign_pattern_means_set_the_angle_and_the_centre_loss(agreeing, product):
    query_means, key_means = hrf_clustered.sign_pattern_means(
        jax.random.key(3), 16, agreeing, product, 0.6
    )
    for means in (query_means, key_means):
        np.testing.assert_allclose(np.linalg.norm(means, axis=1), 0.6, rtol=1e-12)
        assert not np.allclose(means[0], means[1])  # two distinct clusters
    products = query_means[:, None] * key_means[None]  # (query, key, coordinate)
    np.testing.assert_array_equal((products > 0).sum(-1), agreeing)  # every pair
    np.testing.assert_allclose(np.abs(products), product * 0.36 / 16, rtol=1e-12)
    cosine = (2 * agreeing / 16 - 1) * product
    np.testing.assert_allclose(query_means @ key_means.T / 0.36, cosine, atol=1e-12)
    losses = real_diagonal_losses(query_means, key_means)
    np.testing.assert_allclose(losses, 4 * agreeing / 16 * product * 0.36, rtol=1e-5)


def test_generators_orthogonal_and_fixed_loss():
    config = clustered_config.get_config()
    for ratio in (0.2, 0.6):
        query_means, key_means = hrf_clustered.means(jax.random.key(1), "orthogonal", ratio, config)
        np.testing.assert_allclose(query_means @ key_means.T, 0.0, atol=1e-12)
        favor = np.sum((query_means[:, None] + key_means[None]) ** 2, axis=-1)
        losses = real_diagonal_losses(query_means, key_means)
        np.testing.assert_allclose(losses / favor, ratio, rtol=1e-5)
    cosines = []
    for _, generator, fraction, sigma in config.configurations:
        if generator != "fixed_loss" or sigma != 0.02:
            continue
        query_means, key_means = hrf_clustered.means(jax.random.key(2), generator, fraction, config)
        norm = config.centre_norms.fixed_loss
        losses = real_diagonal_losses(query_means, key_means)
        np.testing.assert_allclose(losses, config.fixed_loss * norm**2, rtol=1e-5)
        cosines.append(float(query_means[0] @ key_means[0]) / norm**2)
    assert cosines == sorted(cosines) and cosines[0] < -0.35 and cosines[-1] > 0.1


def test_paper_means_set_the_centre_loss_by_signs():
    # App. H.3 as commit b8822e7 built it: all key signs opposite to the query signs, L = 0.
    query_means, key_means = hrf_clustered.paper_means(jax.random.key(4), 16, 0.0, 1.0)
    np.testing.assert_allclose(np.linalg.norm(query_means, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(np.sign(query_means[0]), np.sign(query_means[1]))
    np.testing.assert_array_equal(np.sign(key_means), -np.sign(query_means))
    np.testing.assert_allclose(real_diagonal_losses(query_means, key_means), 0.0, atol=1e-6)
    assert np.all(query_means @ key_means.T < 0)  # the angle moves with L
    query_means, key_means = hrf_clustered.paper_means(jax.random.key(4), 16, 0.5, 1.0)
    assert np.all((query_means[:, None] * key_means[None] > 0).sum(-1) == 8)
    assert np.all(real_diagonal_losses(query_means, key_means) > 0.3)


def test_cluster_means_reject_bad_input():
    assert hrf_clustered.magnitude_ratio(1.0) == 1.0
    rho = hrf_clustered.magnitude_ratio(0.3)
    assert 2 * rho / (1 + rho**2) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="loss_ratio must be in"):
        hrf_clustered.magnitude_ratio(0.0)
    with pytest.raises(ValueError, match="agreeing must be in"):
        hrf_clustered.sign_pattern_means(jax.random.key(0), 16, 2, 0.5, 1.0)
    with pytest.raises(ValueError, match="agreeing_fraction must be in"):
        hrf_clustered.paper_means(jax.random.key(0), 16, 1.5, 1.0)
    config = clustered_config.get_config()
    with pytest.raises(ValueError, match="fraction k / d"):
        hrf_clustered.means(jax.random.key(0), "fixed_loss", 0.3, config)
    with pytest.raises(ValueError, match="needs an agreeing fraction"):
        hrf_clustered.means(jax.random.key(0), "fixed_loss", 2 / 16, config)
    bad = clustered_config.get_config("quick")
    with bad.unlocked():
        bad.configurations = (("x", "random", 0.5, 0.1),)
    with pytest.raises(ValueError, match="generator in"):
        hrf_clustered.validate_config(bad)


def test_paper_table_3_never_separates_cluster_hrf_from_both_baselines():
    # The target (max below both mins) read off the paper's own Table 3.
    assert hrf_clustered.paper_separated_rows() == (0, 28)
    assert hrf_clustered.paper_interval(0, "cluster_hrf", 20) == pytest.approx((0.0016, 0.0183))
    assert hrf_clustered.paper_interval(3, "trigonometric", 200) == pytest.approx((0.0015, 0.0067))


def test_clustered_verdict_is_one_test_per_cell_pooled_over_m():
    # Two configurations of one generator, two m: cluster-HRF wins everywhere except that in
    # the second configuration trig is better by ln 2 at one m and equal at the other; the
    # pooled cell (mean ln ratio -0.35) refutes the claim beyond the 10% margin.
    config = clustered_config.get_config()
    with config.unlocked():
        config.configurations = (("a", "paper", 0.0, 0.02), ("b", "paper", 0.5, 0.02))
        config.feature_counts = (20, 50)
    noise = np.random.default_rng(0).normal(0.0, 0.01, 20)
    cluster = np.exp(noise).tolist()

    def draw(name, m, trig_ratio):
        return {
            "configuration": name,
            "num_features": m,
            "cluster_hrf": cluster,
            "favor_plus": (2 * np.exp(-noise)).tolist(),
            "trigonometric": (trig_ratio * np.exp(noise[::-1])).tolist(),
        }

    draws = [draw("a", 20, 2.0), draw("a", 50, 2.0), draw("b", 20, 0.5), draw("b", 50, 1.0)]
    cells = hrf_clustered.pooled_log_ratios(draws, "b")
    assert cells["trig"].mean == pytest.approx(0.5 * math.log(0.5), abs=0.01)
    judged = hrf_clustered.judge({"draws": draws}, config).given
    assert judged["paper_generator"].outcome == Outcome.DOES_NOT_HOLD
    assert judged["orthogonal_generator"].outcome == Outcome.NOT_TESTED
    draws[3] = draw("b", 50, 4.0)  # now the pooled trig cell is +ln 2 / 2 > 0
    judged = hrf_clustered.judge({"draws": draws}, config).given
    assert judged["paper_generator"].outcome == Outcome.HOLDS


@pytest.mark.integration
def test_clustered_quick_run_geometry_and_verdicts(tmp_path):
    config = clustered_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    assert_files(tmp_path, ("results.csv", "configurations.csv", "mse_vs_m.png"))
    facts = {fact["configuration"]: fact for fact in result["facts"]}
    for name, generator, parameter, _ in config.configurations:
        fact = facts[name]
        if generator == "orthogonal":
            assert abs(fact["cosine_mean"]) < 1e-12  # the angle is fixed whatever L is
            assert fact["L_ratio"] == pytest.approx(parameter, abs=0.05)  # fitted centres
        if generator == "paper" and parameter == 0.0:
            assert fact["L_ratio"] < 0.01 and fact["cosine_max"] < 0  # L = 0 by signs
    # At orthogonal centres a smaller L needs unequal magnitudes: a larger noise gain.
    small, large = (facts[f"orthogonal: {size} L, small sigma"] for size in ("small", "large"))
    assert small["noise_gain"] > 2 * large["noise_gain"] > 2
    rows = read_csv(tmp_path / "results.csv")
    favor = [
        float(r["mse_mean"])
        for r in rows
        if r["estimator"] == "favor_plus"
        and int(r["num_features"]) == 20
        and r["generator"] == "orthogonal"
    ]
    assert all(0.02 < value < 0.2 for value in favor), favor  # the paper's range at m = 20
    assert len(result["configurations"]) == len(config.configurations)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary and "0 of its 28" in summary
    stored = verdicts.read(str(tmp_path))
    assert stored["separation"].outcome == Outcome.NOT_TESTED
    for name in ("paper_generator", "orthogonal_generator", "angle_sweep"):
        assert stored[name].outcome != Outcome.DOES_NOT_HOLD  # a quick variant


def test_hrf_config_variants():
    for module in (pointwise_config, qmc_config, clustered_config):
        full, quick = module.get_config(), module.get_config("quick")
        assert full.experiment == quick.experiment
        with pytest.raises(ValueError, match="config variant"):
            module.get_config("huge")
