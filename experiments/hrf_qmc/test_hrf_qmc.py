"""The HRF-against-QMC study (hrf_qmc): its quick run, its verdicts and its data."""

import math

import jax
import numpy as np
import pytest

from configs import hrf_qmc as qmc_config
from experiments import hrf_qmc
from experiments.core import verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from tests.support.studies import committed_figure_texts


@pytest.mark.integration
def test_qmc_quick_table_is_complete(tmp_path):
    config = qmc_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    for name in ("results.csv", "mse.png", "summary.md", "config.json"):
        assert (tmp_path / name).stat().st_size > 0, name
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


def test_qmc_verdict_holds_only_against_every_baseline_refuted_only_beyond_its_margin():
    config = qmc_config.get_config()
    config.datasets, config.matchings = ("wine",), ("projections",)

    def outcome(baseline_mse):
        rows = [
            {"dataset": "wine", "matching": "projections", "method": m, "mse": mse, "mse_se": 0.01}
            for m, mse in zip(config.methods, (1.0, 1.2, *baseline_mse), strict=True)
        ]
        judged = hrf_qmc.judge(rows, config).given
        assert judged["width_matched"].outcome == Outcome.NOT_TESTED  # not run
        # The paper's claim needs both sizings: one matching's "holds" does not decide it.
        assert judged["overall"].outcome == Outcome.NOT_TESTED
        return judged["projections_matched"].outcome

    assert outcome((1.1, 1.1, 1.1)) == Outcome.HOLDS  # 7 SE against each baseline
    # "All other methods": one baseline 20% below HRF refutes it, however far the others are
    # above (a pooled mean over the baselines read +0.6, "holds").
    assert outcome((0.8, 2.0, 2.0)) == Outcome.DOES_NOT_HOLD
    assert outcome((1.0, 2.0, 2.0)) == Outcome.NOT_RESOLVED  # one baseline level with HRF
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


def test_config_variants():
    full, quick = qmc_config.get_config(), qmc_config.get_config("quick")
    assert full.experiment == quick.experiment
    with pytest.raises(ValueError, match="config variant"):
        qmc_config.get_config("huge")


def test_figures_say_what_their_error_bars_are(monkeypatch, tmp_path):
    # The committed figures drew ± 2 SE bars that neither the figure nor the summary named.
    texts = committed_figure_texts(monkeypatch, "hrf_qmc", tmp_path)
    assert "2 SE" in texts["mse.png"], texts


def test_random_pairs_are_distinct_rows():
    data = np.arange(5.0)[:, None]
    first, second = hrf_qmc.random_pairs(jax.random.key(0), data, 2_000)
    assert np.all(first != second)
    assert set(np.unique(first - second)) == {-4.0, -3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 4.0}


@pytest.mark.parametrize("estimator", ["hybrid", "positive"])
def test_the_squared_errors_are_against_the_softmax_kernel(estimator):
    # exp(x.y) at |x| = |y| = 0.5: with 256 features the MSE is below 0.1% of mean exp(x.y)^2
    # (0.02% hybrid, 0.08% positive); the Gaussian kernel exp(-|x - y|^2 / 2) = e^(-1/4) exp(x.y)
    # is 4.9% of it away in mean square.
    rng = np.random.default_rng(0)
    x, y = (rng.normal(size=(64, 4)) for _ in range(2))
    x, y = (0.5 * v / np.linalg.norm(v, axis=-1, keepdims=True) for v in (x, y))
    keys = jax.random.split(jax.random.key(0), 64)
    squared = hrf_qmc._mean_squared_errors(estimator, "gaussian", 256, 4, keys, x, y)
    exact = np.exp(np.sum(x * y, axis=-1))
    assert float(np.mean(squared)) < 0.01 * float(np.mean(exact**2))


def test_hrf_versus_baselines_states_the_better_hrf_and_each_gap_in_its_se():
    config = qmc_config.get_config("quick,datasets=(wine,),matchings=(projections,)")
    rows = [
        {"dataset": "wine", "matching": "projections", "method": m, "mse": mse, "mse_se": se}
        for m, mse, se in (("HRF-ort", 1.0, 0.01), ("HRF-iid", 1.2, 0.01), ("ORF-reg", 2.0, 0.02))
    ]
    (row,) = hrf_qmc.hrf_versus_baselines(rows, config)
    assert row["better HRF"] == "HRF-ort"
    # (2.0 - 1.0) / 1.0 over hypot(0.01, 0.02) / 1.0: the relative gap in its SE.
    assert row["z vs ORF-reg"] == pytest.approx(1.0 / math.hypot(0.01, 0.02))


def test_each_data_set_and_method_draws_from_its_own_key(monkeypatch):
    """The methods' MSEs are compared as independent samples, so each (data set, method) draws
    its projections from its own key (the matchings of one method share it); one key per data
    set for every method passed every test."""
    keys: dict[str, set] = {}  # by draw_in_chunks' description, "<data set> <method>"

    def record(draw, key, num_draws, draws_per_chunk, description):
        del draw, draws_per_chunk
        keys.setdefault(description, set()).add(tuple(np.asarray(jax.random.key_data(key))))
        return np.zeros(num_draws)

    monkeypatch.setattr(hrf_qmc.stats, "draw_in_chunks", record)
    hrf_qmc.measure(qmc_config.get_config("quick"))
    assert len(keys) >= 4 and all(len(drawn) == 1 for drawn in keys.values())
    assert len(set().union(*keys.values())) == len(keys)
