"""Relative error of softmax-kernel estimators on the sphere vs angle, beside the closed forms.

For each radius r the inputs are x = r u and y = r (cos(theta) u + sin(theta) v) for a random
orthonormal pair (u, v), one pair of rows per theta on the grid. Every draw (one key) draws
fresh projections for each estimator; ``num_draws`` draws give the relative error
epsilon = sqrt(E[(SM-hat - SM)^2]) / SM per theta, and its standard error by the delta method.

Estimators (HRF arXiv:2110.04367): trigonometric (Eq. 2), antithetic positive (Eq. 3), angular
hybrid (Eq. 12 + 19, variant I: independent base projections) and the normalised Gaussian
hybrid (Eq. 20 / App. F, trigonometric coefficient estimator, variant I).
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, stats, verdicts
from experiments.core.study import Study
from experiments.core.validate import (
    require_couplings_draw,
    require_names,
    require_no_repeats,
    require_positive,
)
from rfjax import features, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=80,
    reproduces=(
        "HRF Fig. 2: relative error of softmax-kernel estimators on the sphere vs angle, "
        "beside the closed forms"
    ),
)

ESTIMATORS = ("trigonometric", "positive", "angular_hybrid", "gaussian_hybrid")
LABELS = {
    "trigonometric": "trig",
    "positive": "positive (antithetic)",
    "angular_hybrid": "angular hybrid",
    "gaussian_hybrid": "Gaussian hybrid",
}


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the coupling, the dtype and the sizes before anything runs.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "radii")
    require_names(config, "coupling", projections.available())
    require_names(config, "dtype", ("float32", "float64"))
    require_positive(
        config,
        "dim",
        "radii",
        "num_angles",
        "num_features",
        "num_coefficient_features",
        "gaussian_bandwidth_over_radius",
        "num_draws",
        "draws_per_chunk",
    )
    for rows in (config.num_features, config.num_coefficient_features):
        require_couplings_draw(config, "coupling", config.dim, rows)


def sphere_pairs(
    key: jax.Array, dim: int, radius: float, thetas: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """x = r u, y = r (cos(theta) u + sin(theta) v), u ⟂ v random unit vectors: (T, d) each."""
    basis, _ = np.linalg.qr(np.asarray(jax.random.normal(key, (dim, 2)), np.float64))
    u, v = basis[:, 0], basis[:, 1]
    x = np.broadcast_to(radius * u, (thetas.size, dim))
    y = radius * (np.cos(thetas)[:, None] * u + np.sin(thetas)[:, None] * v)
    return x, y


def _draw(coupling: str, key: jax.Array, dim: int, rows: int, dtype) -> object:
    return projections.get(coupling)(key, dim, rows, dtype=dtype)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _base_and_angular_estimates(
    coupling: str, num_features: int, num_sign_features: int, keys: jax.Array, x, y
) -> jax.Array:
    """Trig, positive and angular-hybrid estimates of SM(x, y): shape (num_keys, 3, T).

    One fresh, independent draw of every projection per key (variant I for the hybrid).
    """
    dim, dtype, m = x.shape[-1], x.dtype, num_features

    def one_draw(key):
        k = jax.random.split(key, 5)
        w_trig = _draw(coupling, k[0], dim, m, dtype)
        w_pos = _draw(coupling, k[1], dim, m, dtype)
        trig = features.estimate(
            features.trigonometric_features(x, w_trig), features.trigonometric_features(y, w_trig)
        )
        pos = features.estimate(
            features.positive_features(x, w_pos, antithetic=True),
            features.positive_features(y, w_pos, antithetic=True),
        )
        wp, wt = _draw(coupling, k[2], dim, m, dtype), _draw(coupling, k[3], dim, m, dtype)
        signs = _draw(coupling, k[4], dim, num_sign_features, dtype)
        hybrid = features.estimate(
            features.angular_hybrid_features(x, wp, wt, signs, side="query"),
            features.angular_hybrid_features(y, wp, wt, signs, side="key"),
        )
        return jnp.stack([trig, pos, hybrid])

    return jax.vmap(one_draw)(keys)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _gaussian_hybrid_estimates(
    coupling: str,
    num_features: int,
    num_coefficient_features: int,
    radius: float,
    bandwidth: float,
    keys: jax.Array,
    x: jax.Array,
    y: jax.Array,
) -> jax.Array:
    """Normalised Gaussian-hybrid estimates (variant I), shape (num_keys, 1, T).

    Separate from the others because ``radius`` and ``bandwidth`` are static: only this one
    recompiles per radius.
    """
    dim, dtype, m = x.shape[-1], x.dtype, num_features
    options = {"bandwidth": bandwidth, "radius": radius}

    def one_draw(key):
        k = jax.random.split(key, 3)
        wp, wt = _draw(coupling, k[0], dim, m, dtype), _draw(coupling, k[1], dim, m, dtype)
        wc = _draw(coupling, k[2], dim, num_coefficient_features, dtype)
        fx = features.gaussian_hybrid_features(x, wp, wt, wc, side="query", **options)
        fy = features.gaussian_hybrid_features(y, wp, wt, wc, side="key", **options)
        return features.estimate(fx, fy)[None]

    return jax.vmap(one_draw)(keys)


def gaussian_hybrid_relative_error(
    thetas: np.ndarray, radius: float, bandwidth: float, m: int, n: int
) -> np.ndarray:
    """Relative error of the normalised Gaussian hybrid (variant I, i.i.d.) on S(r).

    From Eq. 31 with independent base estimators and a coefficient independent of both:
    epsilon^2 = E[lambda-hat^2] eps_{++}^2 + E[(1 - lambda-hat)^2] eps_trig^2, where
    lambda = (K - c)/(1 - c), K = exp(-|x + y|^2 / (2 tau^2)), c = exp(-2 r^2 / tau^2), and
    Var lambda-hat = MSE_RFF(x/tau, -y/tau; n) / (1 - c)^2 (sin/cos RFF with n projections).
    """
    x = np.broadcast_to(np.array([radius, 0.0]), (thetas.size, 2))
    y = radius * np.stack([np.cos(thetas), np.sin(thetas)], axis=-1)
    c = math.exp(-2.0 * radius**2 / bandwidth**2)
    kernel = np.exp(-np.sum((x + y) ** 2, axis=-1) / (2.0 * bandwidth**2))
    lam = (kernel - c) / (1.0 - c)
    var = theory.rff_mse(x / bandwidth, -y / bandwidth, n) / (1.0 - c) ** 2
    positive = theory.positive_relative_error(thetas, radius, m)
    trig = theory.trigonometric_relative_error(thetas, radius, m)
    return np.sqrt((lam**2 + var) * positive**2 + ((1.0 - lam) ** 2 + var) * trig**2)


def theory_curves(
    thetas: np.ndarray, radius: float, config: ml_collections.ConfigDict
) -> dict[str, jax.Array | np.ndarray]:
    m, n = config.num_features, config.num_coefficient_features
    bandwidth = config.gaussian_bandwidth_over_radius * radius
    return {
        "trigonometric": theory.trigonometric_relative_error(thetas, radius, m),
        "positive": theory.positive_relative_error(thetas, radius, m),
        "angular_hybrid": theory.angular_hybrid_relative_error(thetas, radius, m, n),
        "gaussian_hybrid": gaussian_hybrid_relative_error(thetas, radius, bandwidth, m, n),
    }


def monte_carlo_relative_error(
    key: jax.Array, radius: float, x: np.ndarray, y: np.ndarray, config: ml_collections.ConfigDict
) -> tuple[np.ndarray, np.ndarray]:
    """Relative errors and their standard errors (delta method), shapes (num_estimators, T)."""
    exact = jnp.exp(jnp.sum(jnp.asarray(x * y, config.dtype), axis=-1))
    xj, yj = jnp.asarray(x, config.dtype), jnp.asarray(y, config.dtype)
    m, n = config.num_features, config.num_coefficient_features
    bandwidth = config.gaussian_bandwidth_over_radius * radius

    def squared_relative_errors(keys):
        base_keys, gaussian_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        base = _base_and_angular_estimates(config.coupling, m, n, base_keys, xj, yj)
        gaussian = _gaussian_hybrid_estimates(
            config.coupling, m, n, radius, bandwidth, gaussian_keys, xj, yj
        )
        return ((jnp.concatenate([base, gaussian], axis=1) - exact) / exact) ** 2

    mse, mse_se = stats.chunked_mean_se(
        squared_relative_errors, key, config.num_draws, config.draws_per_chunk, f"r = {radius:g}"
    )
    error = np.sqrt(mse)
    return error, mse_se / (2.0 * np.maximum(error, np.finfo(np.float64).tiny))


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> list[dict]:
    """One row per (r, theta, estimator): Monte Carlo relative error, its SE and theory, in
    ``config.dtype``. Writes nothing."""
    del workdir  # nothing to resume
    validate_config(config)
    with jax.enable_x64(config.dtype == "float64"):
        return _measure_rows(config)


def _measure_rows(config: ml_collections.ConfigDict) -> list[dict]:
    input_key, draw_key = jax.random.split(jax.random.key(config.seed))
    thetas = np.linspace(0.0, math.pi, config.num_angles)
    rows = []
    for index, radius in enumerate(config.radii):
        x, y = sphere_pairs(jax.random.fold_in(input_key, index), config.dim, radius, thetas)
        error, se = monte_carlo_relative_error(
            jax.random.fold_in(draw_key, index), radius, x, y, config
        )
        predicted = theory_curves(thetas, radius, config)
        for e, name in enumerate(ESTIMATORS):
            for t, theta in enumerate(thetas):
                rows.append(
                    {
                        "radius": float(radius),
                        "theta": float(theta),
                        "estimator": name,
                        "rel_error_mc": float(error[e, t]),
                        "rel_error_se": float(se[e, t]),
                        "rel_error_theory": float(predicted[name][t]),
                    }
                )
    return rows


def summarise(rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Per (r, estimator): max over theta (MC and theory) and the errors at theta = 0 and pi."""
    summary = []
    for radius in config.radii:
        for name in ESTIMATORS:
            mine = [r for r in rows if r["radius"] == radius and r["estimator"] == name]
            worst = max(mine, key=lambda r: r["rel_error_mc"])
            summary.append(
                {
                    "r": float(radius),
                    "estimator": name,
                    "max_rel_error_mc": worst["rel_error_mc"],
                    "argmax_theta_mc": worst["theta"],
                    "max_rel_error_theory": max(r["rel_error_theory"] for r in mine),
                    "rel_error_mc_at_0": mine[0]["rel_error_mc"],
                    "rel_error_mc_at_pi": mine[-1]["rel_error_mc"],
                }
            )
    return summary


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """One panel per r: theory as lines, Monte Carlo as points, log-scale relative error."""
    radii = config.radii
    fig, axes = plt.subplots(1, len(radii), figsize=(3.6 * len(radii), 3.4), squeeze=False)
    dense = np.linspace(0.0, math.pi, 241)
    floor = 1e-9  # rounding: exact estimators show ~eps instead of 0 on a log scale
    for ax, radius in zip(axes[0], radii, strict=True):
        curves = theory_curves(dense, radius, config)
        for index, name in enumerate(ESTIMATORS):
            color = f"C{index}"
            ax.plot(dense, np.maximum(curves[name], floor), color=color, lw=1.2)
            mine = [r for r in rows if r["radius"] == radius and r["estimator"] == name]
            ax.plot(
                [r["theta"] for r in mine],
                [max(r["rel_error_mc"], floor) for r in mine],
                "o",
                color=color,
                ms=3.5,
                label=LABELS[name],
            )
        ax.set_yscale("log")
        ax.set_title(f"r = {radius:g}")
        ax.set_xlabel("angle θ")
        ax.set_xticks([0, math.pi / 2, math.pi], ["0", "π/2", "π"])
    axes[0][0].set_ylabel("relative error √MSE / SM")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"Softmax kernel, d = {config.dim}, m = {config.num_features}, "
        f"n = {config.num_coefficient_features}; lines: theory, points: "
        f"{config.num_draws} draws",
        fontsize=9,
    )
    outputs.save_figure(fig, path)


# Relative error below which an estimator counts as exact (float64 rounding: the hybrid's
# cancellation of e^{r^2}-sized terms leaves ~1e-9 at r = 3, theta = pi).
EXACT_TOLERANCE = 1e-6


def best_at(summary_rows: list[dict], source: str) -> list[float]:
    """The radii at which the angular hybrid has the smallest max-relative-error over theta by
    ``source`` ("theory" or "mc")."""
    radii = sorted({r["r"] for r in summary_rows})
    return [
        radius
        for radius in radii
        if min(
            (r for r in summary_rows if r["r"] == radius),
            key=lambda r: r[f"max_rel_error_{source}"],
        )["estimator"]
        == "angular_hybrid"
    ]


def _max_cell(rows: list[dict], radius: float, name: str) -> dict:
    mine = [r for r in rows if r["radius"] == radius and r["estimator"] == name]
    return max(mine, key=lambda r: r["rel_error_mc"])


def monte_carlo_max_gaps(rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Per r: (other estimator's max over theta - the hybrid's) in SEs of the difference, from
    the Monte Carlo cells at the maxima (estimators use independent draws)."""
    out = []
    for radius in config.radii:
        hybrid = _max_cell(rows, radius, "angular_hybrid")
        row: dict = {"r": float(radius)}
        for name in ESTIMATORS:
            if name == "angular_hybrid":
                continue
            other = _max_cell(rows, radius, name)
            row[f"z vs {name}"] = (other["rel_error_mc"] - hybrid["rel_error_mc"]) / math.hypot(
                other["rel_error_se"], hybrid["rel_error_se"]
            )
        out.append(row)
    return out


def endpoint_errors(rows: list[dict]) -> tuple[float, float]:
    """The angular hybrid's largest relative error at theta = 0 and pi: Monte Carlo, theory."""
    ends = [
        r
        for r in rows
        if r["estimator"] == "angular_hybrid"
        and (r["theta"] == 0.0 or math.isclose(r["theta"], math.pi, rel_tol=1e-12))
    ]
    return max(r["rel_error_mc"] for r in ends), max(r["rel_error_theory"] for r in ends)


def judge(rows: list[dict], config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares."""
    judge = verdicts.Verdicts(config)
    radii, summary_rows = list(config.radii), summarise(rows, config)
    theory_best = best_at(summary_rows, "theory")
    judge.fact(
        "smallest",
        theory_best == radii,
        f"by the closed forms the angular hybrid's max over theta is the smallest at r in "
        f"{theory_best} of {radii}",
    )
    end_mc, end_theory = endpoint_errors(rows)
    judge.fact(
        "exact_ends",
        end_mc < EXACT_TOLERANCE,
        f"largest relative error at the two ends over all r: Monte Carlo {end_mc:.2g}, closed "
        f"form {end_theory:.2g} (exact counts as below {EXACT_TOLERANCE:g}, float64 rounding)",
    )
    judge.closed_form_agreement(
        "agreement",
        rows,
        measured="rel_error_mc",
        closed_form="rel_error_theory",
        se="rel_error_se",
        draws=config.num_draws,
        cell=lambda r: f"r = {r['radius']:g}, theta = {r['theta']:.3g}",
        where=lambda r: r["estimator"] == "trigonometric" and r["rel_error_theory"] > 0,
        cell_name="trig cells",
    )
    return judge


def report(rows: list[dict], config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``summary.csv``, ``relative_error.png``, ``summary.md``,
    ``verdicts.json`` and ``config.json``."""
    summary_rows = summarise(rows, config)
    gaps = monte_carlo_max_gaps(rows, config)
    resolved = [g["r"] for g in gaps if all(value > 3 for key, value in g.items() if key != "r")]
    summary = verdicts.write_summary(
        workdir,
        "hrf_pointwise",
        judge(rows, config),
        config,
        bandwidth=f"{config.gaussian_bandwidth_over_radius:g}",
        radii=list(config.radii),
        mc_best=best_at(summary_rows, "mc"),
        mc_resolved=resolved,
        gap_table=outputs.markdown_table(gaps, "{:.1f}"),
        table=outputs.markdown_table(summary_rows),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), rows)
    outputs.write_csv(os.path.join(workdir, "summary.csv"), summary_rows)
    plot(rows, config, os.path.join(workdir, "relative_error.png"))
    print(summary)
    return {"rows": rows, "summary": summary_rows}
