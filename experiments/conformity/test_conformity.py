"""The SimRF Fig. 4 conformity experiment at its quick size, run in-process, and its pieces."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from configs import conformity as conformity_config
from experiments import conformity
from experiments.core import verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from rfjax import theory
from tests.support.studies import quick_run_fixture

quick_run = quick_run_fixture(conformity_config)


@pytest.mark.integration
def test_quick_run_writes_its_files(quick_run):
    config, workdir, _ = quick_run
    for name in (
        "results.csv",
        "differences.csv",
        "trace.csv",
        "conformity.png",
        "summary.md",
        "config.json",
    ):
        assert (workdir / name).stat().st_size > 0, name
    rows = read_csv(workdir / "results.csv")
    assert len(rows) == len(config.norms_of_sum) * len(conformity.GEOMETRIES)
    summary = (workdir / "summary.md").read_text()
    assert summary.startswith("# ")
    # The nan theory cells of SimRF+ and the optimised geometry are explained under the table.
    assert "are nan for simplex_plus, optimised" in summary
    assert theory.no_closed_form_reason("simplex_plus") in summary


@pytest.mark.integration
def test_monte_carlo_agrees_with_closed_forms(quick_run):
    _, _, result = quick_run
    checked = [r for r in result["rows"] if r["geometry"] in conformity.CLOSED_FORMS]
    assert len(checked) == 3 * len(quick_run[0].norms_of_sum)
    for row in checked:
        assert abs(row["z_score"]) <= 4.0, row


@pytest.mark.integration
def test_coupled_geometries_share_norms_and_order_as_the_paper(quick_run):
    _, workdir, result = quick_run
    assert "largest norm mismatch" in (workdir / "summary.md").read_text()
    for row in result["differences"]:
        if row["difference"] in ("orthogonal - simplex", "simplex - simplex_plus"):
            # Corollary 3.3 (SimRF < ORF) and SimRF+ below SimRF: paired, many SEs away.
            assert row["mean"] > 4.0 * row["se"], row


@pytest.mark.integration
def test_optimised_geometry_decreases_the_objective_and_beats_simrf(quick_run):
    _, _, result = quick_run
    for v in quick_run[0].norms_of_sum:
        steps = [r for r in result["trace"] if r["v"] == v]  # mean log rho at some steps
        assert steps[0]["step"] == 0 and steps[-1]["step"] == quick_run[0].num_steps
        assert steps[-1]["mean_log_rho"] < steps[0]["mean_log_rho"]
    for row in result["differences"]:
        if row["difference"] == "simplex - optimised":
            assert row["mean"] > -4.0 * row["se"], row
        if row["difference"] == "simplex_plus - optimised":
            # The optimiser reaches at least SimRF+ (up to 4 SE).
            assert row["mean"] > -4.0 * row["se"], row


@pytest.mark.integration
def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    config, workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    stored = verdicts.read(str(workdir))
    assert set(stored) == set(config.claims)
    assert stored["closed_order"].outcome == Outcome.HOLDS
    for name in ("simrf_orf", "simrf_plus", "optimiser"):
        assert stored[name].outcome == Outcome.HOLDS, stored[name]
    for verdict in stored.values():
        assert verdict.sentence() in summary


def test_a_monte_carlo_reversal_of_orf_and_iid_cannot_refute_a_claim_without_margin():
    rows = [
        {"geometry": g, "v": 1.0, "rho_mc": mc, "rho_se": 0.01, "rho_theory": t, "z_score": 0.0}
        for g, mc, t in (("simplex", 2.0, 2.0), ("orthogonal", 2.6, 2.5), ("gaussian", 2.4, 2.7))
    ]
    differences = [
        {"difference": name, "v": 1.0, "mean": mean, "se": 0.01, "relative_to_simrf": mean / 2}
        for name, mean in (
            ("orthogonal - simplex", 0.5),
            ("simplex - simplex_plus", 0.5),
            ("simplex_plus - optimised", 0.5),
            ("simplex - optimised", 1.0),
        )
    ]
    config = conformity_config.get_config()
    judged = conformity.judge({"rows": rows, "differences": differences}, config).given
    assert judged["closed_order"].outcome == Outcome.HOLDS
    # IID below ORF by 14 SE: against the claim, but its margin is 0.
    assert judged["orf_iid"].outcome == Outcome.NOT_RESOLVED
    assert "no margin is declared" in judged["orf_iid"].evidence
    assert judged["simrf_orf"].outcome == Outcome.HOLDS


def test_pair_conformity_of_the_simplex_is_its_pair_average():
    # Unit-norm simplex rows: |w_i + w_j|^2 = 2 - 2/(d-1) for every pair, so rho(W) is one 0F1.
    dim, v = 5, 1.3
    weights = conformity.projections.simplex_directions(dim)
    bound = conformity.max_pair_argument(dim, v)
    got = float(jnp.exp(conformity.log_pair_conformity(weights, jnp.float32(v), bound)))
    expected = special.hyp0f1(dim / 2, v * v * (2 - 2 / (dim - 1)) / 4)
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("dim", 1, "config.dim"),
        ("norms_of_sum", (), "norms_of_sum"),
        ("norms_of_sum", (0.5, -1.0), "norms_of_sum"),
        ("num_draws", 1, "config.num_draws"),
        ("optimizer", "newton", "config.optimizer"),
        ("init", "zeros", "config.init"),
        ("learning_rate", 0.0, "config.learning_rate"),
        ("raw_num_draws", 1, "raw_num_draws"),
        # optax's cosine decay took them: NaN learning rates, or a rate that grows past 1x
        ("final_lr_fraction", float("nan"), r"config.final_lr_fraction must be finite and in"),
        ("final_lr_fraction", -1.0, r"config.final_lr_fraction must be finite and in"),
    ],
)
def test_bad_config_raises(field, value, match):
    config = conformity_config.get_config("quick")
    setattr(config, field, value)
    with pytest.raises((ValueError, TypeError), match=match):
        conformity.validate_config(config)


def test_config_variants():
    full, quick = conformity_config.get_config(), conformity_config.get_config("quick")
    assert full.dim == 6 and quick.num_draws < full.num_draws
    with pytest.raises(ValueError, match="config variant"):
        conformity_config.get_config("huge")


def _judged_cells():
    rows = [
        {"geometry": g, "v": 1.0, "rho_mc": mc, "rho_se": se, "rho_theory": t, "z_score": 0.0}
        for g, mc, se, t in (
            ("simplex", 2.0, 0.01, 2.0),
            ("orthogonal", 2.6, 0.01, 2.5),
            ("gaussian", 2.64, 0.03, 2.7),
        )
    ]
    differences = [
        {"difference": name, "v": 1.0, "mean": mean, "se": 0.01, "relative_to_simrf": mean / 2}
        for name, mean in (
            ("orthogonal - simplex", 0.5),
            ("simplex - simplex_plus", 0.03),
            ("simplex_plus - optimised", 0.02),
            ("simplex - optimised", 0.05),
        )
    ]
    return rows, differences


def test_judge_reads_each_claim_from_its_own_cells_in_units_of_simrf():
    rows, differences = _judged_cells()
    given = conformity.judge(
        {"rows": rows, "differences": differences}, conformity_config.get_config()
    ).given
    # Closed forms: ORF - SimRF = 0.5, IID - ORF = 0.2; the smaller is the claim's gap.
    assert "over v and both steps = +0.2 (exact)" in given["closed_order"].evidence
    # Paired differences over SimRF's 2: the SE scales with the mean.
    assert "= +0.25 ± 0.005 " in given["simrf_orf"].evidence
    assert "= +0.015 ± 0.005 " in given["simrf_plus"].evidence
    # IID - ORF from independent draws: hypot(0.03, 0.01) / 2.
    assert f"= +0.02 ± {math.hypot(0.03, 0.01) / 2:.3g} " in given["orf_iid"].evidence
    assert "(share of SimRF's drop to the optimised geometry reached by SimRF+) - 0.5" in (
        given["close"].evidence
    )
    assert "= +0.1 ±" in given["close"].evidence


def test_share_of_drop_is_bounded_by_both_means_97_5_percent_intervals():
    _, differences = _judged_cells()
    paired = {(d["difference"], d["v"]): d for d in differences}
    share = conformity._share_of_drop(paired, 1.0, 4000)
    q = stats.norm.ppf(0.9875)  # normal reference, as the paired means
    low, high = (0.03 - q * 0.01) / (0.05 + q * 0.01), (0.03 + q * 0.01) / (0.05 - q * 0.01)
    assert share.mean == pytest.approx(0.03 / 0.05 - conformity.CLOSE_SHARE)
    assert share.se == pytest.approx((high - low) / (2 * stats.norm.ppf(0.975)))
    (row,) = conformity.closeness_rows(differences)
    assert row["share of the drop reached by SimRF+"] == pytest.approx(0.6)
    assert row["SimRF - optimised (% of SimRF)"] == pytest.approx(2.5)
    sentence = conformity._gain_sentence(differences, 1.0)
    assert "ORF is 25% above SimRF, SimRF+ 1.5% below it" in sentence
    assert "a further 1% (of SimRF) below SimRF+" in sentence


def test_tabulate_states_ratios_and_differences_over_simrf_on_the_same_draws():
    config = conformity_config.get_config("quick,norms_of_sum=(0.5,)")
    base = np.array([[1.0, 1.2, 1.1, 0.9]])
    per_draw = {
        "gaussian": base + 0.3 + np.array([[0.05, -0.05, 0.0, 0.02]]),
        "orthogonal": base + 0.2,
        "simplex": base,
        "simplex_plus": base - 0.01 * np.array([[1.0, 2.0, 1.0, 2.0]]),
        "optimised": base - 0.05,
    }
    rows, differences = conformity.tabulate({"per_draw": per_draw, "raw": {}}, config)
    by = {r["geometry"]: r for r in rows}
    closed = conformity.closed_forms(config.dim, np.array([0.5]))
    orthogonal = by["orthogonal"]
    assert orthogonal["ratio_to_simrf"] == pytest.approx(1.25 / 1.05)
    assert orthogonal["ratio_theory"] == pytest.approx(
        closed["orthogonal"][0] / closed["simplex"][0]
    )
    se = np.std(per_draw["orthogonal"][0], ddof=1) / 2.0
    assert orthogonal["z_score"] == pytest.approx((1.25 - closed["orthogonal"][0]) / se)
    paired = {d["difference"]: d for d in differences}
    # Every paired difference in units of SimRF's conformity, not of its own first term.
    assert paired["orthogonal - simplex"]["relative_to_simrf"] == pytest.approx(0.2 / 1.05)
    plus = paired["simplex - simplex_plus"]
    assert plus["mean"] == pytest.approx(0.015)
    assert plus["relative_to_simrf"] == pytest.approx(0.015 / 1.05)


def test_sample_draws_fresh_keys_per_chunk_and_checks_the_raw_estimate_at_v(monkeypatch):
    seen = []

    def raw(key, coupling, x, y, dim, *, num_samples, batch_size):
        seen.append(float(np.linalg.norm(np.asarray(x) + np.asarray(y))))
        return 1.0, 0.1

    monkeypatch.setattr(conformity.theory, "monte_carlo_conformity", raw)
    starts = []
    start_directions = conformity._start_directions

    def record_start(key, init, shape):
        starts.append(np.asarray(jax.random.key_data(key)))
        return start_directions(key, init, shape)

    monkeypatch.setattr(conformity, "_start_directions", record_start)
    config = conformity_config.get_config(
        "quick,dim=3,norms_of_sum=(0.5,),num_draws=4,draws_per_chunk=2,num_steps=1,raw_num_draws=2"
    )
    sampled = conformity.sample(config)
    simplex = sampled["per_draw"]["simplex"][0]
    assert len(set(simplex.round(12))) == 4, simplex  # no chunk repeats another's draws
    assert seen == pytest.approx([0.5] * len(conformity.SAMPLED))
    # Each chunk's optimiser starts from its own random directions.
    assert len(starts) == 2 and not np.array_equal(starts[0], starts[1])
