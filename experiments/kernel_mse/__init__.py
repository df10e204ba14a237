"""Monte Carlo MSE of positive random features per coupling, beside the closed forms (SimRF
Fig. 6, Sec. 5.1).

For each |x+y| = v on the config's grid the inputs are x = y = (v/2) u for one random unit u
(the MSE depends on the inputs only through |x|, |y| and v). For each coupling, ``num_draws``
independent projections estimate K(x, y) = exp(-|x-y|^2/2) by phi(x).phi(y) with
Gaussian-kernel positive features; the squared errors give the MSE and its standard error.
``measure`` computes the rows; ``report`` writes the table, the figure (MSE ratio to IID on a
log axis: it spans decades, down to the small-v SimRF ratio ~0.008 at d = 64) and the summary
(claims and verdicts from ``experiments/kernel_mse/summary.md``).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, stats, verdicts
from experiments.core.stats import Estimate
from experiments.core.study import Study
from experiments.core.validate import (
    require_couplings_draw,
    require_int,
    require_names,
    require_no_repeats,
    require_positive,
)
from rfjax import features, kernels, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Simplex Random Features (Reid et al., ICML 2023)",
    order=10,
    reproduces="SimRF Fig. 6: PRF MSE ratios vs \\|x+y\\|, theory and Monte Carlo",
)

CLOSED_FORMS = theory.COUPLINGS
LABELS = outputs.COUPLING_LABELS


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks coupling names and sizes before anything runs.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "couplings", "norms_of_sum")
    require_names(config, "couplings", projections.available())
    require_positive(config, "dim", "num_features", "norms_of_sum", "num_draws", "draws_per_chunk")
    require_int(config, "dim", "num_features", minimum=1)
    require_couplings_draw(config, "couplings", config.dim, config.num_features)


def make_inputs(key: jax.Array, dim: int, norms_of_sum: np.ndarray) -> tuple[jax.Array, ...]:
    """x = y = (v/2) u for a random unit vector u: |x+y| = v, shape (len(v), dim)."""
    direction = jax.random.normal(key, (dim,))
    direction = direction / jnp.linalg.norm(direction)
    x = jnp.asarray(norms_of_sum)[:, None] / 2 * direction
    return x, x


@functools.partial(jax.jit, static_argnums=(0, 1))
def _squared_errors(
    coupling: str, num_features: int, keys: jax.Array, x: jax.Array, y: jax.Array
) -> jax.Array:
    """(K_hat - K)^2 for each key (rows) and input pair (columns)."""
    sampler = projections.get(coupling)
    exact = kernels.gaussian(x, y)

    def one_draw(key):
        projection = sampler(key, x.shape[-1], num_features)
        phi_x = features.positive_features(x, projection, kernel="gaussian")
        phi_y = features.positive_features(y, projection, kernel="gaussian")
        return (jnp.sum(phi_x * phi_y, axis=-1) - exact) ** 2

    return jax.vmap(one_draw)(keys)


def monte_carlo_mse(
    key: jax.Array,
    coupling: str,
    num_features: int,
    x: jax.Array,
    y: jax.Array,
    num_draws: int,
    draws_per_chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean squared error and its standard error over ``num_draws`` projections."""
    draw = functools.partial(_squared_errors, coupling, num_features, x=x, y=y)
    return stats.chunked_mean_se(
        draw, key, num_draws, draws_per_chunk, f"{LABELS[coupling]:>7} draws"
    )


def closed_form_mse(x: np.ndarray, num_features: int, coupling: str) -> np.ndarray:
    """Eq. 11 at the pairs (x, x) in float64; nan for couplings without a closed form."""
    if coupling not in CLOSED_FORMS:
        return np.full(x.shape[:-1], np.nan)
    with jax.enable_x64(True):
        return np.asarray(theory.prf_mse(x, x, num_features, coupling=coupling), np.float64)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> list[dict]:
    """One row per (v, coupling): Monte Carlo MSE, its SE, theory, and ratios to IID theory.
    Writes nothing."""
    del workdir  # nothing to resume
    input_key, draw_key = jax.random.split(jax.random.key(config.seed))
    norms_of_sum = np.asarray(config.norms_of_sum, np.float64)
    x, y = make_inputs(input_key, config.dim, norms_of_sum)
    theory_mse = functools.partial(closed_form_mse, np.asarray(x, np.float64), config.num_features)
    iid_theory = theory_mse("gaussian")
    rows = []
    for index, coupling in enumerate(config.couplings):
        mse, se = monte_carlo_mse(
            jax.random.fold_in(draw_key, index),
            coupling,
            config.num_features,
            x,
            y,
            config.num_draws,
            config.draws_per_chunk,
        )
        predicted = theory_mse(coupling)
        for i, v in enumerate(norms_of_sum):
            rows.append(
                {
                    "v": float(v),
                    "coupling": coupling,
                    "mse_mc": float(mse[i]),
                    "mse_se": float(se[i]),
                    "mse_theory": float(predicted[i]),
                    "ratio_mc": float(mse[i] / iid_theory[i]),
                    "ratio_se": float(se[i] / iid_theory[i]),
                    "ratio_theory": float(predicted[i] / iid_theory[i]),
                    "z_score": float((mse[i] - predicted[i]) / se[i]),
                }
            )
    return rows


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """MSE ratio to IID vs v on log axes: theory as lines, Monte Carlo as points with ±2 SE
    bars, and the small-v limit of the SimRF ratio (Sec. 5.1) as a dotted line."""
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    dense_v = np.geomspace(min(config.norms_of_sum), max(config.norms_of_sum), 60)
    direction = np.zeros(config.dim)
    direction[0] = 1.0
    dense_x = dense_v[:, None] / 2 * direction
    iid = closed_form_mse(dense_x, config.num_features, "gaussian")
    for index, coupling in enumerate(config.couplings):
        color = f"C{index}"
        if coupling in CLOSED_FORMS:
            curve = closed_form_mse(dense_x, config.num_features, coupling)
            ax.plot(dense_v, curve / iid, color=color, label=f"{LABELS[coupling]} theory")
        mine = [row for row in rows if row["coupling"] == coupling]
        ax.errorbar(
            [r["v"] for r in mine],
            [r["ratio_mc"] for r in mine],
            yerr=[2 * r["ratio_se"] for r in mine],
            fmt="o",
            color=color,
            ms=4,
            capsize=2,
            label=f"{LABELS[coupling]} Monte Carlo ±2 SE",
        )
    limit = small_v_limit(config)
    if limit is not None:
        ax.axhline(limit, color="grey", linestyle=":", linewidth=1, label="SimRF v -> 0 limit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|x + y|")
    ax.set_ylabel("MSE / MSE(IID theory)")
    ax.set_title(f"Gaussian-kernel PRF MSE, d = {config.dim}, m = {config.num_features}")
    ax.legend(fontsize=7, ncol=2)
    outputs.save_figure(fig, path)


def _nan_note(config: ml_collections.ConfigDict) -> str:
    """Why the theory columns are nan for some couplings ("" when all have closed forms)."""
    reasons = {c: theory.no_closed_form_reason(c) for c in config.couplings}
    note = outputs.nan_note("`mse_theory`, `ratio_theory` and `z_score`", reasons)
    return f"{note}\n\n" if note else ""


def small_v_limit(config: ml_collections.ConfigDict) -> float | None:
    """SimRF's MSE ratio to IID as v -> 0 (Sec. 5.1), or None if m > d (no single block)."""
    if config.num_features > config.dim or "simplex" not in config.couplings:
        return None
    return theory.small_v_prefactor(
        "simplex", config.dim, config.num_features
    ) / theory.small_v_prefactor("gaussian", config.dim, config.num_features)


def _ratio(row: dict, n: int) -> Estimate:
    """A cell's Monte Carlo MSE in units of the IID closed form."""
    return Estimate(row["ratio_mc"], row["ratio_se"], n)


def judge(rows: list[dict], config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares."""
    judge = verdicts.Verdicts(config)
    n, by = config.num_draws, {(r["coupling"], r["v"]): r for r in rows}
    grid = sorted({r["v"] for r in rows})
    judge.closed_form_agreement(
        "exact",
        rows,
        measured="mse_mc",
        closed_form="mse_theory",
        se="mse_se",
        draws=n,
        cell=lambda r: f"{LABELS[r['coupling']]}, v = {r['v']:g}",
    )
    steps = (("simplex", "orthogonal"), ("orthogonal", "gaussian"))
    if not {"gaussian", "orthogonal", "simplex"} <= set(config.couplings):
        for name in ("order_theory", "simrf_below_orf", "orf_below_iid"):
            judge.not_tested(name, "needs the IID, ORF and SimRF couplings")
    else:
        gap = min(
            by[w, v]["ratio_theory"] - by[b, v]["ratio_theory"] for b, w in steps for v in grid
        )
        judge.exact("order_theory", gap, effect="smallest closed-form gap over v and both steps")
        for name, (better, worse) in zip(("simrf_below_orf", "orf_below_iid"), steps, strict=True):
            judge.ordering(
                name,
                {
                    v: stats.independent_difference(
                        _ratio(by[worse, v], n), _ratio(by[better, v], n)
                    )
                    for v in grid
                },
                effect=f"({LABELS[worse]} - {LABELS[better]}) MSE / IID closed form",
                cell_name="v",
                units="draws",
                shared_units=True,
            )
    smallest = min(grid)
    if small_v_limit(config) is None or ("simplex", smallest) not in by:
        judge.not_tested("small_v", "needs SimRF in one block (m <= d)")
    else:
        cell = by["simplex", smallest]
        judge.effect(
            "small_v",
            Estimate(cell["ratio_mc"] - cell["ratio_theory"], cell["ratio_se"], n),
            effect=f"SimRF / IID at v = {smallest:g}: Monte Carlo {cell['ratio_mc']:.5f} minus the "
            f"closed form {cell['ratio_theory']:.5f}",
            units="draws",
        )
    if not {"simplex", "simplex_plus"} <= set(config.couplings):
        judge.not_tested("simrf_plus", "needs SimRF and SimRF+")
    else:
        judge.ordering(
            "simrf_plus",
            {
                v: stats.independent_difference(
                    _ratio(by["simplex_plus", v], n), _ratio(by["simplex", v], n)
                )
                for v in grid
            },
            effect="(SimRF+ - SimRF) MSE / IID closed form",
            cell_name="v",
            units="draws",
            shared_units=True,
        )
    return judge


def headline(rows: list[dict]) -> dict[str, float]:
    """The numbers an ablation compares: each coupling's Monte Carlo MSE ratio to the IID
    closed form, averaged over v (``ratio_<coupling>``)."""
    couplings = dict.fromkeys(r["coupling"] for r in rows)
    return {
        f"ratio_{c}": float(np.mean([r["ratio_mc"] for r in rows if r["coupling"] == c]))
        for c in couplings
    }


def report(rows: list[dict], config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``mse_ratio.png``, ``summary.md``, ``verdicts.json`` and
    ``config.json``."""
    columns = ("v", "coupling", "mse_mc", "mse_se", "mse_theory", "ratio_mc", "ratio_theory")
    table = outputs.markdown_table([{k: row[k] for k in (*columns, "z_score")} for row in rows])
    limit = small_v_limit(config)
    summary = verdicts.write_summary(
        workdir,
        "kernel_mse",
        judge(rows, config),
        config,
        limit="none (m > d)" if limit is None else f"{limit:.5f}",
        table=table,
        nan_note=_nan_note(config),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), rows)
    plot(rows, config, os.path.join(workdir, "mse_ratio.png"))
    print(summary)
    return {"rows": rows}
