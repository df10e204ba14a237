"""Concentration of structured (P-model) random Fourier features against the bounds.

Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices" (seed 003,
arXiv:1604.07356; docs/maths/structured.md). Every family is a ``rfjax.projections.PModel``
drawn with ``projections.p_model`` (the unstructured Gaussian one as ``IndependentRows``, t = n^2),
with and without the H D_3 H D_2 H D_1 preprocessing (Step 1, Eq. 12). The Gaussian kernel is
estimated with sin/cos features (``features.fourier_features``) on pairs of real points; the
bounds come from ``rfjax.theory``: ``rff_pointwise_bound`` (Kakade), ``chromatic_deviation_bound``
with chi[P] from ``p_model_chromatic_number``, ``structured_fourier_bound`` with the row
covariance of each draw (``row_covariance``) and ``rff_uniform_bound`` (Sutherland & Schneider).

``measure`` returns per-method statistics (means and SEs over draws, chi[P], the P-model bound)
and saves them to ``workdir/measurements.json`` method by method (a rerun resumes; ``report``
alone can be rerun from it); ``report`` writes ``methods.csv``, ``tails.csv``, the figures and
``summary.md`` (template ``experiments/structured_concentration/summary.md``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
from scipy import stats as scipy_stats

from experiments import structured_kernels
from experiments.core import outputs, plots, records, stats, tabulate, validate, verdicts
from experiments.core.stats import Estimate
from experiments.core.study import Study
from rfjax import features, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Fast nonlinear embeddings via structured matrices (Choromanski & Fagan)",
    order=70,
    reproduces=(
        "Choromanski & Fagan: tails P(\\|K_hat - K\\| > eps) of every P-model family (± HD) "
        "against the bounds, MSE against the budget of randomness"
    ),
)

FAMILIES: dict[str, projections.PModel] = {
    "gaussian": projections.IndependentRows(),
    "circulant": projections.Circulant(),
    "skew_circulant": projections.SkewCirculant(),
    "toeplitz": projections.Toeplitz(),
    "hankel": projections.Hankel(),
    "ldr1": projections.LowDisplacementRank(rank=1),
    "ldr2": projections.LowDisplacementRank(rank=2),
    "ldr4": projections.LowDisplacementRank(rank=4),
}
LABELS = {
    "gaussian": "Gaussian",
    "circulant": "circulant",
    "skew_circulant": "skew-circulant",
    "toeplitz": "Toeplitz",
    "hankel": "Hankel",
    "ldr1": "LDR r=1",
    "ldr2": "LDR r=2",
    "ldr4": "LDR r=4",
}
REFERENCE = "gaussian"
BOUND_PAIR_BATCH = 250  # pairs per row_covariance call (memory: batch x m x t floats)
MEASUREMENTS = "measurements.json"


def method_name(family: str, preprocess: bool) -> str:
    return f"{family}_hd" if preprocess else family


def methods(config: ml_collections.ConfigDict) -> list[tuple[str, str, bool]]:
    """``(name, family, preprocess)`` for every family and preprocessing choice."""
    return [
        (method_name(family, preprocess), family, preprocess)
        for family in config.families
        for preprocess in config.preprocess
    ]


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the config field that is out of range."""
    validate.require_names(config, "families", tuple(FAMILIES))
    validate.require(
        REFERENCE in config.families, "families", config.families, f"including {REFERENCE!r}"
    )
    validate.require_nonempty(config, "preprocess", "epsilons")
    validate.require_positive(config, "epsilons")
    eps = list(config.epsilons)
    validate.require(eps == sorted(set(eps)), "epsilons", config.epsilons, "increasing")
    validate.require_int(config, "num_draws", minimum=2)
    validate.require_int(config, "draws_per_chunk", "bound_draws", "num_pairs", minimum=1)
    contrast, prefix = config.chi_contrast, "config.chi_contrast"
    validate.require_names(contrast, "family", tuple(FAMILIES), prefix)
    validate.require_int(contrast, "dims", "num_features", minimum=1, prefix=prefix)
    validate.require(
        len(set(contrast.dims)) == 2, "dims", contrast.dims, "two distinct block sizes", prefix
    )
    validate.require(
        0 < contrast.tail_floor < 1, "tail_floor", contrast.tail_floor, "in (0, 1)", prefix
    )


def load_points(config: ml_collections.ConfigDict) -> tuple[np.ndarray, float]:
    """``structured_kernels.load_points`` (centred, mean norm 1, median-distance lengthscale)
    without the pixels that are constant on the subset (they carry nothing)."""
    points, lengthscale = structured_kernels.load_points(config)
    return points[:, points.std(axis=0) > 0], lengthscale


def choose_pairs(num_points: int, num_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random subset of ``num_pairs`` of the pairs i < j."""
    first, second = np.triu_indices(num_points, 1)
    if num_pairs > len(first):
        raise ValueError(f"num_pairs must be <= {len(first)} (all pairs), got {num_pairs}")
    chosen = np.sort(np.random.default_rng(seed + 1).choice(len(first), num_pairs, replace=False))
    return first[chosen], second[chosen]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _estimates(model, preprocess, num_features, keys, points, first, second):
    """K_hat of every pair under one projection per key: ``(keys, pairs)``."""
    dim = points.shape[-1]

    def one(key):
        projection = projections.p_model(
            key, dim, num_features, generator=model, preprocess=preprocess
        )
        phi = features.fourier_features(points, projection)
        return jnp.sum(phi[first] * phi[second], axis=-1)

    return jax.vmap(one)(keys)


def measure_errors(
    config, model, preprocess, points, first, second, exact, key, num_features=None
) -> dict:
    """Statistics of K_hat - K over ``config.num_draws`` draws (SEs over draws), with
    ``num_features`` projections (default: the points' dimension, one full block).

    Per draw: the mean over pairs of the squared error (``mse``) and of the error (``bias``),
    the fraction of pairs with |error| > eps (``tail``) and whether the largest |error| over
    pairs exceeds eps (``max_tail``); each as mean and SE. Per pair: the mean error over draws
    and its SE, summarised as the number of pairs with |mean| > 4 SE (``flagged_pairs``).
    """
    eps = np.asarray(config.epsilons)
    num_pairs = len(first)
    per_draw: dict[str, list[np.ndarray]] = {"mse": [], "bias": [], "tail": [], "max_tail": []}
    pair_sum, pair_squares = np.zeros(num_pairs), np.zeros(num_pairs)
    args = (jnp.asarray(points, jnp.float32), jnp.asarray(first), jnp.asarray(second))
    num_features = num_features or points.shape[-1]
    for start in outputs.progress(range(0, config.num_draws, config.draws_per_chunk), "draws"):
        count = min(config.draws_per_chunk, config.num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        estimates = _estimates(model, preprocess, num_features, keys, *args)
        errors = np.asarray(estimates, np.float64) - exact  # (count, pairs)
        per_draw["mse"].append(np.mean(errors**2, axis=1))
        per_draw["bias"].append(np.mean(errors, axis=1))
        per_draw["tail"].append(np.mean(np.abs(errors)[..., None] > eps, axis=1))
        per_draw["max_tail"].append(np.abs(errors).max(axis=1)[:, None] > eps)
        pair_sum += errors.sum(axis=0)
        pair_squares += (errors**2).sum(axis=0)
    draws = config.num_draws
    pair_mean = pair_sum / draws
    pair_se = np.sqrt((pair_squares - draws * pair_mean**2) / (draws - 1) / draws)
    result = {"flagged_pairs": int(np.sum(np.abs(pair_mean) > 4 * pair_se))}
    for name, values in per_draw.items():
        mean, se = stats.mean_se(np.concatenate(values))
        result[name], result[f"{name}_se"] = mean.tolist(), se.tolist()
    return result


def covariance_norms(config, model, preprocess, deltas, key) -> np.ndarray:
    """lambda = ||Cov(W delta)||_op per pair, for ``config.bound_draws`` draws of the HD signs
    and h (one draw when the P-model has neither): ``(draws, pairs)``.

    For independent rows Cov(W delta) = |delta|^2 I (no draw needed)."""
    if isinstance(model, projections.IndependentRows):
        return np.sum(deltas**2, axis=-1)[None]
    dim, num_features = deltas.shape[-1], deltas.shape[-1]
    norms = []
    for index in range(config.bound_draws):
        projection = projections.p_model(
            jax.random.fold_in(key, index),
            dim,
            num_features,
            generator=model,
            preprocess=preprocess,
        )
        row = []
        for start in range(0, len(deltas), BOUND_PAIR_BATCH):
            covariance = theory.row_covariance(projection, deltas[start : start + BOUND_PAIR_BATCH])
            row.append(np.linalg.eigvalsh(covariance)[..., -1])
        norms.append(np.concatenate(row))
        if projection.signs is None and projection.parameters is None:
            break  # deterministic given the data
    return np.stack(norms)


def measure_method(config, family, preprocess, data, key) -> dict:
    """Error statistics, chi[P], the budget t and the P-model bound of one method."""
    scaled, first, second, deltas, exact = data
    model = FAMILIES[family]
    draw_key, bound_key = jax.random.split(key)
    result = measure_errors(config, model, preprocess, scaled, first, second, exact, draw_key)
    dim = scaled.shape[-1]
    sample = projections.p_model(bound_key, dim, dim, generator=model, preprocess=preprocess)
    norms = covariance_norms(config, model, preprocess, deltas, bound_key)  # (draws, pairs)
    eps = np.asarray(config.epsilons)
    bound = theory.structured_fourier_bound(eps[:, None, None], dim, norms[None])
    result.update(
        budget=model.budget_size(sample.block_dim),
        block_dim=sample.block_dim,
        chromatic=1 if family == REFERENCE else theory.p_model_chromatic_number(sample),
        mean_lambda=float(norms.mean()),
        p_model_bound=bound.mean(axis=(1, 2)).tolist(),  # over HD/h draws and pairs
    )
    return result


def measure_chi_contrast(config, data, key) -> dict:
    """The contrast of chi[P] within one family at equal m and (nearly) equal budget: the
    plain ``config.chi_contrast.family`` P-model at each block size n of
    ``config.chi_contrast.dims`` (the points zero-padded to n, which changes no kernel value),
    each with the same ``num_features`` rows; per n the error statistics of ``measure_errors``
    (independent draws per n), chi[P] and the budget t.

    Raises:
      ValueError: if a block size is below the points' dimension.
    """
    scaled, first, second, _, exact = data
    contrast = config.chi_contrast
    model = FAMILIES[contrast.family]
    measured = {}
    for index, n in enumerate(contrast.dims):
        if n < scaled.shape[-1] or contrast.num_features > n:
            raise ValueError(
                f"config.chi_contrast.dims must be >= the data's d = {scaled.shape[-1]} and >= "
                f"num_features = {contrast.num_features}, got {n}"
            )
        padded = np.pad(scaled, ((0, 0), (0, n - scaled.shape[-1])))
        draw_key = jax.random.fold_in(key, index)
        result = measure_errors(
            config, model, False, padded, first, second, exact, draw_key, contrast.num_features
        )
        sample = projections.p_model(
            draw_key, n, contrast.num_features, generator=model, preprocess=False
        )
        result.update(
            chromatic=theory.p_model_chromatic_number(sample),
            budget=model.budget_size(sample.block_dim),
        )
        measured[str(n)] = result
    return measured


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Per-method statistics, the within-family chi contrast (``chi_contrast``) and data
    constants, JSON-serialisable.

    With a ``workdir``, each finished method (and the contrast) is saved to
    ``workdir/measurements.json`` and a rerun with the same config resumes from it (``report``
    can then be rerun alone; a changed ``chi_contrast`` reruns the contrast only).
    """
    validate_config(config)
    path = os.path.join(workdir, MEASUREMENTS) if workdir else None
    results: dict[str, Any] = {
        "config": records.settings(config, exclude=("chi_contrast",)),
        "methods": {},
        "seconds": 0.0,
    }
    if path and os.path.exists(path):
        with open(path) as handle:
            saved = json.load(handle)
        if saved.get("config") == results["config"]:
            results = saved
    points, lengthscale = load_points(config)
    scaled = points / lengthscale  # the kernel exp(-|x - y|^2 / 2) on scaled points
    first, second = choose_pairs(len(points), config.num_pairs, config.seed)
    deltas = scaled[first] - scaled[second]
    exact = np.exp(-0.5 * np.sum(deltas**2, axis=-1))
    data = (scaled, first, second, deltas, exact)
    key = jax.random.key(config.seed)
    for index, (name, family, preprocess) in enumerate(
        outputs.progress(methods(config), "methods")
    ):
        if name in results["methods"]:
            continue
        method_started = time.perf_counter()
        results["methods"][name] = measure_method(
            config, family, preprocess, data, jax.random.fold_in(key, index)
        )
        results["seconds"] += time.perf_counter() - method_started
        if path:
            outputs.write_json(path, results)
    contrast_settings = records.settings(config.chi_contrast)
    if results.get("chi_contrast", {}).get("settings") != contrast_settings:
        started = time.perf_counter()
        measured = measure_chi_contrast(config, data, jax.random.fold_in(key, 10_000))
        results["chi_contrast"] = {
            "settings": contrast_settings,
            "dims": measured,
            "seconds": time.perf_counter() - started,
            "load_average": os.getloadavg()[0],
        }
        if path:
            outputs.write_json(path, results)
    dim = points.shape[-1]
    distances = np.linalg.norm(scaled[:, None] - scaled[None], axis=-1)
    results.update(
        dim=dim,
        num_features=dim,
        lengthscale=lengthscale,
        diameter=float(distances.max()),
        iid_mse=float(np.mean(theory.rff_mse(scaled[first], scaled[second], dim))),
    )
    return results


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def method_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per method: budget, chi, MSE, bias, MSE ratio to the reference, pair checks."""
    reference = results["methods"][REFERENCE]
    rows = []
    for name, family, preprocess in methods(config):
        measured = results["methods"][name]
        mse, mse_se = measured["mse"], measured["mse_se"]
        ratio = mse / reference["mse"]
        ratio_se = ratio * math.hypot(mse_se / mse, reference["mse_se"] / reference["mse"])
        rows.append(
            {
                "method": name,
                "family": family,
                "preprocess": preprocess,
                "n": measured["block_dim"],
                "budget t": measured["budget"],
                "chi[P]": measured["chromatic"],
                "MSE": mse,
                "MSE SE": mse_se,
                "ratio to Gaussian": ratio,
                "ratio SE": 0.0 if name == REFERENCE else ratio_se,
                "bias": measured["bias"],
                "bias SE": measured["bias_se"],
                "bias z": measured["bias"] / measured["bias_se"],
                "pairs abs(z) > 4": measured["flagged_pairs"],
                "mean lambda": measured["mean_lambda"],
            }
        )
    return rows


def tail_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per (method, eps): empirical tails (pairwise and max over pairs) and bounds."""
    eps = np.asarray(config.epsilons)
    m, dim = results["num_features"], results["dim"]
    hoeffding = theory.rff_pointwise_bound(eps, m)
    uniform = theory.rff_uniform_bound(
        eps, m, dim, diameter=results["diameter"], sigma_p=math.sqrt(dim)
    )
    rows = []
    for name, family, _ in methods(config):
        measured = results["methods"][name]
        chromatic = theory.chromatic_deviation_bound(eps, m, measured["chromatic"])
        for index, epsilon in enumerate(eps):
            rows.append(
                {
                    "method": name,
                    "family": family,
                    "eps": float(epsilon),
                    "tail": measured["tail"][index],
                    "tail SE": measured["tail_se"][index],
                    "max tail": measured["max_tail"][index],
                    "max tail SE": measured["max_tail_se"][index],
                    "Hoeffding": float(hoeffding[index]),
                    "chromatic": float(chromatic[index]),
                    "P-model": measured["p_model_bound"][index],
                    "uniform": float(uniform[index]),
                }
            )
    return rows


def plot_budget(rows: list[dict], results: dict, path: str) -> None:
    """MSE against the budget of randomness t (log-log), 2-SE bars; plain vs HD markers."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for index, family in enumerate(families):
        offset = 2 ** (0.04 * (index - (len(families) - 1) / 2))  # equal budgets side by side
        for row in (r for r in rows if r["family"] == family):
            ax.errorbar(
                row["budget t"] * offset,
                row["MSE"],
                yerr=2 * row["MSE SE"],
                fmt="s" if row["preprocess"] else "o",
                mfc="none" if row["preprocess"] else f"C{index}",
                color=f"C{index}",
                ms=6,
                capsize=2,
                label=LABELS[family] if not row["preprocess"] else None,
            )
    ax.axhline(results["iid_mse"], color="k", lw=0.8, ls="--", label="i.i.d. theory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("budget of randomness t (Gaussians per block)")
    ax.set_ylabel("MSE of K_hat (mean over pairs)")
    ax.set_title(
        f"m = d = {results['dim']}: filled = plain, open = HD preprocessing; bars 2 SE;\n"
        "points with equal t offset sideways",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2)
    outputs.save_figure(fig, path)


def plot_tails(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Empirical tails (bands: 2 SE) against the bounds, one panel per family."""
    families = list(config.families)
    columns = min(4, len(families))
    lines = math.ceil(len(families) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.4 * columns, 3.0 * lines), squeeze=False)
    floor = 1.0 / (config.num_draws * config.num_pairs)
    for ax, family in zip(axes.flat, families, strict=False):
        for preprocess, style in ((False, "-"), (True, "--")):
            mine = [r for r in rows if r["method"] == method_name(family, preprocess)]
            if not mine:
                continue
            eps = np.array([r["eps"] for r in mine])
            tail = np.array([r["tail"] for r in mine])
            se = np.array([r["tail SE"] for r in mine])
            seen = tail > 0  # no exceedance seen: nothing to draw on a log axis
            suffix = " HD" if preprocess else ""
            plots.series(
                ax,
                eps[seen],
                tail[seen],
                np.maximum(tail - 2 * se, floor)[seen],
                (tail + 2 * se)[seen],
                color="k",
                label=f"empirical{suffix}",
                style=style,
                alpha=0.15,
                band_label=f"empirical ± 2 SE{suffix}",
                lw=1.4,
            )
            ax.plot(eps, [r["P-model"] for r in mine], "C0" + style, label=f"P-model bound{suffix}")
            ax.plot(eps, [r["chromatic"] for r in mine], "C1" + style, label=f"k/chi bound{suffix}")
        ax.plot(eps, [r["Hoeffding"] for r in mine], "C2:", label="Hoeffding (i.i.d.)")
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, 2.5)
        ax.set_title(LABELS[family], fontsize=9)
        ax.set_xlabel("eps")
    axes.flat[0].set_ylabel("P(|K_hat - K| > eps)")
    axes.flat[0].legend(fontsize=6)
    for ax in axes.flat[len(families) :]:
        ax.set_visible(False)
    outputs.save_figure(fig, path)


def _mse(row: dict, n: int) -> Estimate:
    return Estimate(row["MSE"], row["MSE SE"], n)


def _compare(a: dict, b: dict, n: int) -> str:
    d = stats.independent_difference(_mse(a, n), _mse(b, n))
    shown = tabulate.plus_minus(d.mean, d.se, ".3g", ".2g")
    return f"{a['method']} - {b['method']} = {shown} (z = {d.t:+.1f})"


def numbers(results: dict, config: ml_collections.ConfigDict) -> dict[str, str]:
    """The numbers behind each statement of the template's table (``<claim>_numbers``)."""
    rows, tails, n = method_rows(results, config), tail_rows(results, config), config.num_draws
    by_name = {r["method"]: r for r in rows}
    worst = max(rows, key=lambda r: abs(r["bias z"]))
    values = {
        "unbiased_numbers": f"largest abs(bias)/SE over {len(rows)} methods: "
        f"{abs(worst['bias z']):.1f} ({worst['method']}); pairs with abs(bias) > 4 SE: "
        f"{sum(r['pairs abs(z) > 4'] for r in rows)} of {len(rows) * config.num_pairs} "
        f"(chance: {len(rows) * config.num_pairs * 6.3e-5:.1f})"
    }
    pairs = {
        "budget": [
            (method_name("toeplitz", p), method_name("circulant", p)) for p in config.preprocess
        ],
        "ldr": [
            (method_name(big, p), method_name(small, p))
            for p in config.preprocess
            for small, big in (("ldr1", "ldr2"), ("ldr2", "ldr4"))
        ],
    }
    for key, chosen in pairs.items():
        found = [(by_name[a], by_name[b]) for a, b in chosen if a in by_name and b in by_name]
        values[f"{key}_numbers"] = "; ".join(_compare(a, b, n) for a, b in found) or "-"
    hd = [
        (by_name[method_name(f, True)], by_name[method_name(f, False)])
        for f in config.families
        if f != REFERENCE and method_name(f, True) in by_name and method_name(f, False) in by_name
    ]
    values["hd_numbers"] = (
        "MSE ratio plain / HD: "
        + ", ".join(f"{LABELS[b['family']]} {b['MSE'] / a['MSE']:.2f}" for a, b in hd)
        if hd
        else "-"
    )
    structured = [r for r in rows if r["family"] != REFERENCE]
    if len(structured) >= 3:
        mse = [r["MSE"] for r in structured]
        for key, column in (("chi_order", "chi[P]"), ("lambda_order", "mean lambda")):
            rank = scipy_stats.spearmanr([r[column] for r in structured], mse)
            values[f"{key}_numbers"] = (
                f"Spearman({column}, MSE) = {rank.statistic:.2f} (p = {rank.pvalue:.2g}) over "
                f"{len(structured)} structured methods"
            )
    else:
        values["chi_order_numbers"] = values["lambda_order_numbers"] = "-"
    values["chi_order_numbers"] = (
        f"{chi_contrast_text(results, config)}; across families (descriptive: chi moves with "
        f"the budget and the coherence there): {values['chi_order_numbers']}"
    )
    for key, bound in (
        ("hoeffding", "Hoeffding"),
        ("p_model", "P-model"),
        ("chromatic", "chromatic"),
    ):
        checked = [t for t in tails if bound != "Hoeffding" or t["family"] == REFERENCE]
        below = sum(t["tail"] <= t[bound] + 4 * t["tail SE"] for t in checked)
        values[f"{key}_numbers"] = (
            f"{below} of {len(checked)} (method, eps) cells below the bound (+4 SE)"
        )
    reference = [t for t in tails if t["method"] == REFERENCE]
    at = min(reference, key=lambda t: abs(t["eps"] - 0.1))
    values["uniform_numbers"] = (
        f"bound at m = {results['num_features']}: {at['uniform']:.3g} at eps = {at['eps']:g}; "
        f"empirical P(max over pairs > {at['eps']:g}): {at['max tail']:.3g} ± "
        f"{at['max tail SE']:.2g}"
    )
    return values


def contrast_labels(results: dict) -> tuple[str, str]:
    """ "n = N (chi = C)" of the chi contrast's block sizes, the larger chi first."""
    dims = results["chi_contrast"]["dims"]
    larger, smaller = sorted(dims, key=lambda n: -dims[n]["chromatic"])
    return _contrast_label(dims, larger), _contrast_label(dims, smaller)


def _contrast_label(dims: dict, n: str) -> str:
    return f"n = {n} (chi = {dims[n]['chromatic']})"


def chi_contrast_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """Per eps: the tail P(|K_hat - K| > eps) at the chi contrast's two block sizes (the larger
    chi first; independent draws), ln of their ratio with its delta-method SE, and the ratio
    the m / chi mechanism would give if the errors were Gaussian with variance proportional to
    chi[P]: 2 Q(z sqrt(chi_low / chi_high)) at the low-chi tail 2 Q(z)."""
    dims = results["chi_contrast"]["dims"]
    high, low = sorted(dims.values(), key=lambda d: -d["chromatic"])
    high_label, low_label = contrast_labels(results)
    rows = []
    for index, eps in enumerate(config.epsilons):
        p_high, p_low = high["tail"][index], low["tail"][index]
        se_high, se_low = high["tail_se"][index], low["tail_se"][index]
        z = scipy_stats.norm.isf(p_low / 2) if p_low > 0 else math.inf
        predicted = 2 * scipy_stats.norm.sf(z * math.sqrt(low["chromatic"] / high["chromatic"]))
        both = p_high > 0 and p_low > 0
        rows.append(
            {
                "eps": float(eps),
                f"tail, {high_label}": p_high,
                f"tail, {high_label} SE": se_high,
                f"tail, {low_label}": p_low,
                f"tail, {low_label} SE": se_low,
                "ln ratio": math.log(p_high / p_low) if both else math.nan,
                "ln ratio SE": math.hypot(se_high / p_high, se_low / p_low) if both else math.nan,
                "m / chi reading": math.log(predicted / p_low) if p_low > 0 else math.nan,
            }
        )
    return rows


def chi_order_cells(results: dict, config: ml_collections.ConfigDict) -> dict[float, Estimate]:
    """The chi contrast's cells as the verdict tests them: per eps where both tails are at
    least ``tail_floor``, ln(tail at the larger chi / tail at the smaller)."""
    high, low = contrast_labels(results)
    return {
        row["eps"]: Estimate(row["ln ratio"], row["ln ratio SE"], config.num_draws)
        for row in chi_contrast_rows(results, config)
        if min(row[f"tail, {high}"], row[f"tail, {low}"]) >= config.chi_contrast.tail_floor
    }


def equivalence_bound_text(estimate: Estimate, level: float, margin: float) -> str:
    """What an interval establishes about an effect's size: the bound B = max(|low|, |high|)
    of the ``level`` interval, i.e. the effect lies within ±B (here a log ratio, so a ratio
    within a factor e^B), and whether B is inside the declared ``margin``."""
    low, high = estimate.interval(level)
    bound = max(abs(low), abs(high))
    inside = "inside" if bound < margin else "not inside"
    return (
        f"equivalence bound: the {100 * level:g}% interval [{low:+.3f}, {high:+.3f}] puts the "
        f"effect within ±{bound:.3f} (a tail ratio within a factor {math.exp(bound):.3f} either "
        f"way), {inside} the declared margin {margin:.3f} (ln 1.1) in both directions"
    )


def chi_contrast_text(results: dict, config: ml_collections.ConfigDict) -> str:
    """The chi contrast's MSEs, its tails at the shown eps and the equivalence bound its pooled
    interval establishes (the verdict's own estimate and level), for the claims' table."""
    dims = results["chi_contrast"]["dims"]
    high, low = (dims[n] for n in sorted(dims, key=lambda n: -dims[n]["chromatic"]))
    labels = contrast_labels(results)
    n = config.num_draws
    mse = [Estimate(d["mse"], d["mse_se"], n) for d in (high, low)]
    difference = stats.independent_difference(*mse)
    shown = min(chi_contrast_rows(results, config), key=lambda r: abs(r["eps"] - 0.15))
    claim = verdicts.Claim.from_config(config.claims.chi_order)
    return (
        f"{config.chi_contrast.family}, m = {config.chi_contrast.num_features} rows, "
        f"{labels[0]} against {labels[1]}: MSE {mse[0].mean:.4g} against {mse[1].mean:.4g} "
        f"(difference {tabulate.plus_minus(difference.mean, difference.se, '+.2g', '.2g')}); at "
        f"eps = {shown['eps']:g} ln(tail ratio) = "
        f"{tabulate.plus_minus(shown['ln ratio'], shown['ln ratio SE'], '+.3f')}, where the "
        f"m / chi mechanism with Gaussian errors would give {shown['m / chi reading']:+.2f}; "
        + equivalence_bound_text(
            stats.pool(list(chi_order_cells(results, config).values()), shared_units=True),
            claim.level,
            claim.margin,
        )
    )


def _circulant_chi(n: int) -> int:
    """chi[P] of a circulant P-model: its coherence graphs are cycles of length n / gcd(n,
    shift), odd for some shift iff n is not a power of 2."""
    return 3 if n & (n - 1) else 2


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares (methods use independent draws)."""
    judge = verdicts.Verdicts(config)
    rows, tails, n = method_rows(results, config), tail_rows(results, config), config.num_draws
    by_name = {r["method"]: r for r in rows}
    worst = max(rows, key=lambda r: abs(r["bias z"]))
    flags = sum(r["pairs abs(z) > 4"] for r in rows)
    judge.effect(
        "unbiased",
        Estimate(worst["bias"], worst["bias SE"], n),
        effect=f"mean error of the most biased of {len(rows)} methods ({worst['method']})",
        units="draws",
        note=f"Pairs with |bias| > 4 SE: {flags} of {len(rows) * config.num_pairs} (chance: "
        f"{len(rows) * config.num_pairs * 6.3e-5:.1f})",
    )
    circulants = [
        m
        for m in ("circulant", "circulant_hd", "skew_circulant", "skew_circulant_hd")
        if m in by_name
    ]
    judge.fact(
        "circulant_chi",
        all(by_name[m]["chi[P]"] == _circulant_chi(by_name[m]["n"]) for m in circulants),
        ", ".join(
            f"{m}: chi[P] = {by_name[m]['chi[P]']} at n = {by_name[m]['n']}" for m in circulants
        )
        + "; Fig. 1 (n = 5): every graph a 5-cycle, chi = 3 (tests)",
    )
    toeplitz = [
        by_name[m]["chi[P]"]
        for m in ("toeplitz", "toeplitz_hd", "hankel", "hankel_hd")
        if m in by_name
    ]
    judge.fact(
        "toeplitz_chi",
        all(c == 2 for c in toeplitz),
        f"chi[P] of Toeplitz/Hankel (plain, HD): {', '.join(map(str, toeplitz))}; Fig. 2 "
        "(5 x 5): four path forests, chi = 2 (tests)",
    )

    def lower(name: str, pairs: list[tuple[str, str]], effect: str, cell_name: str):
        """MSE(second) - MSE(first) over the measured pairs: the first lower."""
        cells = {
            f"{a} vs {b}": stats.independent_difference(_mse(by_name[b], n), _mse(by_name[a], n))
            for a, b in pairs
            if a in by_name and b in by_name
        }
        if not cells:
            return judge.not_tested(name, "the families it compares were not run")
        return judge.ordering(
            name, cells, effect=effect, cell_name=cell_name, units="draws", number=".3g"
        )

    lower(
        "budget",
        [(method_name("toeplitz", p), method_name("circulant", p)) for p in config.preprocess],
        "MSE circulant - Toeplitz",
        "preprocessings",
    )
    lower(
        "ldr",
        [
            (method_name(big, p), method_name(small, p))
            for p in config.preprocess
            for small, big in (("ldr1", "ldr2"), ("ldr2", "ldr4"))
        ],
        "MSE at the smaller displacement rank - the larger",
        "(rank step, preprocessing)",
    )
    lower(
        "hd",
        [(method_name(f, True), method_name(f, False)) for f in config.families if f != REFERENCE],
        "MSE plain - HD",
        "families",
    )
    structured = [r for r in rows if r["family"] != REFERENCE]
    high, low = contrast_labels(results)
    judge.ordering(
        "chi_order",
        chi_order_cells(results, config),
        effect=f"ln(tail at {high} / tail at {low})",
        cell_name="eps",
        units="draws",
        shared_units=True,
    )
    if len(structured) < 5:
        judge.not_tested("lambda_order", "needs at least five structured methods")
    else:
        rho = scipy_stats.spearmanr(
            [r["mean lambda"] for r in structured], [r["MSE"] for r in structured]
        ).statistic
        count = len(structured)
        judge.effect(
            "lambda_order",
            Estimate(
                math.atanh(np.clip(rho, -1 + 1e-9, 1 - 1e-9)), math.sqrt(1.06 / (count - 3)), count
            ),
            effect=f"Fisher z of Spearman(mean lambda, MSE) (rho = {rho:.2f})",
            units="structured methods",
        )
    for claim, bound in (
        ("hoeffding", "Hoeffding"),
        ("p_model", "P-model"),
        ("chromatic", "chromatic"),
    ):
        checked = [t for t in tails if bound != "Hoeffding" or t["family"] == REFERENCE]
        _bound_verdict(judge, claim, checked, bound, "tail", "tail SE", n)
    reference = [t for t in tails if t["method"] == REFERENCE]
    _bound_verdict(judge, "uniform", reference, "uniform", "max tail", "max tail SE", n)
    return judge


def _bound_verdict(judge, name: str, cells: list[dict], bound: str, tail: str, se: str, n: int):
    """The bound holds: the empirical tail minus the bound at the (method, eps) cell where it
    is closest (``Verdicts.below_bound``)."""
    judge.below_bound(
        name,
        cells,
        measured=tail,
        bound=bound,
        se=se,
        draws=n,
        cell=lambda t: f"{t['method']}, eps {t['eps']:g}",
        effect="empirical tail - bound",
        cell_name="(method, eps) cells",
    )


def features_for_uniform_bound(epsilon: float, delta: float, dim: int, diameter: float) -> int:
    """The smallest m (frequencies) with ``rff_uniform_bound <= delta`` (bisection)."""

    def bound(m):
        return float(
            theory.rff_uniform_bound(epsilon, m, dim, diameter=diameter, sigma_p=math.sqrt(dim))
        )

    high = 1
    while bound(high) > delta:
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if bound(middle) > delta else (low, middle)
    return high


def power_note(rows: list[dict]) -> str:
    """The smallest MSE difference between two methods resolved with 80% power at 5%."""
    structured = [r for r in rows if r["family"] != REFERENCE]
    relative = [2.8 * math.sqrt(2) * r["MSE SE"] / r["MSE"] for r in structured]
    return (
        f"{min(relative):.1%}-{max(relative):.1%} of a structured method's MSE "
        f"(2.8 x the SE of a difference of two methods with similar SEs)"
    )


METHOD_COLUMNS = (
    "method",
    "n",
    "budget t",
    "chi[P]",
    "MSE",
    "MSE SE",
    "ratio to Gaussian",
    "ratio SE",
    "bias z",
    "pairs abs(z) > 4",
    "mean lambda",
)
BOUND_COLUMNS = {
    "method": "method",
    "P(abs err > eps)": "tail",
    "SE": "tail SE",
    "P-model bound": "P-model",
    "k/chi bound": "chromatic",
    "Hoeffding": "Hoeffding",
}


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures and the summary of ``measure``'s results."""
    rows = method_rows(results, config)
    tails = tail_rows(results, config)
    outputs.write_csv(f"{workdir}/tails.csv", tails)
    plot_budget(rows, results, f"{workdir}/error_vs_budget.png")
    plot_tails(tails, config, f"{workdir}/tails.png")
    eps_shown = min(config.epsilons, key=lambda e: abs(e - 0.15))
    bounds = outputs.select([t for t in tails if t["eps"] == eps_shown], BOUND_COLUMNS)
    summary = verdicts.write_summary(
        workdir,
        "structured_concentration",
        judge(results, config),
        config,
        dim=results["dim"],
        hd_dim=max(r["n"] for r in rows),
        lengthscale=f"{results['lengthscale']:.3f}",
        method_table=outputs.markdown_table(outputs.select(rows, METHOD_COLUMNS)),
        eps_shown=eps_shown,
        bound_table=outputs.markdown_table(bounds, float_format="{:.3g}"),
        iid_mse=f"{results['iid_mse']:.4g}",
        power=power_note(rows),
        runtime=f"{results['seconds'] / 60:.1f}",
        ratio_plain=_ratio_range(rows, False),
        ratio_hd=_ratio_range(rows, True),
        uniform_m=f"{features_for_uniform_bound(0.1, 0.05, results['dim'], results['diameter']):,}",
        **contrast_values(results, config),
        **numbers(results, config),
    )
    outputs.write_csv(os.path.join(workdir, "methods.csv"), rows)
    return {"rows": rows, "tails": tails, "summary": summary, "iid_mse": results["iid_mse"]}


def contrast_values(results: dict, config: ml_collections.ConfigDict) -> dict[str, str]:
    """The chi contrast's settings, run time and table for the summary template."""
    contrast = results["chi_contrast"]
    dims = contrast["dims"]
    return {
        "contrast_dims": " and ".join(dims),
        "contrast_chis": " and ".join(str(d["chromatic"]) for d in dims.values()),
        "contrast_budgets": " and ".join(str(d["budget"]) for d in dims.values()),
        "contrast_runtime": f"{contrast['seconds'] / 60:.1f} min, 1-min load average "
        f"{contrast['load_average']:.1f} at its end",
        "contrast_table": outputs.markdown_table(
            chi_contrast_rows(results, config), float_format="{:.4g}"
        ),
    }


def _ratio_range(rows: list[dict], preprocess: bool) -> str:
    ratios = [
        r["ratio to Gaussian"]
        for r in rows
        if r["family"] != REFERENCE and r["preprocess"] == preprocess
    ]
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
