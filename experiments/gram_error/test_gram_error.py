"""The SimRF Fig. 7 Gram-matrix error experiment at its quick size, run in-process."""

import math

import jax
import numpy as np
import pytest

from configs import gram_error as gram_error_config
from experiments import gram_error
from experiments.core import verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from tests.support.studies import quick_run_fixture

quick_run = quick_run_fixture(gram_error_config)


def lookup(rows, coupling, ratio):
    (row,) = [r for r in rows if r["coupling"] == coupling and r["m_over_d"] == ratio]
    return row


@pytest.mark.integration
def test_quick_run_writes_its_files(quick_run):
    config, workdir, _ = quick_run
    for name in ("results.csv", "gram_error.png", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    rows = read_csv(workdir / "results.csv")
    assert len(rows) == len(config.couplings) * len(config.features_per_dim)
    assert (workdir / "summary.md").read_text().startswith("# ")


@pytest.mark.integration
def test_mean_squared_error_agrees_with_the_closed_form(quick_run):
    _, _, result = quick_run
    checked = [r for r in result["rows"] if r["coupling"] in gram_error.CLOSED_FORMS]
    assert len(checked) == 3 * len(quick_run[0].features_per_dim)
    for row in checked:
        assert abs(row["z_score"]) <= 4.0, row


@pytest.mark.integration
def test_error_falls_with_the_number_of_features(quick_run):
    config, _, result = quick_run
    small, large = min(config.features_per_dim), max(config.features_per_dim)
    for coupling in config.couplings:
        before, after = (
            lookup(result["rows"], coupling, small),
            lookup(result["rows"], coupling, large),
        )
        gap = before["relative_mean"] - after["relative_mean"]
        assert gap > 4.0 * math.hypot(before["relative_se"], after["relative_se"]), coupling


@pytest.mark.integration
def test_simplex_beats_iid_and_orthogonal(quick_run):
    config, _, result = quick_run
    # Closed forms at the quick size: SimRF/IID 0.63, ORF/IID 0.84 in mean squared error; the
    # SimRF-vs-IID and SimRF-vs-ORF gaps are many SEs at every m (independent draws).
    for ratio in config.features_per_dim:
        simplex = lookup(result["rows"], "simplex", ratio)
        for other in ("gaussian", "orthogonal"):
            row = lookup(result["rows"], other, ratio)
            gap = row["frobenius_mean"] - simplex["frobenius_mean"]
            assert gap > 4.0 * math.hypot(row["frobenius_se"], simplex["frobenius_se"]), other


@pytest.mark.integration
def test_paired_differences_of_block_couplings(quick_run):
    config, workdir, result = quick_run
    paired = [r for r in result["differences"] if r["difference"] == "orthogonal - simplex"]
    assert [r["m_over_d"] for r in paired] == list(config.features_per_dim)
    for row in paired:
        assert row["z"] > 4.0, row
    assert (workdir / "differences.csv").stat().st_size > 0


def test_expected_squared_error_is_the_sum_of_pointwise_mses():
    x = np.array([[0.1, -0.2, 0.05], [0.0, 0.3, -0.1]])
    total = gram_error.expected_squared_error(x, 3, "orthogonal")
    with jax.enable_x64(True):  # the closed forms are float64 only with x64 on, as the experiment
        pairs = [
            gram_error.theory.prf_mse(x[i], x[j], 3, coupling="orthogonal")
            for i in range(2)
            for j in range(2)
        ]
    assert total == pytest.approx(float(np.sum(pairs)), rel=1e-12)
    assert math.isnan(gram_error.expected_squared_error(x, 3, "simplex_plus"))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("dim", 1, "config.dim"),
        ("num_points", 1, "config.num_points"),
        ("sigma", -0.1, "config.sigma"),
        ("features_per_dim", (), "features_per_dim"),
        ("features_per_dim", (1, 0), "features_per_dim"),
        ("couplings", ("simplex", "halton"), "couplings"),
        ("num_repetitions", 1, "config.num_repetitions"),
    ],
)
def test_bad_config_raises(field, value, match):
    config = gram_error_config.get_config("quick")
    setattr(config, field, value)
    with pytest.raises((ValueError, TypeError), match=match):
        gram_error.validate_config(config)


def test_config_variants():
    full, quick = gram_error_config.get_config(), gram_error_config.get_config("quick")
    assert (full.dim, full.num_points, full.sigma) == (64, 64, 0.1)
    assert quick.num_repetitions < full.num_repetitions
    with pytest.raises(ValueError, match="config variant"):
        gram_error_config.get_config("huge")


@pytest.mark.integration
def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    _, workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    stored = verdicts.read(str(workdir))
    assert stored["simrf_plus"].outcome == Outcome.NOT_TESTED  # the quick config has no SimRF+
    for name in ("falls", "simplex_orf", "orf_iid"):
        assert stored[name].outcome == Outcome.HOLDS, stored[name]
        assert stored[name].sentence() in summary


def _rows(means_by_coupling):
    return [
        {
            "coupling": c,
            "m_over_d": r,
            "relative_mean": mean,
            "relative_se": 0.01,
            "squared_mean": 1.0,
            "squared_se": 0.1,
            "squared_theory": 1.0,
            "z_score": 0.0,
        }
        for c, means in means_by_coupling
        for r, mean in zip((1, 2), means, strict=True)
    ]


def test_the_ordering_is_one_pooled_test_and_a_reversal_needs_a_margin_to_refute():
    config = gram_error_config.get_config()
    config.couplings = ("gaussian", "orthogonal")
    # ORF above IID by 14 SE at m/d = 2 and below by 35 SE at m/d = 1: the pooled (precision-
    # weighted) difference is +0.15 ± 0.014 (SE bound for shared draws): holds.
    rows = _rows((("gaussian", (2.0, 1.0)), ("orthogonal", (1.5, 1.2))))
    judged = gram_error.judge({"rows": rows, "differences": []}, config).given
    assert judged["orf_iid"].outcome == Outcome.HOLDS
    assert "the other way at 1 (m/d 2)" in judged["orf_iid"].evidence
    assert judged["falls"].outcome == Outcome.HOLDS
    # Reversed at both m: against the claim, but its margin is 0, so not refuted.
    rows = _rows((("gaussian", (1.0, 0.8)), ("orthogonal", (1.5, 1.2))))
    judged = gram_error.judge({"rows": rows, "differences": []}, config).given
    assert judged["orf_iid"].outcome == Outcome.NOT_RESOLVED


def test_paired_differences_and_simrf_plus_are_in_units_of_the_first_couplings_error():
    config = gram_error_config.get_config("features_per_dim=(1,2)")
    simplex = np.array([[1.0, 0.8], [1.2, 0.9], [0.9, 0.7], [1.1, 0.8]])
    noise = np.array([[0.002, -0.001], [-0.001, 0.002], [0.001, 0.0], [-0.002, -0.001]])
    # SimRF+ 3% above SimRF (beyond the 1% margin), ORF 0.1 above SimRF.
    errors = {
        "orthogonal": simplex + 0.1 + noise,
        "simplex": simplex,
        "simplex_plus": 1.03 * simplex + noise,
    }
    differences = gram_error.paired_differences(errors, config)
    by = {(d["difference"], d["m_over_d"]): d for d in differences}
    for column, ratio in enumerate(config.features_per_dim):
        first, second = errors["simplex"][:, column], errors["simplex_plus"][:, column]
        row = by["simplex - simplex_plus", ratio]
        gap = first - second
        assert row["mean"] == pytest.approx(gap.mean())
        assert row["se"] == pytest.approx(gap.std(ddof=1) / 2.0)
        assert row["relative_to_first"] == pytest.approx(gap.mean() / first.mean())
        relative = gram_error._relative(row, 4, sign=-1)
        assert relative.mean == pytest.approx(-gap.mean() / first.mean())
        assert relative.se == pytest.approx(gap.std(ddof=1) / 2.0 / first.mean())
    rows = _rows(
        (
            ("gaussian", (2.0, 1.5)),
            ("orthogonal", (1.5, 1.2)),
            ("simplex", (1.2, 1.0)),
            ("simplex_plus", (1.2, 1.0)),
        )
    )
    judged = gram_error.judge({"rows": rows, "differences": differences}, config).given
    assert judged["simrf_plus"].outcome == Outcome.DOES_NOT_HOLD, judged["simrf_plus"]
    assert judged["simplex_orf"].outcome == Outcome.HOLDS, judged["simplex_orf"]


def test_every_coupling_draws_from_the_same_keys(monkeypatch):
    # The paired differences (ORF - SimRF, SimRF - SimRF+) need shared norms and rotations.
    keys = {}

    def record(key, coupling, counts, x, config):
        keys[coupling] = np.asarray(jax.random.key_data(key))
        shape = (config.num_repetitions, len(counts))
        return np.random.default_rng(len(keys)).uniform(1.0, 2.0, shape)

    monkeypatch.setattr(gram_error, "squared_errors", record)
    config = gram_error_config.get_config("quick")
    gram_error.measure(config)
    assert list(keys) == list(config.couplings)
    for coupling in config.couplings:
        np.testing.assert_array_equal(keys[coupling], keys["gaussian"])


def test_data_facts_average_over_distinct_pairs():
    x = jax.numpy.asarray([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    facts = gram_error.data_facts(x)
    # |x_i + x_j| over i != j: sqrt(2), 1, 1 (each twice).
    assert facts["v_offdiag_mean"] == pytest.approx((math.sqrt(2) + 2.0) / 3.0)
    exact = np.exp(-np.array([[0, 2, 1], [2, 0, 1], [1, 1, 0]]) / 2.0)
    assert facts["exact_norm"] == pytest.approx(np.linalg.norm(exact), rel=1e-6)


@pytest.mark.integration
def test_summary_states_the_ratios_to_iid_at_the_smallest_and_largest_m(quick_run):
    config, workdir, _ = quick_run
    summary = " ".join((workdir / "summary.md").read_text().split())
    for ratio in (min(config.features_per_dim), max(config.features_per_dim)):
        assert f"At m = {ratio}d the mean Frobenius error relative to IID is" in summary
