"""The clustered HRF study (hrf_clustered): cluster means and losses, its verdicts, its quick
run."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import hrf_clustered as clustered_config
from experiments import hrf_clustered
from experiments.core import verdicts
from experiments.core.verdicts import Outcome
from experiments.hrf_clustered import data as clustered_data
from experiments.hrf_clustered import reporting as clustered_report
from experiments.main import run_experiment
from rfjax import features


def real_diagonal_losses(query_means, key_means):
    """L of Eq. 21 with the real diagonal A of Eq. 88 at the exact means, per pair."""
    parameters = features.cluster_hybrid_parameters(
        jnp.asarray(query_means), jnp.asarray(key_means), matrix="real", max_scale=100.0
    )
    return clustered_data.centre_losses(parameters)


@pytest.mark.parametrize("agreeing", [4, 6, 8, 12])
@pytest.mark.parametrize("product", [0.2, 0.6, 1.0])
def test_sign_pattern_means_set_the_angle_and_the_centre_loss(agreeing, product):
    query_means, key_means = clustered_data.sign_pattern_means(
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
        query_means, key_means = clustered_data.means(
            jax.random.key(1), "orthogonal", ratio, config
        )
        np.testing.assert_allclose(query_means @ key_means.T, 0.0, atol=1e-12)
        favor = np.sum((query_means[:, None] + key_means[None]) ** 2, axis=-1)
        losses = real_diagonal_losses(query_means, key_means)
        np.testing.assert_allclose(losses / favor, ratio, rtol=1e-5)
    cosines = []
    for _, generator, fraction, sigma in config.configurations:
        if generator != "fixed_loss" or sigma != 0.02:
            continue
        query_means, key_means = clustered_data.means(
            jax.random.key(2), generator, fraction, config
        )
        norm = config.centre_norms.fixed_loss
        losses = real_diagonal_losses(query_means, key_means)
        np.testing.assert_allclose(losses, config.fixed_loss * norm**2, rtol=1e-5)
        cosines.append(float(query_means[0] @ key_means[0]) / norm**2)
    assert cosines == sorted(cosines) and cosines[0] < -0.35 and cosines[-1] > 0.1


def test_paper_means_set_the_centre_loss_by_signs():
    # App. H.3 as commit b8822e7 built it: all key signs opposite to the query signs, L = 0.
    query_means, key_means = clustered_data.paper_means(jax.random.key(4), 16, 0.0, 1.0)
    np.testing.assert_allclose(np.linalg.norm(query_means, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(np.sign(query_means[0]), np.sign(query_means[1]))
    np.testing.assert_array_equal(np.sign(key_means), -np.sign(query_means))
    np.testing.assert_allclose(real_diagonal_losses(query_means, key_means), 0.0, atol=1e-6)
    assert np.all(query_means @ key_means.T < 0)  # the angle moves with L
    query_means, key_means = clustered_data.paper_means(jax.random.key(4), 16, 0.5, 1.0)
    assert np.all((query_means[:, None] * key_means[None] > 0).sum(-1) == 8)
    assert np.all(real_diagonal_losses(query_means, key_means) > 0.3)


def test_cluster_means_reject_bad_input():
    assert clustered_data.magnitude_ratio(1.0) == 1.0
    rho = clustered_data.magnitude_ratio(0.3)
    assert 2 * rho / (1 + rho**2) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="loss_ratio must be in"):
        clustered_data.magnitude_ratio(0.0)
    with pytest.raises(ValueError, match="agreeing must be in"):
        clustered_data.sign_pattern_means(jax.random.key(0), 16, 2, 0.5, 1.0)
    with pytest.raises(ValueError, match="agreeing_fraction must be in"):
        clustered_data.paper_means(jax.random.key(0), 16, 1.5, 1.0)
    config = clustered_config.get_config()
    with pytest.raises(ValueError, match="fraction k / d"):
        clustered_data.means(jax.random.key(0), "fixed_loss", 0.3, config)
    with pytest.raises(ValueError, match="needs an agreeing fraction"):
        clustered_data.means(jax.random.key(0), "fixed_loss", 2 / 16, config)
    bad = clustered_config.get_config("quick")
    with bad.unlocked():
        bad.configurations = (("x", "random", 0.5, 0.1),)
    with pytest.raises(ValueError, match=r"configurations must be entries \(name, generator in"):
        hrf_clustered.validate_config(bad)
    bad = clustered_config.get_config("quick")
    bad.centre_norms.paper = 0.0
    with pytest.raises(ValueError, match=r"config\.centre_norms\.paper must be finite and > 0"):
        hrf_clustered.validate_config(bad)


def test_paper_table_3_never_separates_cluster_hrf_from_both_baselines():
    # The target (max below both mins) read off the paper's own Table 3.
    assert clustered_report.paper_separated_rows() == (0, 28)
    assert clustered_report.paper_interval(0, "cluster_hrf", 20) == pytest.approx((0.0016, 0.0183))
    assert clustered_report.paper_interval(3, "trigonometric", 200) == pytest.approx(
        (0.0015, 0.0067)
    )


def _clustered_draw(name, m, cluster, trig_ratio, point_norm=0.5, favor=2.0):
    """One draw record: cluster-HRF (both A) at ``cluster``, FAVOR+ ``favor`` times its inverse
    noise, trig ``trig_ratio`` times reversed noise."""
    noise = np.random.default_rng(0).normal(0.0, 0.01, 20)
    values = cluster * np.exp(noise)
    return {
        "configuration": name,
        "point_norm": point_norm,
        "num_features": m,
        "cluster_hrf": values.tolist(),
        "cluster_hrf_clipped": values.tolist(),
        "favor_plus": (favor * np.exp(-noise) * cluster).tolist(),
        "trigonometric": (trig_ratio * np.exp(noise[::-1]) * cluster).tolist(),
    }


def _two_configurations():
    config = clustered_config.get_config()
    with config.unlocked():
        config.configurations = (("a", "paper", 0.0, 0.02), ("b", "paper", 0.5, 0.02))
        config.feature_counts = (20, 50)
        config.point_norms = (0.5,)
    return config


def test_summary_rows_give_min_mean_se_and_max_of_each_estimators_mse():
    draw = {
        "configuration": "b",
        "point_norm": 0.5,
        "num_features": 20,
        **{e: [1.0, 2.0, 3.0, 4.0] for e in clustered_data.ESTIMATORS},
        "favor_plus": [2.0, 2.0, 2.0, 8.0],
    }
    rows = clustered_report.summary_rows([draw], _two_configurations())
    assert [r["estimator"] for r in rows] == list(clustered_data.ESTIMATORS)
    (favor,) = [r for r in rows if r["estimator"] == "favor_plus"]
    assert favor == {
        "configuration": "b",
        "generator": "paper",
        "parameter": 0.5,
        "sigma": 0.02,
        "point_norm": 0.5,
        "num_features": 20,
        "estimator": "favor_plus",
        "mse_min": 2.0,
        "mse_mean": 3.5,
        "mse_se": pytest.approx(1.5),  # sd 3 over sqrt(4) repetitions
        "mse_max": 8.0,
    }


def test_clustered_verdict_is_one_test_per_cell_pooled_over_m():
    # Two configurations of one generator, two m: cluster-HRF wins everywhere except that in
    # the second configuration trig is better by ln 2 at one m and equal at the other; the
    # pooled cell (mean ln ratio -0.35) refutes the claim beyond the 10% margin.
    config = _two_configurations()
    draws = [
        _clustered_draw("a", 20, 0.01, 2.0),
        _clustered_draw("a", 50, 0.01, 2.0),
        _clustered_draw("b", 20, 0.01, 0.5),
        _clustered_draw("b", 50, 0.01, 1.0),
    ]
    cells = clustered_report.pooled_log_ratios(draws, "b", 0.5)
    assert cells["trig"].mean == pytest.approx(0.5 * math.log(0.5), abs=0.01)
    judged = clustered_report.judge({"draws": draws}, config).given
    assert judged["paper_generator"].outcome == Outcome.DOES_NOT_HOLD
    assert judged["paper_generator_clipped"].outcome == Outcome.DOES_NOT_HOLD
    assert judged["orthogonal_generator"].outcome == Outcome.NOT_TESTED
    draws[3] = _clustered_draw("b", 50, 0.01, 4.0)  # now the pooled trig cell is +ln 2 / 2 > 0
    judged = clustered_report.judge({"draws": draws}, config).given
    assert judged["paper_generator"].outcome == Outcome.HOLDS


def test_clustered_verdicts_are_drawn_at_the_largest_norm_in_table_3_range():
    # At c = 0.5 both baselines stay within Table 3's range (cluster-HRF's own MSE, 5 in one
    # cell, does not: it does not choose c); at c = 1 FAVOR+ exceeds Table 3's largest entry, so
    # the verdict is drawn at c = 0.5.
    config = _two_configurations()
    with config.unlocked():
        config.point_norms = (0.5, 1.0)
    in_range = [_clustered_draw(n, m, 0.01, 2.0) for n in "ab" for m in (20, 50)]
    in_range[0] = _clustered_draw("a", 20, 5.0, 0.04, favor=0.04)  # baselines 0.2 <= 0.2541
    beyond = [_clustered_draw(n, m, 0.2, 0.5, point_norm=1.0) for n in "ab" for m in (20, 50)]
    draws = in_range + beyond
    assert pytest.approx(0.2541) == clustered_report.TABLE_3_MAX
    assert clustered_report.in_range_norm(draws, ["a", "b"], config) == 0.5
    judged = clustered_report.judge({"draws": draws}, config).given
    assert "at point norm 0.5" in judged["paper_generator"].evidence
    # Where no c keeps the baselines in range, the claim is not tested, with the reason.
    with config.unlocked():
        config.point_norms = (1.0,)
    draws = [
        _clustered_draw(n, m, 0.2, 0.5, point_norm=1.0, favor=2.0) for n in "ab" for m in (20, 50)
    ]
    judged = clustered_report.judge({"draws": draws}, config).given
    assert clustered_report.in_range_norm(draws, ["a", "b"], config) is None
    assert judged["paper_generator"].outcome == Outcome.NOT_TESTED
    assert "Table 3's range" in judged["paper_generator"].evidence


def test_points_are_normalised_and_the_clip_is_the_only_difference():
    points = np.array([[3.0, 4.0], [0.0, -2.0]])
    np.testing.assert_allclose(clustered_data.normalised(points, 0.5), [[0.3, 0.4], [0.0, -0.5]])
    with pytest.raises(ValueError, match="every point non-zero"):
        clustered_data.normalised(np.zeros((1, 2)), 1.0)
    config = clustered_config.get_config("quick")
    with config.unlocked():
        config.max_scale = 2.0  # a clip that binds on these means
    setup = clustered_data.make_configuration(jax.random.key(5), "paper", 0.5, 0.1, config)
    rescaled = clustered_data.at_point_norm(setup, 0.75, config)
    np.testing.assert_allclose(np.linalg.norm(rescaled["x"], axis=1), 0.75, rtol=1e-12)
    paper, clipped = (rescaled["parameters"][n] for n in clustered_data.CLUSTER_ESTIMATORS)
    np.testing.assert_array_equal(paper.query_centres, clipped.query_centres)
    alpha, alpha_clipped = np.asarray(paper.diagonals), np.asarray(clipped.diagonals)
    assert alpha.max() > config.max_scale  # the paper's A exceeds the clip somewhere
    np.testing.assert_allclose(
        alpha_clipped, np.clip(alpha, 1 / config.max_scale, config.max_scale), rtol=1e-6
    )


@pytest.mark.integration
def test_clustered_quick_run_geometry_and_verdicts(tmp_path):
    config = clustered_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    for name in ("results.csv", "configurations.csv", "mse_vs_m.png", "summary.md", "config.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    facts = result["facts"]
    assert len(facts) == len(config.configurations) * len(config.point_norms)
    entries = {entry[0]: entry for entry in config.configurations}
    for fact in facts:
        _, generator, parameter, _ = entries[fact["configuration"]]
        bound = math.exp(fact["point_norm"] ** 2)
        assert 1 / bound <= fact["softmax_min"] <= fact["softmax_max"] <= bound
        if generator == "orthogonal":
            assert abs(fact["cosine_mean"]) < 1e-12  # the angle is fixed whatever L is
            assert fact["L_ratio"] == pytest.approx(parameter, abs=0.05)  # fitted centres
        if generator == "paper" and parameter == 0.0:
            assert fact["L_ratio"] < 0.01 and fact["cosine_max"] < 0  # L = 0 by signs
    # At orthogonal centres a smaller L needs unequal magnitudes: a larger noise gain.
    small, large = (
        next(f for f in facts if f["configuration"] == f"orthogonal: {size} L, small sigma")
        for size in ("small", "large")
    )
    assert small["noise_gain_cluster_hrf"] > 2 * large["noise_gain_cluster_hrf"] > 2
    assert len(result["configurations"]) == len(config.configurations)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary and "0 of its 28" in summary
    stored = verdicts.read(str(tmp_path))
    assert stored["separation"].outcome == Outcome.NOT_TESTED
    for name in ("paper_generator", "orthogonal_generator", "angle_sweep"):
        for suffix in ("", "_clipped"):
            assert stored[name + suffix].outcome != Outcome.DOES_NOT_HOLD  # a quick variant


def test_config_variants():
    full, quick = clustered_config.get_config(), clustered_config.get_config("quick")
    assert full.experiment == quick.experiment
    with pytest.raises(ValueError, match="config variant"):
        clustered_config.get_config("huge")


def test_verdicts_are_drawn_at_the_largest_of_several_norms_in_range():
    config = _two_configurations()
    with config.unlocked():
        config.point_norms = (0.5, 0.75)
    draws = [
        _clustered_draw(n, m, 0.01, 0.1, point_norm=c, favor=0.1)
        for c in (0.5, 0.75)
        for n in "ab"
        for m in (20, 50)
    ]
    assert clustered_report.in_range_norm(draws, ["a", "b"], config) == 0.75


def test_mean_squared_errors_are_against_the_softmax_kernel_with_fresh_keys_per_m(monkeypatch):
    config = clustered_config.get_config("quick")
    setup = clustered_data.make_configuration(jax.random.key(5), "paper", 0.5, 0.1, config)
    rescaled = clustered_data.at_point_norm(setup, 0.75, config)
    x, y = (jnp.asarray(rescaled[s], jnp.float32) for s in ("x", "y"))
    keys = jax.random.split(jax.random.key(3), 2)
    mse = hrf_clustered._mean_squared_errors(
        config.coupling, 20, keys, x, y, rescaled["parameters"]
    )
    w = hrf_clustered.projections.get(config.coupling)(keys[1], x.shape[-1], 20)
    exact = jnp.exp(jnp.sum(x * y, axis=-1))
    for name, transform in (
        ("favor_plus", features.positive_features),
        ("trigonometric", features.trigonometric_features),
    ):
        estimate = features.estimate(transform(x, w), transform(y, w))
        expected = float(jnp.mean((estimate - exact) ** 2))
        got = float(mse[1, clustered_data.ESTIMATORS.index(name)])
        assert got == pytest.approx(expected, rel=1e-4), name
    # Every m draws its own repetitions: the pooling over m treats them as independent.
    seen = []

    def record(coupling, m, keys, x, y, parameters):
        seen.append(np.asarray(jax.random.key_data(keys)))
        return np.ones((keys.shape[0], len(clustered_data.ESTIMATORS)))

    monkeypatch.setattr(hrf_clustered, "_mean_squared_errors", record)
    with config.unlocked():
        config.configurations = config.configurations[:1]
        config.point_norms = config.point_norms[:1]
    hrf_clustered.measure(config)
    assert len(seen) == len(config.feature_counts) == 2
    assert not np.array_equal(seen[0], seen[1])
