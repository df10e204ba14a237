"""The rff_error experiment (Sutherland & Schneider) at its quick size."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import rff_error as rff_error_config
from experiments import rff_error
from experiments.core import stats, verdicts
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
        # the draws of |f|_inf kept for the tail are those of the whole region's max error
        region = rff_error_config.get_config("quick").region_radius
        rows = result["max_rows"]
        (cell,) = [r for r in rows if r["radius"] == region and r["embedding"] == embedding]
        assert np.mean(result["region_max"][embedding]) == pytest.approx(cell["max_error_mean"])


@pytest.mark.integration
def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    _, workdir, result = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    stored = verdicts.read(str(workdir))
    for name in ("closed_forms", "variance_theory", "variance", "max_error", "mean"):
        assert stored[name].outcome == Outcome.HOLDS, stored[name]
        assert stored[name].sentence() in summary
    # The records keep the draws of |f|_inf: its interquartile range has a bootstrap SE.
    assert stored["tighter"].outcome != Outcome.NOT_TESTED
    assert "bootstrap SEs" in stored["tighter"].evidence
    phi, psi = (stats.interquartile_range(result["region_max"][e]) for e in rff_error.EMBEDDINGS)
    assert f"interquartile ranges {phi:.3f} and {psi:.3f}" in summary


def test_rings_cover_the_region_and_nest():
    config = rff_error_config.get_config("quick")
    points, rings = rff_error.grid_and_rings(config)
    assert points.shape == (config.grid_points, config.dim)
    assert rings.min() == 0 and rings.max() == len(config.radii) - 1
    # the pair (0, 0) lies in the smallest radius, the corners in the last one
    n = config.grid_points
    assert rings[(n // 2) * n + n // 2] == 0 and rings[0] == len(config.radii) - 1
    # the last radius is region_radius up to rounding: the corners lie within it
    config.radii = (0.5, 1.5, 3.0 - 1e-6)
    rff_error.validate_config(config)
    _, rings = rff_error.grid_and_rings(config)
    assert rings.max() == rings[0] == len(config.radii) - 1


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("variance_embedding_dim", 101, "even"),
        ("embedding_dims", (50, 99), "even"),
        ("embedding_dims", (100, 100), r"embedding_dims must be without repeats"),
        ("tail_embedding_dim", 64, "tail_embedding_dim"),
        ("radii", (0.5, 2.0), "region_radius"),
        ("radii", (1.0, 0.5, 3.0), "increasing"),
        ("radii", (1.5, 1.5, 3.0), "increasing"),
        ("radii", (-1.0, 3.0), "radii"),
        ("grid_points", 2, "grid_points"),
        # no point of a 4-point grid on [-3, 3] within the first radius 0.5: it had a max of -inf
        ("grid_points", 4, r"grid_points = 4 grid's point nearest 0 is at \|x\| = 1;"),
        ("num_max_draws", 1, "num_max_draws"),
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
        ((0.0, 1.0, 1.0), r"config\.distances must be without repeats"),
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


def _config(**changes) -> ml_collections.ConfigDict:
    """The quick config with ``changes``."""
    config = rff_error_config.get_config("quick")
    config.update(changes)
    return config


@pytest.mark.parametrize("embedding", rff_error.EMBEDDINGS)
def test_errors_match_a_direct_computation_at_a_non_unit_lengthscale(embedding):
    # sup |k_hat - k| within each radius and (k_hat - k)^2 at (x, 0), computed directly from
    # the same draws' features of x / lengthscale at lengthscale 1 and the kernel in NumPy.
    lengthscale, width = 1.5, 8
    # grid spacing 0.75: no grid point has 0.5 < |x| <= 0.6, so that radius adds no pair
    config = _config(grid_points=9, lengthscale=lengthscale, radii=(0.5, 0.6, 1.5, 3.0))
    points, rings = rff_error.grid_and_rings(config)
    keys = jax.random.split(jax.random.key(1), 3)
    x = jnp.asarray(points, jnp.float32)
    maxima = rff_error._max_errors(
        embedding, width, lengthscale, len(config.radii), keys, x, jnp.asarray(rings)
    )
    squared = rff_error._squared_errors(embedding, width, lengthscale, keys, x)
    exact = np.exp(-np.sum((points[:, None] - points[None]) ** 2, axis=-1) / (2 * lengthscale**2))
    radius = np.abs(points).max(axis=1)
    origin = int(np.argmin(radius))
    for key, row_max, row_squared in zip(keys, maxima, squared, strict=True):
        z = np.asarray(rff_error.embed(embedding, key, x / lengthscale, width, 1.0), np.float64)
        error = z @ z.T - exact
        within = [
            np.abs(error[radius <= r + 1e-9][:, radius <= r + 1e-9]).max() for r in config.radii
        ]
        np.testing.assert_allclose(row_max, within, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(row_squared, error[:, origin] ** 2, rtol=1e-3, atol=1e-6)


def test_variance_rows_hold_the_closed_forms_at_the_lengthscale():
    config = _config(
        lengthscale=2.0,
        dim=2,
        variance_embedding_dim=8,
        distances=(0.0, 1.0, 3.0),
        num_variance_draws=400,
        draws_per_chunk=400,
    )
    rows = rff_error.measure_variance(config, jax.random.key(0))
    assert [(r["embedding"], r["delta"]) for r in rows] == [
        (e, d) for e in rff_error.EMBEDDINGS for d in config.distances
    ]
    for row in rows:
        k, k2 = (math.exp(-((s * row["delta"]) ** 2) / (2 * 2.0**2)) for s in (1, 2))
        # Var phi = [1 + k(2 Delta) - 2 k^2] / D, Var psi = [1 + k(2 Delta) / 2 - k^2] / D
        closed = 1 + k2 - 2 * k**2 if row["embedding"] == "phi" else 1 + k2 / 2 - k**2
        assert row["variance_theory"] == pytest.approx(closed / 8, rel=1e-6, abs=1e-12), row
        if row["variance_theory"] == 0.0:
            assert math.isnan(row["z_score"])
            continue
        z = (row["variance_mc"] - row["variance_theory"]) / row["variance_se"]
        assert row["z_score"] == pytest.approx(z) and abs(z) <= 4, row


def test_tail_probabilities_are_those_of_the_tail_width():
    config = _config(embedding_dims=(50, 100), num_max_draws=4, num_epsilons=3)
    region_max = {
        ("phi", 100): np.array([0.1, 0.2, 0.3, 0.4]),
        ("psi", 100): np.array([0.2, 0.4, 0.6, 0.8]),
        **{(e, 50): np.full(4, 9.0) for e in rff_error.EMBEDDINGS},  # another D: not read
    }
    rows = rff_error.tail_probabilities(config, region_max)
    assert [r["eps"] for r in rows] == pytest.approx([0.0, 0.4, 0.8])
    assert [r["prob_phi"] for r in rows] == [1.0, 0.0, 0.0]  # Pr(|f|_inf > eps), strictly
    assert [r["prob_psi"] for r in rows] == [1.0, 0.5, 0.0]
    assert [r["prob_psi_se"] for r in rows] == pytest.approx([0.0, 0.25, 0.0])  # of 4 draws


def _draws(phi_spread: float, psi_spread: float) -> dict[str, list[float]]:
    """400 draws of |f|_inf per embedding: the same normal noise of each spread about 1."""
    noise = np.random.default_rng(0).normal(size=400)
    return {e: (1 + s * noise).tolist() for e, s in (("phi", phi_spread), ("psi", psi_spread))}


def _judged(variance: dict, max_error: dict, region_max: dict | None = None, **changes) -> dict:
    """The verdicts on synthetic results: ``variance[Delta][e] = (Monte Carlo, closed form)``
    and ``max_error[(D, r)][e]`` (each with SE 0.01) and the draws ``region_max`` of |f|_inf
    (default ``_draws(0.1, 0.05)``), in a powered config with the D and radii given."""
    variance_rows = [
        {"delta": d, "embedding": e, "variance_mc": mc, "variance_se": 0.01}
        | {"variance_theory": theory, "z_score": (mc - theory) / 0.01}
        for d, cell in variance.items()
        for e, (mc, theory) in cell.items()
    ]
    max_rows = [
        {"D": D, "radius": r, "embedding": e, "max_error_mean": m, "max_error_se": 0.01}
        for (D, r), cell in max_error.items()
        for e, m in cell.items()
    ]
    dims, radii = (tuple(sorted({cell[i] for cell in max_error})) for i in (0, 1))
    config = _config(embedding_dims=dims, tail_embedding_dim=dims[-1], radii=radii, **changes)
    config.powered = True  # judged as a run sized to test the claims
    results = {
        "variance_rows": variance_rows,
        "max_rows": max_rows,
        "region_max": _draws(0.1, 0.05) if region_max is None else region_max,
    }
    return rff_error.judge(results, config).given


def test_a_variance_reversal_without_a_margin_is_not_resolved():
    variance = {1.0: {"phi": (0.5, 0.4), "psi": (0.3, 0.6)}}  # closed forms: psi above
    max_error = {(100, 3.0): {"phi": 0.1, "psi": 0.2}}
    judged = _judged(variance, max_error, _draws(0.1, 0.2))
    # psi's draws twice as spread as phi's: wider, beyond the 10% margin.
    assert judged["tighter"].outcome == Outcome.DOES_NOT_HOLD
    tighter = _judged(variance, max_error, _draws(0.1, 0.05))["tighter"]  # half as spread
    assert tighter.outcome == Outcome.HOLDS
    assert judged["variance_theory"].outcome == Outcome.HOLDS
    # psi below phi by 14 SE in the Monte Carlo: against the claim, which declares no margin.
    assert judged["variance"].outcome == Outcome.NOT_RESOLVED
    assert judged["max_error"].outcome == Outcome.HOLDS


def test_orderings_bound_the_se_of_cells_that_share_draws():
    # psi - phi = 0.02 +- 0.014 in each of 4 cells: 1.4 SE with the shared-draws bound (the
    # cells of an embedding share their draws), 2.8 SE if they were independent.
    variance = {d: {"phi": (0.10, 0.10), "psi": (0.12, 0.12)} for d in (0.5, 1.0, 1.5, 2.0)}
    max_error = {(D, r): {"phi": 0.1, "psi": 0.12} for D in (50, 100) for r in (1.5, 3.0)}
    judged = _judged(variance, max_error, num_max_draws=300, num_variance_draws=2000)
    for name in ("variance", "max_error"):
        assert judged[name].outcome == Outcome.NOT_RESOLVED, judged[name]
        assert "SE bounded for units shared by the cells" in judged[name].evidence
    # each cell counts the draws of both embeddings
    assert "600 draws)" in judged["max_error"].evidence
    assert "4000 draws)" in judged["variance"].evidence


def test_the_mean_claim_reads_the_whole_region_and_closed_forms_every_cell():
    variance = {
        1.0: {"phi": (0.1, 0.1), "psi": (0.2, 0.3)},  # psi 10 SE off its closed form
        2.0: {"phi": (0.2, 0.2), "psi": (0.15, 0.15)},  # closed forms: psi below phi
    }
    # psi above phi over the whole region (r = 3), below it within r = 1.5
    max_error = {(100, 1.5): {"phi": 0.2, "psi": 0.1}, (100, 3.0): {"phi": 0.1, "psi": 0.3}}
    judged = _judged(variance, max_error)
    assert judged["mean"].outcome == Outcome.HOLDS
    assert "+0.2" in judged["mean"].evidence
    assert judged["closed_forms"].outcome == Outcome.NOT_RESOLVED  # no margin declared
    assert "(psi, Delta = 1)" in judged["closed_forms"].evidence
    assert judged["variance_theory"].outcome == Outcome.DOES_NOT_HOLD
    assert "-0.05" in judged["variance_theory"].evidence


def test_the_spread_margin_is_a_fraction_of_phis_spread():
    # Two-valued draws: interquartile ranges 1 (phi) and 1.105 (psi) in every resample. psi's
    # is 10.5% of phi's wider: beyond the 10% margin of phi's (not of psi's, 11.05%).
    halves = np.repeat([0.0, 1.0], 200)
    variance = {1.0: {"phi": (0.1, 0.1), "psi": (0.2, 0.2)}}
    max_error = {(100, 3.0): {"phi": 0.1, "psi": 0.2}}
    tighter = _judged(variance, max_error, {"phi": halves, "psi": 1.105 * halves})["tighter"]
    assert tighter.outcome == Outcome.DOES_NOT_HOLD, tighter


def test_tables_and_headline_of_the_summary():
    variance = {d: {"phi": (0.1, 0.1), "psi": (0.2, 0.2)} for d in (0.5, 0.7)}
    max_error = {(D, r): {"phi": 0.1, "psi": 0.3} for D in (50, 100) for r in (1.5, 3.0)}
    max_error[(50, 3.0)]["psi"] = 0.05  # the one cell where psi is lower
    config = _config(embedding_dims=(50, 100), radii=(1.5, 3.0), variance_embedding_dim=10)
    variance_rows = [
        {"delta": d, "embedding": e, "variance_mc": mc, "variance_se": 0.01}
        | {"variance_theory": t, "z_score": (mc - t) / 0.01 + (d == 0.7)}
        for d, cell in variance.items()
        for e, (mc, t) in cell.items()
    ]
    max_rows = [
        {"D": D, "radius": r, "embedding": e, "max_error_mean": m, "max_error_se": 0.01}
        for (D, r), cell in max_error.items()
        for e, m in cell.items()
    ]
    # D Var at the Delta that are multiples of 0.5 only
    assert rff_error.variance_table(variance_rows, config) == [
        {"Delta": 0.5, "embedding": e, "D Var (MC)": v, "D Var (theory)": v, "z": 0.0}
        for e, v in (("phi", 1.0), ("psi", 2.0))
    ]
    table = rff_error.max_error_table(max_rows, config)  # the whole region, per D
    assert [r["D"] for r in table] == [50, 100]
    assert [r["E max err psi"] for r in table] == [0.05, 0.3]
    assert [r["psi / phi"] for r in table] == pytest.approx([0.5, 3.0])
    results = {"variance_rows": variance_rows, "max_rows": max_rows}
    headline = rff_error._headline(results, {e: (0.0, 0.5, 1.0) for e in rff_error.EMBEDDINGS})
    assert headline == {
        "max_abs_z": 1.0,
        "variance_gap_resolved": 2,
        "phi_lower_max_error_cells": 3,
        "psi_lower_max_error_cells": 1,
        "cells": 4,
        "median_max_error": {"phi": 0.5, "psi": 0.5},
    }
