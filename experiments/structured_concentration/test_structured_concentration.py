"""The structured_concentration experiment (Choromanski & Fagan) at its quick size."""

import math

import numpy as np
import pytest

from configs import structured_concentration as concentration_config
from experiments import structured_concentration
from experiments.core import verdicts
from experiments.core.stats import Estimate
from experiments.core.verdicts import Outcome
from rfjax import theory
from tests.support.studies import quick_run_fixture

quick_run = quick_run_fixture(concentration_config)


@pytest.mark.integration
def test_writes_outputs(quick_run):
    config, workdir, result = quick_run
    for name in ("methods.csv", "tails.csv", "error_vs_budget.png", "tails.png", "summary.md"):
        assert (workdir / name).stat().st_size > 0, name
    summary = (workdir / "summary.md").read_text()
    assert summary.startswith("# ") and "$" not in summary
    methods = structured_concentration.methods(config)
    assert [r["method"] for r in result["rows"]] == [name for name, _, _ in methods]
    assert len(result["tails"]) == len(methods) * len(config.epsilons)


@pytest.mark.integration
def test_every_family_is_unbiased_and_the_gaussian_matches_its_closed_form(quick_run):
    _, _, result = quick_run
    for row in result["rows"]:
        assert abs(row["bias z"]) <= 4, row
    gaussian = next(r for r in result["rows"] if r["method"] == "gaussian")
    assert abs(gaussian["MSE"] - result["iid_mse"]) <= 4 * gaussian["MSE SE"]


@pytest.mark.integration
def test_empirical_tails_are_below_the_proven_bounds(quick_run):
    _, _, result = quick_run
    for tail in result["tails"]:
        assert tail["tail"] <= tail["P-model"] + 4 * tail["tail SE"], tail
        if tail["family"] == "gaussian":
            assert tail["tail"] <= tail["Hoeffding"] + 4 * tail["tail SE"], tail


@pytest.mark.integration
def test_chromatic_numbers_and_budgets(quick_run):
    _, _, result = quick_run
    rows = {r["method"]: r for r in result["rows"]}
    dim = rows["gaussian"]["n"]
    assert dim & (dim - 1)  # not a power of two: the plain circulant has odd cycles
    assert (rows["circulant"]["chi[P]"], rows["circulant_hd"]["chi[P]"]) == (3, 2)
    assert rows["ldr2"]["chi[P]"] == dim and rows["ldr2_hd"]["chi[P]"] == rows["ldr2_hd"]["n"]
    assert (rows["circulant"]["budget t"], rows["ldr2"]["budget t"]) == (dim, 2 * dim)
    assert rows["gaussian"]["budget t"] == dim * dim


def test_bad_configs():
    config = concentration_config.get_config("quick")
    with config.unlocked():
        config.families = ("circulant",)
    with pytest.raises(ValueError, match="families must be including 'gaussian'"):
        structured_concentration.validate_config(config)
    config = concentration_config.get_config("quick")
    config.epsilons = (0.2, 0.1)
    with pytest.raises(ValueError, match="epsilons must be increasing"):
        structured_concentration.validate_config(config)
    for field, value, match in (
        ("num_points", 0, r"config\.num_points must be an int in \[2, 1797\], got 0"),
        ("num_points", -1, r"config\.num_points must be an int in \[2, 1797\], got -1"),
        ("num_pairs", 10**6, r"config\.num_pairs must be an int in \[1, 780\], got 1000000"),
    ):
        config = concentration_config.get_config("quick")  # 40 points: 780 pairs
        config[field] = value
        with pytest.raises(ValueError, match=match):
            structured_concentration.validate_config(config)


@pytest.mark.integration
def test_chi_is_contrasted_within_the_circulant_family_at_equal_m(quick_run):
    config, workdir, _ = quick_run
    stored = verdicts.read(str(workdir))
    assert set(stored) == set(config.claims)
    assert stored["chi_order"].outcome != Outcome.NOT_TESTED
    assert "ln(tail at n = 63 (chi = 3) / tail at n = 64 (chi = 2))" in stored["chi_order"].evidence
    assert stored["circulant_chi"].outcome == Outcome.HOLDS  # chi[P] is exact: a fact
    for name in ("unbiased", "p_model", "hoeffding"):
        assert stored[name].outcome == Outcome.HOLDS, stored[name]
    summary = (workdir / "summary.md").read_text()
    assert "chi[P] = 3 and 2" in summary and "budgets t = 63 and 64" in summary


def test_chi_contrast_rows_give_the_log_tail_ratio_and_the_m_over_chi_reading():
    config = concentration_config.get_config("quick")
    with config.unlocked():
        config.epsilons = (0.1, 0.2)
    results = {
        "chi_contrast": {
            "dims": {
                "63": {"chromatic": 3, "tail": [0.2, 0.0], "tail_se": [0.01, 0.0]},
                "64": {"chromatic": 2, "tail": [0.1, 0.01], "tail_se": [0.005, 0.001]},
            }
        }
    }
    first, second = structured_concentration.chi_contrast_rows(results, config)
    assert first["ln ratio"] == pytest.approx(math.log(2))
    assert first["ln ratio SE"] == pytest.approx(math.hypot(0.05, 0.05))
    # Gaussian errors with variance x 3/2: 2 Q(1.645 sqrt(2/3)) = 0.179 against 0.1.
    assert first["m / chi reading"] == pytest.approx(math.log(0.17927 / 0.1), abs=1e-4)
    assert math.isnan(second["ln ratio"])  # no exceedance at n = 63: no ratio


def test_a_bad_chi_contrast_is_rejected():
    config = concentration_config.get_config("quick")
    config.chi_contrast.dims = (64, 64)
    with pytest.raises(ValueError, match=r"chi_contrast\.dims must be without repeats"):
        structured_concentration.validate_config(config)
    config.chi_contrast.dims = (32, 64, 128)  # one contrast is of two sizes
    with pytest.raises(ValueError, match=r"chi_contrast\.dims must be two block sizes"):
        structured_concentration.validate_config(config)


def test_an_interval_inside_the_margin_reports_the_equivalence_bound_it_establishes():
    # The committed chi contrast: +0.009 ± 0.0328 over 4000 draws, 95% interval about
    # [-0.055, +0.073], inside ln 1.1 = 0.095 both ways: "not resolved" as an ordering, but the
    # tails are shown equal within a factor e^0.073.
    estimate = Estimate(0.009, 0.0328, 4000)
    low, high = estimate.interval(0.95)
    text = structured_concentration.equivalence_bound_text(estimate, 0.95, math.log(1.1))
    assert f"within ±{high:.3f}" in text and f"[{low:+.3f}, {high:+.3f}]" in text
    assert f"factor {math.exp(high):.3f}" in text and "inside the declared margin" in text
    wide = structured_concentration.equivalence_bound_text(Estimate(0.0, 0.1, 4000), 0.95, 0.1)
    assert "not inside the declared margin" in wide
    # A negative effect: the bound is the interval's lower end in size, not its upper end.
    negative = Estimate(-0.05, 0.01, 4000)
    low, high = negative.interval(0.95)
    text = structured_concentration.equivalence_bound_text(negative, 0.95, math.log(1.1))
    assert abs(low) > abs(high) and f"within ±{abs(low):.3f}" in text


def test_the_chi_order_cells_are_the_eps_where_both_tails_reach_the_floor():
    """A cell enters the pooled chi test only where the smaller of its two tails is at least
    ``tail_floor``; one whose larger tail alone reaches it stays out."""
    config = concentration_config.get_config("quick")
    with config.unlocked():
        config.epsilons = (0.1, 0.2, 0.3)
        config.chi_contrast.tail_floor = 0.01
    results = {
        "chi_contrast": {
            "dims": {
                "63": {"chromatic": 3, "tail": [0.2, 0.05, 0.02], "tail_se": [0.01, 0.01, 0.01]},
                "64": {"chromatic": 2, "tail": [0.1, 0.005, 0.01], "tail_se": [0.01, 0.01, 0.01]},
            }
        }
    }
    cells = structured_concentration.chi_order_cells(results, config)
    assert sorted(cells) == [0.1, 0.3]
    assert cells[0.1].mean == pytest.approx(math.log(2))


@pytest.mark.integration
def test_ratios_to_the_gaussian_carry_both_mses_ses_and_the_max_over_pairs_tail(quick_run):
    _, _, result = quick_run
    gaussian = next(r for r in result["rows"] if r["method"] == "gaussian")
    for row in result["rows"]:
        if row["method"] == "gaussian":
            continue
        ratio = row["MSE"] / gaussian["MSE"]
        relative = math.hypot(row["MSE SE"] / row["MSE"], gaussian["MSE SE"] / gaussian["MSE"])
        assert row["ratio to Gaussian"] == pytest.approx(ratio, rel=1e-12)
        assert row["ratio SE"] == pytest.approx(ratio * relative, rel=1e-12)
    # The max over pairs exceeds eps whenever one pair does, and strictly more often somewhere.
    assert all(t["max tail"] >= t["tail"] for t in result["tails"])
    assert any(t["max tail"] > t["tail"] + 4 * t["max tail SE"] for t in result["tails"])


def test_the_uniform_bound_uses_the_gaussian_frequencies_sigma_p():
    """The uniform bound's sigma_p is sqrt(E|w|^2) of the study's frequencies w ~ N(0, I_d):
    the bound with sigma_p estimated from 20,000 draws matches it within the estimate's
    error (E|w|^2 = d, its SE sqrt(2 d / n)), where sigma_p = d (a factor 2^(4/3) at d = 4)
    passed every test."""
    dim, draws, eps = 4, 20_000, np.array([0.5, 0.8])  # m = 2,000: bounds below 1, not capped
    w = np.random.default_rng(0).standard_normal((draws, dim))
    squared_norms = np.sum(w**2, axis=1)
    sigma_p = math.sqrt(squared_norms.mean())
    relative_se = squared_norms.std(ddof=1) / math.sqrt(draws) / squared_norms.mean()
    # The bound scales as sigma_p^(2 / (1 + 2 / d)) = (sigma_p^2)^(1 / (1 + 2 / d)).
    tolerance = 4 * relative_se / (1 + 2 / dim)
    expected = theory.rff_uniform_bound(eps, 2000, dim, diameter=3.0, sigma_p=sigma_p)
    got = structured_concentration.gaussian_uniform_bound(eps, 2000, dim, 3.0)
    assert np.all(got < 1e-9)
    np.testing.assert_allclose(got, expected, rtol=tolerance)
