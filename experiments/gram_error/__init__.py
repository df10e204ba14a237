"""Frobenius error of the Gram matrix approximated by positive random features (SimRF Fig. 7).

One synthetic data set X (n points x_i ~ N(0, sigma^2 I_d), drawn once from the seed) and its
exact Gaussian Gram matrix K_ij = exp(-|x_i - x_j|^2 / 2). For every coupling,
``num_repetitions`` independent projections of max(m) rows (vmapped over keys; the first m rows
serve for each smaller m, see ``_squared_errors``) give K-hat = Phi Phi^T with Gaussian-kernel
positive features Phi (Eq. 7) and the error |K - K-hat|_F. Since E|K - K-hat|_F^2 =
sum_ij MSE(x_i, x_j) for a fixed X, the mean squared error is compared with the closed form
(Eq. 11 with the multi-block conformity of Eq. 19, 23, 24) for IID, ORF and SimRF.
"""

from __future__ import annotations

import functools
import itertools
import math
import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, plots, stats, validate, verdicts
from experiments.core.stats import Estimate
from experiments.core.study import Study
from rfjax import features, kernels, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Simplex Random Features (Reid et al., ICML 2023)",
    order=30,
    reproduces="SimRF Fig. 7: Frobenius error of the approximate Gram matrix vs m",
)

COUPLINGS = ("gaussian", "orthogonal", "simplex", "simplex_plus")
CLOSED_FORMS = theory.COUPLINGS
LABELS = outputs.COUPLING_LABELS


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError``/``TypeError`` naming the first bad config field."""
    validate.require_no_repeats(config, "couplings", "features_per_dim")
    validate.require_int(config, "dim", "num_points", "num_repetitions", minimum=2)
    validate.require_positive(config, "sigma")
    validate.require_int(config, "features_per_dim", "repetitions_per_chunk", minimum=1)
    validate.require_names(config, "couplings", COUPLINGS)
    validate.require_int(config, "seed", minimum=0)


def make_data(key: jax.Array, num_points: int, dim: int, sigma: float) -> jax.Array:
    """n points with i.i.d. N(0, sigma^2) coordinates, shape (n, d)."""
    return sigma * jax.random.normal(key, (num_points, dim))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _squared_errors(
    coupling: str, feature_counts: tuple[int, ...], keys: jax.Array, x: jax.Array, exact: jax.Array
) -> jax.Array:
    """|K - Phi_m Phi_m^T|_F^2 per key and m, shape ``(num_keys, len(feature_counts))``.

    One projection of M = max(m) rows is drawn per key; the m-feature estimate uses its first m
    rows. For m a multiple of d those rows are whole independent blocks, so they are a draw of
    the m-row coupling itself (the estimates for different m are nested, correlated across m
    within a key, independent across keys). Positive features carry 1/sqrt(width), so
    Phi_m = sqrt(M/m) Phi_M[:, :m].
    """
    sampler = projections.get(coupling)
    largest = max(feature_counts)

    def one(key):
        projection = sampler(key, x.shape[-1], largest)
        phi = features.positive_features(x, projection, kernel="gaussian")
        errors = []
        for m in feature_counts:
            head = phi[:, :m]
            errors.append(jnp.sum((exact - (largest / m) * (head @ head.T)) ** 2))
        return jnp.stack(errors)

    return jax.vmap(one)(keys)


def squared_errors(
    key: jax.Array, coupling: str, feature_counts: tuple[int, ...], x: jax.Array, config
) -> np.ndarray:
    """Squared Frobenius errors of ``num_repetitions`` draws, shape ``(repetitions, len(m))``."""
    exact = kernels.gram(kernels.gaussian, x, x)
    draw = functools.partial(_squared_errors, coupling, feature_counts, x=x, exact=exact)
    return stats.draw_in_chunks(
        draw, key, config.num_repetitions, config.repetitions_per_chunk, f"{coupling} draws"
    )


def expected_squared_error(x: np.ndarray, num_features: int, coupling: str) -> float:
    """sum_ij MSE(x_i, x_j): the closed-form E|K - K-hat|_F^2 (Eq. 11, multi-block form)."""
    if coupling not in CLOSED_FORMS:
        return math.nan
    with jax.enable_x64(True):
        mse = theory.prf_mse(x[:, None, :], x[None, :, :], num_features, coupling=coupling)
        return float(np.sum(np.asarray(mse, np.float64)))


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    mean, se = stats.mean_se(values)
    return float(mean), float(se)


def data_facts(x: jax.Array) -> dict:
    """|K|_F of the exact Gaussian Gram matrix and the mean |x_i + x_j| over pairs i != j."""
    x64 = np.asarray(x, np.float64)
    exact_norm = float(np.linalg.norm(np.asarray(kernels.gram(kernels.gaussian, x, x), np.float64)))
    v = np.linalg.norm(x64[:, None, :] + x64[None, :, :], axis=-1)
    return {
        "exact_norm": exact_norm,
        "v_offdiag_mean": float(v[~np.eye(len(v), dtype=bool)].mean()),
    }


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Rows per (coupling, m): Frobenius error, squared error (with theory), relative error;
    paired differences between the block couplings; facts about the data. Writes nothing."""
    del workdir  # nothing to resume
    validate_config(config)
    data_key, draw_key = jax.random.split(jax.random.key(config.seed))
    x = make_data(data_key, config.num_points, config.dim, config.sigma)
    x64 = np.asarray(x, np.float64)
    data = data_facts(x)
    counts = tuple(ratio * config.dim for ratio in config.features_per_dim)
    rows, errors = [], {}
    for coupling in outputs.progress(config.couplings, "gram error couplings"):
        # One key per repetition for every coupling: the block couplings then share their chi_d
        # norms and Haar rotations per repetition, so their differences are paired.
        squared = squared_errors(draw_key, coupling, counts, x, config)
        errors[coupling] = np.sqrt(squared)
        for column, (ratio, m) in enumerate(zip(config.features_per_dim, counts, strict=True)):
            error_mean, error_se = _mean_se(np.sqrt(squared[:, column]))
            squared_mean, squared_se = _mean_se(squared[:, column])
            predicted = expected_squared_error(x64, m, coupling)
            rows.append(
                {
                    "coupling": coupling,
                    "m_over_d": ratio,
                    "num_features": m,
                    "frobenius_mean": error_mean,
                    "frobenius_se": error_se,
                    "relative_mean": error_mean / data["exact_norm"],
                    "relative_se": error_se / data["exact_norm"],
                    "squared_mean": squared_mean,
                    "squared_se": squared_se,
                    "squared_theory": predicted,
                    "z_score": (squared_mean - predicted) / squared_se,
                }
            )
    return {"rows": rows, "differences": paired_differences(errors, config), "data": data}


def paired_differences(errors: dict[str, np.ndarray], config) -> list[dict]:
    """Mean and SE of per-repetition Frobenius-error differences between coupled schemes that
    share their norms and rotations (same keys), for each m."""
    rows = []
    for first, second in (("orthogonal", "simplex"), ("simplex", "simplex_plus")):
        if first not in errors or second not in errors:
            continue
        for column, ratio in enumerate(config.features_per_dim):
            mean, se = _mean_se(errors[first][:, column] - errors[second][:, column])
            rows.append(
                {
                    "difference": f"{first} - {second}",
                    "m_over_d": ratio,
                    "mean": mean,
                    "se": se,
                    "z": mean / se,
                    "relative_to_first": mean / float(errors[first][:, column].mean()),
                }
            )
    return rows


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Frobenius error vs m (mean, shaded +- 1 SE, points with 2-SE bars) and the ratio to IID."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    iid = {r["num_features"]: r["frobenius_mean"] for r in rows if r["coupling"] == "gaussian"}
    for index, coupling in enumerate(config.couplings):
        mine = [r for r in rows if r["coupling"] == coupling]
        m = np.array([r["num_features"] for r in mine])
        mean = np.array([r["frobenius_mean"] for r in mine])
        se = np.array([r["frobenius_se"] for r in mine])
        color = f"C{index}"
        plots.series(
            axes[0],
            m,
            mean,
            mean - se,
            mean + se,
            color=color,
            label=LABELS[coupling],
            style="o-",
            alpha=0.25,
            ms=3,
        )
        if iid:
            ratio = mean / np.array([iid[k] for k in m])
            axes[1].errorbar(
                m,
                ratio,
                yerr=2 * se / np.array([iid[k] for k in m]),
                fmt="o-",
                color=color,
                ms=3,
                capsize=2,
                label=LABELS[coupling],
            )
    axes[0].set_yscale("log")
    axes[0].set_ylabel("|K - K̂|_F (mean ± SE)")
    axes[0].set_title(
        f"Gram matrix error, n = {config.num_points}, d = {config.dim}, σ = {config.sigma:g}"
    )
    axes[1].set_ylabel("|K - K̂|_F / IID")
    axes[1].set_title("relative to IID (bars: 2 SE of the numerator)")
    for ax in axes:
        ax.set_xlabel("number of random features m")
        ax.legend(fontsize=8)
    outputs.save_figure(fig, path)


def _ratio_sentence(rows: list[dict], ratio: int) -> str:
    mine = {r["coupling"]: r["frobenius_mean"] for r in rows if r["m_over_d"] == ratio}
    if "gaussian" not in mine:
        return ""
    parts = ", ".join(
        f"{LABELS[c]} {value / mine['gaussian']:.3f}"
        for c, value in mine.items()
        if c != "gaussian"
    )
    return f"At m = {ratio}d the mean Frobenius error relative to IID is: {parts}."


def _nan_note(config: ml_collections.ConfigDict) -> str:
    """Why the theory columns are nan for some couplings ("" when all have closed forms)."""
    reasons = {c: theory.no_closed_form_reason(c) for c in config.couplings}
    note = outputs.nan_note("`squared_theory` and `z_score`", reasons)
    return f"{note}\n\n" if note else ""


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares (each ordering one test pooled over m;
    every m is measured on the same draws)."""
    judge = verdicts.Verdicts(config)
    rows, n = results["rows"], config.num_repetitions
    by = {(r["coupling"], r["m_over_d"]): r for r in rows}
    ratios = sorted({r["m_over_d"] for r in rows})
    judge.closed_form_agreement(
        "exact",
        rows,
        measured="squared_mean",
        closed_form="squared_theory",
        se="squared_se",
        draws=n,
        cell=lambda r: f"{LABELS[r['coupling']]}, m = {r['m_over_d']}d",
        where=lambda r: r["coupling"] in CLOSED_FORMS,
        effect="Monte Carlo - closed form of E|K - K-hat|_F^2",
    )

    def error(coupling: str, ratio: int) -> Estimate:
        return Estimate(by[coupling, ratio]["relative_mean"], by[coupling, ratio]["relative_se"], n)

    couplings = list(dict.fromkeys(r["coupling"] for r in rows))
    judge.ordering(
        "falls",
        {
            (c, later): stats.independent_difference(error(c, earlier), error(c, later))
            for c in couplings
            for earlier, later in itertools.pairwise(ratios)
        },
        effect="|K - K-hat|_F / |K|_F at one m minus at the next larger m",
        cell_name="(coupling, m/d)",
        units="draws",
        shared_units=True,
    )
    paired = {(d["difference"], d["m_over_d"]): d for d in results["differences"]}
    independent = {"gaussian", "orthogonal"} <= set(couplings)
    for name, cells, effect in (
        (
            "simplex_orf",
            {
                r: _relative(paired[k], n)
                for r in ratios
                if (k := ("orthogonal - simplex", r)) in paired
            },
            "(ORF - SimRF) / ORF Frobenius error, paired",
        ),
        (
            "orf_iid",
            {
                r: stats.independent_difference(error("gaussian", r), error("orthogonal", r))
                for r in ratios
                if independent
            },
            "(IID - ORF) |K - K-hat|_F / |K|_F, independent draws",
        ),
        (
            "simrf_plus",
            {
                r: _relative(paired[k], n, sign=-1)
                for r in ratios
                if (k := ("simplex - simplex_plus", r)) in paired
            },
            "(SimRF+ - SimRF) / SimRF Frobenius error, paired",
        ),
    ):
        judge.ordering(
            name, cells, effect=effect, cell_name="m/d", units="draws", shared_units=True
        )
    return judge


def _relative(difference: dict, n: int, sign: int = 1) -> Estimate:
    """A paired difference row in units of its first coupling's mean error."""
    scale = difference["relative_to_first"] / difference["mean"]
    return Estimate(sign * difference["relative_to_first"], difference["se"] * scale, n)


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``differences.csv``, ``gram_error.png``, ``summary.md``,
    ``verdicts.json`` and ``config.json``."""
    rows, differences, data = results["rows"], results["differences"], results["data"]
    columns = (
        "coupling",
        "m_over_d",
        "frobenius_mean",
        "frobenius_se",
        "relative_mean",
        "squared_mean",
        "squared_theory",
        "z_score",
    )
    ratio_text = " ".join(
        _ratio_sentence(rows, r)
        for r in (min(config.features_per_dim), max(config.features_per_dim))
    )
    summary = verdicts.write_summary(
        workdir,
        "gram_error",
        judge(results, config),
        config,
        sigma=f"{config.sigma:g}",
        exact_norm=f"{data['exact_norm']:.4g}",
        v_mean=f"{data['v_offdiag_mean']:.3g}",
        ratios=list(config.features_per_dim),
        ratio_text=ratio_text,
        table=outputs.markdown_table([{k: r[k] for k in columns} for r in rows]),
        nan_note=_nan_note(config),
        difference_table=outputs.markdown_table(differences) if differences else "(none)",
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), rows)
    if differences:
        outputs.write_csv(os.path.join(workdir, "differences.csv"), differences)
    plot(rows, config, os.path.join(workdir, "gram_error.png"))
    print(summary)
    return results
