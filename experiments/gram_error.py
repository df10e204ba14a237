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

from experiments.core import outputs
from experiments.monte_carlo import ordering_verdict
from rfjax import features, kernels, projections, theory
from rfjax._validation import check_choice, check_int, check_real

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COUPLINGS = ("gaussian", "orthogonal", "simplex", "simplex_plus")
CLOSED_FORMS = theory.COUPLINGS
LABELS = outputs.COUPLING_LABELS


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError``/``TypeError`` naming the first bad config field."""
    check_int("config.dim", config.dim, minimum=2)
    check_int("config.num_points", config.num_points, minimum=2)
    check_real("config.sigma", config.sigma, positive=True)
    ratios = tuple(config.features_per_dim)
    if not ratios:
        raise ValueError("config.features_per_dim must list at least one m / d")
    for ratio in ratios:
        check_int("config.features_per_dim entries", ratio, minimum=1)
    couplings = tuple(config.couplings)
    if not couplings:
        raise ValueError(f"config.couplings must name at least one of {COUPLINGS}")
    for coupling in couplings:
        check_choice("config.couplings entries", coupling, COUPLINGS)
    check_int("config.num_repetitions", config.num_repetitions, minimum=2)
    check_int("config.repetitions_per_chunk", config.repetitions_per_chunk, minimum=1)
    check_int("config.seed", config.seed, minimum=0)


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
    values = []
    for start in range(0, config.num_repetitions, config.repetitions_per_chunk):
        count = min(config.repetitions_per_chunk, config.num_repetitions - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        values.append(np.asarray(_squared_errors(coupling, feature_counts, keys, x, exact)))
    return np.concatenate(values).astype(np.float64)


def expected_squared_error(x: np.ndarray, num_features: int, coupling: str) -> float:
    """sum_ij MSE(x_i, x_j): the closed-form E|K - K-hat|_F^2 (Eq. 11, multi-block form)."""
    if coupling not in CLOSED_FORMS:
        return math.nan
    with jax.enable_x64(True):
        mse = theory.prf_mse(x[:, None, :], x[None, :, :], num_features, coupling=coupling)
        return float(np.sum(np.asarray(mse, np.float64)))


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


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
        axes[0].plot(m, mean, "o-", color=color, ms=3, label=LABELS[coupling])
        axes[0].fill_between(m, mean - se, mean + se, color=color, alpha=0.25)
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


def _gap_z(better: dict, worse: dict) -> float:
    """(worse - better) mean Frobenius error in SEs of the difference, draws taken as
    independent."""
    return (worse["frobenius_mean"] - better["frobenius_mean"]) / math.hypot(
        worse["frobenius_se"], better["frobenius_se"]
    )


def ordering_verdicts(rows: list[dict], differences: list[dict]) -> dict[str, str]:
    """SimRF < ORF (paired), ORF < IID (independent couplings), SimRF+ <= SimRF (paired) and
    the error falling with m, each as "holds" or "does not hold, because ..." (3-SE tests)."""
    by = {(r["coupling"], r["m_over_d"]): r for r in rows}
    ratios = sorted({r["m_over_d"] for r in rows})
    paired = {(d["difference"], d["m_over_d"]): d["z"] for d in differences}
    plus = {k[1]: z for k, z in paired.items() if k[0] == "simplex - simplex_plus"}
    plus_reversed = [ratio for ratio, z in plus.items() if z < -3]
    couplings = list(dict.fromkeys(r["coupling"] for r in rows))
    return {
        "simplex_orf": ordering_verdict(
            {k[1]: z for k, z in paired.items() if k[0] == "orthogonal - simplex"},
            "SimRF below ORF, paired,",
            "m/d",
        ),
        "orf_iid": ordering_verdict(
            {
                r: _gap_z(by["orthogonal", r], by["gaussian", r])
                for r in ratios
                if ("orthogonal", r) in by and ("gaussian", r) in by
            },
            "ORF below IID",
            "m/d",
        ),
        "simrf_plus": "not measured"
        if not plus
        else (
            f"holds (SimRF+ below SimRF by > 3 SE at {sum(z > 3 for z in plus.values())} of "
            f"{len(plus)} m/d, above at none)"
            if not plus_reversed
            else f"does not hold, because SimRF+ is above SimRF by > 3 SE at m/d in {plus_reversed}"
        ),
        "falls": ordering_verdict(
            {
                (c, later): _gap_z(by[c, later], by[c, earlier])
                for c in couplings
                for earlier, later in itertools.pairwise(ratios)
            },
            "the next larger m lowers the error",
            "(coupling, m/d)",
        ),
    }


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``differences.csv``, ``gram_error.png``, ``summary.md`` and
    ``config.json``."""
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
    table = outputs.markdown_table([{k: r[k] for k in columns} for r in rows])
    checked = [abs(r["z_score"]) for r in rows if r["coupling"] in CLOSED_FORMS]
    max_z = max(checked) if checked else math.nan
    ratio_text = " ".join(
        _ratio_sentence(rows, r)
        for r in (min(config.features_per_dim), max(config.features_per_dim))
    )
    verdicts = ordering_verdicts(rows, differences)
    summary = outputs.render_summary(
        "gram_error",
        num_points=config.num_points,
        sigma=f"{config.sigma:g}",
        dim=config.dim,
        seed=config.seed,
        exact_norm=f"{data['exact_norm']:.4g}",
        v_mean=f"{data['v_offdiag_mean']:.3g}",
        ratios=list(config.features_per_dim),
        repetitions=config.num_repetitions,
        max_z=f"{max_z:.2f}",
        max_z_verdict="not measured"
        if not checked
        else ("holds" if max_z <= 4 else "does not hold, because a cell is more than 4 SE off"),
        falls_verdict=verdicts["falls"],
        simplex_orf_verdict=verdicts["simplex_orf"],
        orf_iid_verdict=verdicts["orf_iid"],
        simrf_plus_verdict=verdicts["simrf_plus"],
        ratio_text=ratio_text,
        table=table,
        nan_note=_nan_note(config),
        difference_table=outputs.markdown_table(differences) if differences else "(none)",
    )
    outputs.save_run(workdir, rows=rows, summary=summary, config=config)
    if differences:
        outputs.write_csv(os.path.join(workdir, "differences.csv"), differences)
    plot(rows, config, os.path.join(workdir, "gram_error.png"))
    print(summary)
    return {"rows": rows, "differences": differences, "verdicts": verdicts, **data}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """``report(measure(config), config, workdir)``."""
    return report(measure(config, workdir), config, workdir)
