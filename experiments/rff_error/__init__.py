"""Variance and max error of the RFF embeddings phi (sin/cos) and psi (cos + offset).

Sutherland & Schneider, "On the Error of Random Fourier Features" (seed 004, arXiv:1506.02785).
At equal output width D, phi = ``features.fourier_features`` with D/2 i.i.d. Gaussian
frequencies and psi = ``features.cosine_features`` with D frequencies and ``random_offsets``.
The closed-form variances are ``theory.rff_mse`` (the estimates are unbiased, so MSE = variance)
with m = D/2 (``"sincos"``) and m = D (``"cosine_bias"``).
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, stats, validate, verdicts
from experiments.core.stats import Estimate, draw_in_chunks, mean_se
from experiments.core.study import Study
from rfjax import features, kernels, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="On the Error of Random Fourier Features (Sutherland & Schneider, UAI 2015)",
    order=50,
    reproduces=(
        "Sutherland & Schneider Fig. 1, 3, 4: variance and max error of sin/cos vs cos+offset RFF"
    ),
)

EMBEDDINGS = ("phi", "psi")
THEORY_NAMES: dict[str, Literal["sincos", "cosine_bias"]] = {"phi": "sincos", "psi": "cosine_bias"}
LABELS = {"phi": "phi (sin/cos, D/2 freqs)", "psi": "psi (cos + offset, D freqs)"}
STYLES = {"phi": "-", "psi": "--"}


def embed(
    embedding: str, key: jax.Array, x: jax.Array, embedding_dim: int, lengthscale: float
) -> jax.Array:
    """phi(x) or psi(x) of output width D = ``embedding_dim`` from one key: ``(n, d) -> (n, D)``."""
    dim = x.shape[-1]
    if embedding == "phi":
        projection = projections.gaussian(key, dim, embedding_dim // 2)
        return features.fourier_features(x, projection, lengthscale=lengthscale)
    projection_key, offset_key = jax.random.split(key)
    projection = projections.gaussian(projection_key, dim, embedding_dim)
    offsets = features.random_offsets(offset_key, embedding_dim)
    return features.cosine_features(x, projection, offsets, lengthscale=lengthscale)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _squared_errors(
    embedding: str, embedding_dim: int, lengthscale: float, keys: jax.Array, x: jax.Array
) -> jax.Array:
    """(k_hat(x_j, 0) - k(x_j, 0))^2 per key (rows) and point x_j (columns)."""
    origin = jnp.zeros_like(x[:1])
    exact = kernels.gaussian(x, origin, lengthscale=lengthscale)

    def one_draw(key):
        both = embed(embedding, key, jnp.concatenate([x, origin]), embedding_dim, lengthscale)
        return (both[:-1] @ both[-1] - exact) ** 2

    return jax.vmap(one_draw)(keys)


def measure_variance(config: ml_collections.ConfigDict, key: jax.Array) -> list[dict]:
    """Part 1: one row per (Delta, embedding) with the Monte Carlo variance and the closed form."""
    distances = np.asarray(config.distances, np.float64)
    x = np.zeros((distances.size, config.dim))
    x[:, 0] = distances
    scaled = x / config.lengthscale  # theory.rff_mse is for unit lengthscale
    D = config.variance_embedding_dim
    rows = []
    for index, embedding in enumerate(EMBEDDINGS):
        draw = functools.partial(
            _squared_errors, embedding, D, config.lengthscale, x=jnp.asarray(x, jnp.float32)
        )
        variance, se = mean_se(
            draw_in_chunks(
                draw,
                jax.random.fold_in(key, index),
                config.num_variance_draws,
                config.draws_per_chunk,
                f"variance {embedding}",
            )
        )
        num_frequencies = D // 2 if embedding == "phi" else D
        predicted = theory.rff_mse(
            scaled, np.zeros_like(scaled), num_frequencies, embedding=THEORY_NAMES[embedding]
        )
        for j, delta in enumerate(distances):
            exact_zero = predicted[j] == 0.0  # phi at Delta = 0: no variance, z undefined
            rows.append(
                {
                    "delta": float(delta),
                    "embedding": embedding,
                    "D": D,
                    "variance_mc": float(variance[j]),
                    "variance_se": float(se[j]),
                    "variance_theory": float(predicted[j]),
                    "z_score": float("nan")
                    if exact_zero
                    else float((variance[j] - predicted[j]) / se[j]),
                }
            )
    return rows


_RADIUS_TOLERANCE = 1e-9  # relative to region_radius: a grid point on a radius lies within it


def _grid_line(config: ml_collections.ConfigDict) -> np.ndarray:
    """The grid's coordinates on [-R, R]."""
    return np.linspace(-config.region_radius, config.region_radius, config.grid_points)


def grid_and_rings(config: ml_collections.ConfigDict) -> tuple[np.ndarray, np.ndarray]:
    """Grid points on [-R, R] (first coordinate; the rest zero) and the ring of each grid pair:
    the index k of the smallest radius r_k with |x_i|, |x_j| <= r_k, flattened to ``(n * n,)``.
    The last radius is R up to rounding (``validate_config``), so every pair has a ring."""
    line = _grid_line(config)
    points = np.zeros((line.size, config.dim))
    points[:, 0] = line
    pair_radius = np.maximum(np.abs(line)[:, None], np.abs(line)[None, :]).ravel()
    tolerance = _RADIUS_TOLERANCE * config.region_radius
    rings = np.searchsorted(np.asarray(config.radii), pair_radius - tolerance, side="left")
    return points, np.minimum(rings, len(config.radii) - 1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _max_errors(
    embedding: str,
    embedding_dim: int,
    lengthscale: float,
    num_radii: int,
    keys: jax.Array,
    points: jax.Array,
    rings: jax.Array,
) -> jax.Array:
    """sup |k_hat - k| over the grid pairs within each radius, per key: ``(keys, num_radii)``.

    The max per ring (segment max), then a running max over the nested rings.
    """
    exact = kernels.gram(kernels.gaussian, points, points, lengthscale=lengthscale)

    def one_draw(key):
        z = embed(embedding, key, points, embedding_dim, lengthscale)
        error = jnp.abs(z @ z.T - exact).ravel()
        per_ring = jax.ops.segment_max(error, rings, num_segments=num_radii)
        return jax.lax.cummax(per_ring)

    return jax.vmap(one_draw)(keys)


def measure_max_error(
    config: ml_collections.ConfigDict, key: jax.Array
) -> tuple[list[dict], dict[tuple[str, int], np.ndarray]]:
    """Part 2: rows per (D, embedding, r) of the average max error within radius r, and the
    draws of the max error over the whole region per (embedding, D)."""
    grid, ring_of_pair = grid_and_rings(config)
    points, rings = jnp.asarray(grid, jnp.float32), jnp.asarray(ring_of_pair)
    rows: list[dict] = []
    region_max: dict[tuple[str, int], np.ndarray] = {}
    for d_index, D in enumerate(config.embedding_dims):
        for e_index, embedding in enumerate(EMBEDDINGS):
            draw = functools.partial(
                _max_errors,
                embedding,
                D,
                config.lengthscale,
                len(config.radii),
                points=points,
                rings=rings,
            )
            maxima = draw_in_chunks(
                draw,
                jax.random.fold_in(key, 2 * d_index + e_index),
                config.num_max_draws,
                config.draws_per_chunk,
                f"max error {embedding} D={D}",
            )
            region_max[(embedding, D)] = maxima[:, -1]
            mean, se = mean_se(maxima)
            for r, m, s in zip(config.radii, mean, se, strict=True):
                rows.append(
                    {
                        "D": D,
                        "embedding": embedding,
                        "radius": float(r),
                        "max_error_mean": float(m),
                        "max_error_se": float(s),
                    }
                )
    return rows, region_max


def tail_probabilities(
    config: ml_collections.ConfigDict, region_max: dict[tuple[str, int], np.ndarray]
) -> list[dict]:
    """Pr(|f|_inf > eps) over the region at D = ``tail_embedding_dim`` with binomial SEs."""
    D = config.tail_embedding_dim
    largest = max(region_max[(e, D)].max() for e in EMBEDDINGS)
    epsilons = np.linspace(0.0, largest, config.num_epsilons)
    rows = []
    for eps in epsilons:
        row = {"eps": float(eps)}
        for embedding in EMBEDDINGS:
            p = float(np.mean(region_max[(embedding, D)] > eps))
            row[f"prob_{embedding}"] = p
            row[f"prob_{embedding}_se"] = float(np.sqrt(p * (1 - p) / config.num_max_draws))
        rows.append(row)
    return rows


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the config field that is out of range."""
    validate.require_int(config, "variance_embedding_dim", "embedding_dims", minimum=2)
    for key in ("variance_embedding_dim", "embedding_dims"):
        value = config[key]
        even = all(D % 2 == 0 for D in (value if isinstance(value, tuple) else (value,)))
        validate.require(even, key, value, "even (phi uses D/2 frequencies)")
    validate.require(
        config.tail_embedding_dim in config.embedding_dims,
        "tail_embedding_dim",
        config.tail_embedding_dim,
        f"one of embedding_dims {config.embedding_dims}",
    )
    validate.require_nonempty(config, "radii", "distances")
    validate.require_no_repeats(config, "embedding_dims", "distances")
    validate.require_interval(config, "distances", interval="[0, inf)")
    validate.require_positive(config, "radii", "lengthscale", "region_radius")
    radii = np.asarray(config.radii, np.float64)
    validate.require(bool(np.all(np.diff(radii) > 0)), "radii", config.radii, "increasing")
    validate.require(
        bool(np.isclose(radii[-1], config.region_radius)),
        "radii",
        config.radii,
        f"ending at region_radius = {config.region_radius} (the tail probability uses the "
        "whole region)",
    )
    validate.require_int(config, "grid_points", minimum=3)
    nearest = float(np.abs(_grid_line(config)).min())
    validate.require(
        nearest <= radii[0] + _RADIUS_TOLERANCE * config.region_radius,
        "radii",
        config.radii,
        f"a tuple whose first radius holds a grid point (the grid_points = {config.grid_points} "
        f"grid's point nearest 0 is at |x| = {nearest:g}; an odd grid_points puts one at 0)",
    )
    validate.require_int(
        config, "num_max_draws", "num_variance_draws", "bootstrap_resamples", minimum=2
    )
    validate.require_int(config, "dim", "draws_per_chunk", "num_epsilons", minimum=1)


def plot_variance(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """D * Var vs Delta (Fig. 1): closed forms as lines, Monte Carlo with 2-SE bars."""
    fig, ax = plt.subplots(figsize=(6, 4))
    D = config.variance_embedding_dim
    dense = np.linspace(0.0, max(config.distances), 200)
    dense_x = np.zeros((dense.size, config.dim))
    dense_x[:, 0] = dense / config.lengthscale
    for index, embedding in enumerate(EMBEDDINGS):
        m = D // 2 if embedding == "phi" else D
        curve = D * theory.rff_mse(
            dense_x, np.zeros_like(dense_x), m, embedding=THEORY_NAMES[embedding]
        )
        ax.plot(dense, curve, STYLES[embedding], color=f"C{index}", label=f"{embedding} theory")
        mine = [r for r in rows if r["embedding"] == embedding]
        ax.errorbar(
            [r["delta"] for r in mine],
            [D * r["variance_mc"] for r in mine],
            yerr=[2 * D * r["variance_se"] for r in mine],
            fmt="o",
            ms=3,
            capsize=2,
            color=f"C{index}",
            label=f"{embedding} Monte Carlo",
        )
    ax.set_xlabel("Delta = |x - y|")
    ax.set_ylabel("D x Var k_hat")
    ax.set_title(
        f"Variance per dimension, Gaussian kernel (sigma = {config.lengthscale:g}, D = {D}; "
        "bars: ± 2 SE)"
    )
    ax.legend(fontsize=8)
    outputs.save_figure(fig, path)


def plot_max_error(rows: list[dict], path: str) -> None:
    """Average max error within radius r (Fig. 3): phi solid, psi dashed, one colour per D."""
    fig, ax = plt.subplots(figsize=(6, 4))
    dims = sorted({r["D"] for r in rows})
    for d_index, D in enumerate(dims):
        for embedding in EMBEDDINGS:
            mine = [r for r in rows if r["D"] == D and r["embedding"] == embedding]
            ax.errorbar(
                [r["radius"] for r in mine],
                [r["max_error_mean"] for r in mine],
                yerr=[2 * r["max_error_se"] for r in mine],
                fmt=STYLES[embedding],
                color=f"C{d_index}",
                label=f"{embedding}, D = {D}",
            )
    ax.set_xlabel("radius r (sup over |x|, |y| <= r)")
    ax.set_ylabel("E sup |k_hat - k|")
    ax.set_title("Average max error within a radius (phi solid, psi dashed; bars: ± 2 SE)")
    ax.legend(fontsize=8, ncol=2)
    outputs.save_figure(fig, path)


def plot_tail(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Pr(|f|_inf > eps) on the region (Fig. 4)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    eps = [r["eps"] for r in rows]
    for index, embedding in enumerate(EMBEDDINGS):
        ax.plot(
            eps,
            [r[f"prob_{embedding}"] for r in rows],
            STYLES[embedding],
            color=f"C{index}",
            label=LABELS[embedding],
        )
    ax.set_xlabel("eps")
    ax.set_ylabel("Pr(|f|_inf > eps)")
    R = config.region_radius
    ax.set_title(f"Tail of the max error on [{-R:g}, {R:g}], D = {config.tail_embedding_dim}")
    ax.legend(fontsize=8)
    outputs.save_figure(fig, path)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """The variance rows (part 1), the max-error rows and the tail probabilities (part 2).
    Writes nothing."""
    del workdir  # nothing to resume
    validate_config(config)
    variance_key, max_key = jax.random.split(jax.random.key(config.seed))
    variance_rows = measure_variance(config, variance_key)
    max_rows, region_max = measure_max_error(config, max_key)
    return {
        "variance_rows": variance_rows,
        "max_rows": max_rows,
        "tail_rows": tail_probabilities(config, region_max),
        # The draws of |f|_inf over the region at the tail's D: its quantiles and their
        # bootstrap SEs come from them.
        "region_max": {e: region_max[(e, config.tail_embedding_dim)].tolist() for e in EMBEDDINGS},
    }


def _median_and_quartiles(draws) -> tuple[float, ...]:
    """The 25%, 50% and 75% quantiles of the draws of |f|_inf."""
    return tuple(float(q) for q in np.quantile(np.asarray(draws), (0.25, 0.5, 0.75)))


def _psi_minus_phi(pair: dict, mean: str, se: str, n: int) -> Estimate:
    """psi - phi of one cell (independent draws)."""
    phi, psi = (Estimate(pair[e][mean], pair[e][se], n) for e in EMBEDDINGS)
    return stats.independent_difference(psi, phi)


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares (orderings: one test pooled over the
    cells; within an embedding every cell is measured on the same draws)."""
    judge = verdicts.Verdicts(config)
    variance_rows, max_rows = results["variance_rows"], results["max_rows"]
    n = config.num_variance_draws
    judge.closed_form_agreement(
        "closed_forms",
        variance_rows,
        measured="variance_mc",
        closed_form="variance_theory",
        se="variance_se",
        draws=n,
        cell=lambda r: f"{r['embedding']}, Delta = {r['delta']:g}",
        where=lambda r: np.isfinite(r["z_score"]),
        effect="Monte Carlo - closed-form variance",
    )
    by_delta: dict[float, dict] = {}
    for r in variance_rows:
        by_delta.setdefault(r["delta"], {})[r["embedding"]] = r
    judge.exact(
        "variance_theory",
        min(c["psi"]["variance_theory"] - c["phi"]["variance_theory"] for c in by_delta.values()),
        effect="smallest closed-form Var psi - Var phi over Delta",
    )
    judge.ordering(
        "variance",
        {d: _psi_minus_phi(c, "variance_mc", "variance_se", n) for d, c in by_delta.items()},
        effect="Var psi - Var phi",
        cell_name="Delta",
        units="draws",
        shared_units=True,
    )
    pairs: dict[tuple, dict] = {}
    for r in max_rows:
        pairs.setdefault((r["D"], r["radius"]), {})[r["embedding"]] = r
    n = config.num_max_draws
    judge.ordering(
        "max_error",
        {cell: _psi_minus_phi(p, "max_error_mean", "max_error_se", n) for cell, p in pairs.items()},
        effect="E max error psi - phi",
        cell_name="(D, r)",
        units="draws",
        shared_units=True,
    )
    tail = pairs[(config.tail_embedding_dim, max(config.radii))]
    judge.effect(
        "mean",
        _psi_minus_phi(tail, "max_error_mean", "max_error_se", n),
        effect=f"E |f|_inf psi - phi over the whole region at D = {config.tail_embedding_dim}",
        units="draws",
    )
    spread = {
        e: Estimate(
            stats.interquartile_range(draws),
            stats.bootstrap_se(
                draws,
                stats.interquartile_range,
                resamples=config.bootstrap_resamples,
                seed=config.seed,
            ),
            len(draws),
        )
        for e, draws in results["region_max"].items()
    }
    judge.effect(
        "tighter",
        stats.independent_difference(spread["psi"], spread["phi"]),
        effect=f"interquartile range of |f|_inf psi - phi at D = {config.tail_embedding_dim} "
        f"(bootstrap SEs, {config.bootstrap_resamples} resamples)",
        units="draws",
        reference=spread["phi"].mean,
    )
    return judge


def max_error_table(max_rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """E max error of phi and psi over the largest region, per D, and their ratio."""
    region = [r for r in max_rows if r["radius"] == max(config.radii)]
    table = []
    for D in config.embedding_dims:
        cells = {r["embedding"]: r for r in region if r["D"] == D}
        table.append(
            {
                "D": D,
                "E max err phi": cells["phi"]["max_error_mean"],
                "SE phi": cells["phi"]["max_error_se"],
                "E max err psi": cells["psi"]["max_error_mean"],
                "SE psi": cells["psi"]["max_error_se"],
                "psi / phi": cells["psi"]["max_error_mean"] / cells["phi"]["max_error_mean"],
            }
        )
    return table


def variance_table(variance_rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """D Var, Monte Carlo and theory, at every Delta that is a multiple of 0.5."""
    return [
        {
            "Delta": r["delta"],
            "embedding": r["embedding"],
            "D Var (MC)": config.variance_embedding_dim * r["variance_mc"],
            "D Var (theory)": config.variance_embedding_dim * r["variance_theory"],
            "z": r["z_score"],
        }
        for r in variance_rows
        if round(r["delta"] / 0.5, 6).is_integer()
    ]


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``variance.csv``, ``max_error.csv``, ``tail_probability.csv``, three PNGs,
    ``summary.json``, ``summary.md``, ``verdicts.json`` and ``config.json``."""
    variance_rows, max_rows = results["variance_rows"], results["max_rows"]
    tail_rows = results["tail_rows"]
    quartiles = {e: _median_and_quartiles(results["region_max"][e]) for e in EMBEDDINGS}
    R = config.region_radius
    text = verdicts.write_summary(
        workdir,
        "rff_error",
        judge(results, config),
        config,
        lengthscale=f"{config.lengthscale:g}",
        variance_table=outputs.markdown_table(variance_table(variance_rows, config)),
        region=f"[{-R:g}, {R:g}]",
        spacing=f"{2 * R / (config.grid_points - 1):.3g}",
        region_table=outputs.markdown_table(max_error_table(max_rows, config)),
        **{f"{e}_quartiles": ", ".join(f"{q:.3f}" for q in quartiles[e]) for e in EMBEDDINGS},
        **{f"{e}_spread": f"{quartiles[e][2] - quartiles[e][0]:.3f}" for e in EMBEDDINGS},
        embedding_dims=list(config.embedding_dims),
    )
    outputs.write_json(os.path.join(workdir, "summary.json"), _headline(results, quartiles))
    outputs.write_csvs(
        workdir,
        {
            "variance.csv": variance_rows,
            "max_error.csv": max_rows,
            "tail_probability.csv": tail_rows,
        },
    )
    plot_variance(variance_rows, config, os.path.join(workdir, "variance.png"))
    plot_max_error(max_rows, os.path.join(workdir, "max_error_radius.png"))
    plot_tail(tail_rows, config, os.path.join(workdir, "tail_probability.png"))
    print(text)
    return results


def _headline(results: dict, quartiles: dict) -> dict:
    """The numbers of ``summary.json``: the largest |z| of the variances and the cells where
    one embedding is lower by more than 3 SE."""
    z = [abs(r["z_score"]) for r in results["variance_rows"] if np.isfinite(r["z_score"])]
    pairs: dict[tuple, dict] = {}
    for r in results["max_rows"]:
        pairs.setdefault((r["D"], r["radius"]), {})[r["embedding"]] = r
    gaps = [_psi_minus_phi(p, "max_error_mean", "max_error_se", 1) for p in pairs.values()]
    by_delta: dict[float, dict] = {}
    for r in results["variance_rows"]:
        by_delta.setdefault(r["delta"], {})[r["embedding"]] = r
    variance = [_psi_minus_phi(c, "variance_mc", "variance_se", 1) for c in by_delta.values()]
    return {
        "max_abs_z": float(max(z)),
        "variance_gap_resolved": sum(g.mean > 3 * g.se for g in variance),
        "phi_lower_max_error_cells": sum(g.mean > 3 * g.se for g in gaps),
        "psi_lower_max_error_cells": sum(g.mean < -3 * g.se for g in gaps),
        "cells": len(pairs),
        "median_max_error": {e: quartiles[e][1] for e in EMBEDDINGS},
    }
