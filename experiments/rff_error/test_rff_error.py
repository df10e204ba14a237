"""The rff_error experiment (Sutherland & Schneider) at its quick size."""

import math

import numpy as np
import pytest

from configs import rff_error as rff_error_config
from experiments import rff_error
from experiments.core import verdicts
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from tests.support.studies import committed_figure_texts, quick_run_fixture

quick_run = quick_run_fixture(rff_error_config)


@pytest.mark.integration
def test_writes_outputs(quick_run):
    _, workdir, _ = quick_run
    for name in (
        "variance.csv",
        "max_error.csv",
        "tail_probability.csv",
        "variance.png",
        "max_error_radius.png",
        "tail_probability.png",
        "summary.md",
        "summary.json",
        "config.json",
    ):
        assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "summary.md").read_text().startswith("# ")


@pytest.mark.integration
def test_monte_carlo_variance_matches_closed_forms(quick_run):
    _, _, result = quick_run
    rows = result["variance_rows"]
    assert len(rows) == 2 * len(rff_error_config.get_config("quick").distances)
    for row in rows:
        if row["variance_theory"] == 0.0:  # phi at Delta = 0 is exact
            assert row["delta"] == 0.0 and row["embedding"] == "phi"
            assert row["variance_mc"] < 1e-9
        else:
            assert abs(row["variance_mc"] - row["variance_theory"]) <= 4 * row["variance_se"], row


@pytest.mark.integration
def test_phi_has_lower_variance_and_max_error_than_psi(quick_run):
    _, _, result = quick_run
    variance = {(r["delta"], r["embedding"]): r for r in result["variance_rows"]}
    for delta in rff_error_config.get_config("quick").distances:
        phi, psi = variance[(delta, "phi")], variance[(delta, "psi")]
        # theory first (exact), then the Monte Carlo where the gap is many SEs wide
        assert phi["variance_theory"] < psi["variance_theory"]
        gap_se = math.hypot(phi["variance_se"], psi["variance_se"])
        if psi["variance_theory"] - phi["variance_theory"] > 8 * gap_se:
            assert phi["variance_mc"] < psi["variance_mc"]
    cells = {(r["radius"], r["embedding"]): r for r in result["max_rows"]}
    region = rff_error_config.get_config("quick").region_radius
    phi, psi = cells[(region, "phi")], cells[(region, "psi")]
    gap = psi["max_error_mean"] - phi["max_error_mean"]
    assert gap > 4 * math.hypot(phi["max_error_se"], psi["max_error_se"])


@pytest.mark.integration
def test_max_error_grows_with_radius_and_tail_is_a_survival_function(quick_run):
    _, _, result = quick_run
    for embedding in rff_error.EMBEDDINGS:
        means = [r["max_error_mean"] for r in result["max_rows"] if r["embedding"] == embedding]
        assert np.all(np.diff(means) >= 0)  # nested regions: the sup cannot shrink
        probabilities = [r[f"prob_{embedding}"] for r in result["tail_rows"]]
        assert probabilities[0] == 1.0 and probabilities[-1] == 0.0
        assert np.all(np.diff(probabilities) <= 0)


@pytest.mark.integration
def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    _, workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    stored = verdicts.read(str(workdir))
    for name in ("closed_forms", "variance_theory", "variance", "max_error", "mean"):
        assert stored[name].outcome == Outcome.HOLDS, stored[name]
        assert stored[name].sentence() in summary
    # The records keep the draws of |f|_inf: its interquartile range has a bootstrap SE.
    assert stored["tighter"].outcome != Outcome.NOT_TESTED
    assert "bootstrap SEs" in stored["tighter"].evidence


def test_a_variance_reversal_without_a_margin_is_not_resolved():
    rows = [
        {
            "delta": 1.0,
            "embedding": e,
            "variance_mc": mc,
            "variance_se": 0.01,
            "variance_theory": t,
            "z_score": 0.0,
        }
        for e, mc, t in (("phi", 0.5, 0.4), ("psi", 0.3, 0.6))
    ]
    max_rows = [
        {"D": 100, "radius": 3.0, "embedding": e, "max_error_mean": m, "max_error_se": 0.01}
        for e, m in (("phi", 0.1), ("psi", 0.2))
    ]
    config = rff_error_config.get_config("quick")
    config.radii, config.tail_embedding_dim = (3.0,), 100
    config.powered = True  # judged as a run sized to test the claims
    spread = np.random.default_rng(0).normal(size=400)
    results = {
        "variance_rows": rows,
        "max_rows": max_rows,
        # psi's draws twice as spread as phi's: wider, beyond the 10% margin.
        "region_max": {"phi": (1 + 0.1 * spread).tolist(), "psi": (1 + 0.2 * spread).tolist()},
    }
    judged = rff_error.judge(results, config).given
    assert judged["tighter"].outcome == Outcome.DOES_NOT_HOLD
    results["region_max"]["psi"] = (1 + 0.05 * spread).tolist()  # half as spread
    assert rff_error.judge(results, config).given["tighter"].outcome == Outcome.HOLDS
    assert judged["variance_theory"].outcome == Outcome.HOLDS  # closed forms: psi above
    # psi below phi by 14 SE in the Monte Carlo: against the claim, which declares no margin.
    assert judged["variance"].outcome == Outcome.NOT_RESOLVED
    assert judged["max_error"].outcome == Outcome.HOLDS


def test_rings_cover_the_region_and_nest():
    config = rff_error_config.get_config("quick")
    points, rings = rff_error.grid_and_rings(config)
    assert points.shape == (config.grid_points, config.dim)
    assert rings.min() == 0 and rings.max() == len(config.radii) - 1
    # the pair (0, 0) lies in the smallest radius, the corners in the last one
    n = config.grid_points
    assert rings[(n // 2) * n + n // 2] == 0 and rings[0] == len(config.radii) - 1


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("variance_embedding_dim", 101, "even"),
        ("embedding_dims", (50, 99), "even"),
        ("tail_embedding_dim", 64, "tail_embedding_dim"),
        ("radii", (0.5, 2.0), "region_radius"),
        ("radii", (1.0, 0.5, 3.0), "increasing"),
    ],
)
def test_bad_config_raises(tmp_path, field, value, match):
    config = rff_error_config.get_config("quick")
    config[field] = value
    with pytest.raises(ValueError, match=match):
        run_experiment(config, str(tmp_path))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            (0.0, float("nan")),
            r"config\.distances must be finite and in \[0, inf\), got \(0\.0, nan\)",
        ),
        ((-1.0, 1.0), r"config\.distances must be finite and in \[0, inf\)"),
        ((), r"config\.distances must not be empty"),
    ],
)
def test_validation_checks_the_distances(value, match):
    config = rff_error_config.get_config("quick")
    config.distances = value
    with pytest.raises(ValueError, match=match):
        rff_error.validate_config(config)


def test_config_variants():
    full, quick = rff_error_config.get_config(), rff_error_config.get_config("quick")
    assert full.tail_embedding_dim == 500 and full.region_radius == 3.0
    assert quick.num_max_draws < full.num_max_draws
    with pytest.raises(ValueError, match="config variant"):
        rff_error_config.get_config("huge")


def test_figures_say_what_their_error_bars_are(monkeypatch, tmp_path):
    # The committed figures drew ± 2 SE bars that neither the figure nor the summary named.
    texts = committed_figure_texts(monkeypatch, "rff_error", tmp_path)
    for figure in ("variance.png", "max_error_radius.png"):
        assert "2 SE" in texts[figure], (figure, texts[figure])
