"""The SimRF Fig. 4 conformity experiment at its quick size, run in-process, and its pieces."""

import jax.numpy as jnp
import pytest
from scipy import special

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
