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
``summary.md`` (template ``experiments/templates/structured_concentration.md``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
from scipy import stats

from experiments import structured_kernels
from experiments.core import outputs
from rfjax import features, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    unknown = [f for f in config.families if f not in FAMILIES]
    if unknown or REFERENCE not in config.families:
        raise ValueError(
            f"families must include {REFERENCE!r} and come from {tuple(FAMILIES)}, got "
            f"{config.families}"
        )
    if not config.preprocess or any(not isinstance(p, bool) for p in config.preprocess):
        raise ValueError(f"preprocess must be a non-empty tuple of bools, got {config.preprocess}")
    eps = config.epsilons
    if not eps or any(e <= 0 for e in eps) or list(eps) != sorted(set(eps)):
        raise ValueError(f"epsilons must be increasing positive numbers, got {eps}")
    for field in ("num_draws", "draws_per_chunk", "bound_draws", "num_pairs"):
        if not isinstance(config[field], int) or config[field] < (2 if field == "num_draws" else 1):
            raise ValueError(
                f"{field} must be a positive integer (num_draws >= 2), got {config[field]}"
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


def _mean_se(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return samples.mean(axis=0), samples.std(axis=0, ddof=1) / math.sqrt(len(samples))


def measure_errors(config, model, preprocess, points, first, second, exact, key) -> dict:
    """Statistics of K_hat - K over ``config.num_draws`` draws (SEs over draws).

    Per draw: the mean over pairs of the squared error (``mse``) and of the error (``bias``),
    the fraction of pairs with |error| > eps (``tail``) and whether the largest |error| over
    pairs exceeds eps (``max_tail``); each as mean and SE. Per pair: the mean error over draws
    and its SE, summarised as the number of pairs with |mean| > 4 SE (``flagged_pairs``).
    """
    eps = np.asarray(config.epsilons)
    num_pairs = len(first)
    per_draw = {"mse": [], "bias": [], "tail": [], "max_tail": []}
    pair_sum, pair_squares = np.zeros(num_pairs), np.zeros(num_pairs)
    args = (jnp.asarray(points, jnp.float32), jnp.asarray(first), jnp.asarray(second))
    for start in outputs.progress(range(0, config.num_draws, config.draws_per_chunk), "draws"):
        count = min(config.draws_per_chunk, config.num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        estimates = _estimates(model, preprocess, points.shape[-1], keys, *args)
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
        mean, se = _mean_se(np.concatenate(values).astype(np.float64))
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


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Per-method statistics and data constants, JSON-serialisable.

    With a ``workdir``, each finished method is saved to ``workdir/measurements.json`` and a
    rerun with the same config resumes from it (``report`` can then be rerun alone).
    """
    validate_config(config)
    path = os.path.join(workdir, MEASUREMENTS) if workdir else None
    settings = json.loads(json.dumps(config.to_dict()))  # as saved: tuples become lists
    results = {"config": settings, "methods": {}, "seconds": 0.0}
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
        stats = results["methods"][name]
        mse, mse_se = stats["mse"], stats["mse_se"]
        ratio = mse / reference["mse"]
        ratio_se = ratio * math.hypot(mse_se / mse, reference["mse_se"] / reference["mse"])
        rows.append(
            {
                "method": name,
                "family": family,
                "preprocess": preprocess,
                "n": stats["block_dim"],
                "budget t": stats["budget"],
                "chi[P]": stats["chromatic"],
                "MSE": mse,
                "MSE SE": mse_se,
                "ratio to Gaussian": ratio,
                "ratio SE": 0.0 if name == REFERENCE else ratio_se,
                "bias": stats["bias"],
                "bias SE": stats["bias_se"],
                "bias z": stats["bias"] / stats["bias_se"],
                "pairs abs(z) > 4": stats["flagged_pairs"],
                "mean lambda": stats["mean_lambda"],
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
        stats = results["methods"][name]
        chromatic = theory.chromatic_deviation_bound(eps, m, stats["chromatic"])
        for index, epsilon in enumerate(eps):
            rows.append(
                {
                    "method": name,
                    "family": family,
                    "eps": float(epsilon),
                    "tail": stats["tail"][index],
                    "tail SE": stats["tail_se"][index],
                    "max tail": stats["max_tail"][index],
                    "max tail SE": stats["max_tail_se"][index],
                    "Hoeffding": float(hoeffding[index]),
                    "chromatic": float(chromatic[index]),
                    "P-model": stats["p_model_bound"][index],
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
            ax.plot(eps[seen], tail[seen], "k" + style, lw=1.4, label=f"empirical{suffix}")
            ax.fill_between(
                eps[seen],
                np.maximum(tail - 2 * se, floor)[seen],
                (tail + 2 * se)[seen],
                color="k",
                alpha=0.15,
                label=f"empirical ± 2 SE{suffix}",
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


def _difference(a: dict, b: dict) -> tuple[float, float]:
    """MSE(a) - MSE(b) and its SE (independent draws)."""
    return a["MSE"] - b["MSE"], math.hypot(a["MSE SE"], b["MSE SE"])


def _compare(a: dict, b: dict) -> str:
    diff, se = _difference(a, b)
    return f"{a['method']} - {b['method']} = {diff:.3g} ± {se:.2g} (z = {diff / se:+.1f})"


def _ordering_verdict(pairs: list[tuple[dict, dict]], claim: str) -> str:
    """'holds' if every first MSE is below its second by > 3 SE; otherwise says why not."""
    z = [(_difference(a, b)[0] / _difference(a, b)[1], a, b) for a, b in pairs]
    if all(value < -3 for value, _, _ in z):
        return "holds"
    against = [f"{a['method']} vs {b['method']}" for value, a, b in z if value > 3]
    unresolved = [f"{a['method']} vs {b['method']}" for value, a, b in z if -3 <= value <= 3]
    parts = []
    if against:
        parts.append(f"the opposite is resolved for {', '.join(against)}")
    if unresolved:
        parts.append(f"within 3 SE for {', '.join(unresolved)}")
    return f"does not hold, because {'; '.join(parts)} ({claim})"


def verdicts(rows: list[dict], tails: list[dict], results: dict, config) -> dict[str, str]:
    """The numbers and verdict of each statement of the template."""
    by_name = {r["method"]: r for r in rows}
    values = {}
    worst = max(rows, key=lambda r: abs(r["bias z"]))
    pair_flags = sum(r["pairs abs(z) > 4"] for r in rows)
    expected_flags = len(rows) * config.num_pairs * 6.3e-5  # two-sided 4-sigma rate
    values["unbiased_numbers"] = (
        f"largest abs(bias)/SE over {len(rows)} methods: {abs(worst['bias z']):.1f} "
        f"({worst['method']}); pairs with abs(bias) > 4 SE: {pair_flags} of "
        f"{len(rows) * config.num_pairs} (chance: {expected_flags:.1f})"
    )
    values["unbiased_verdict"] = (
        "holds" if abs(worst["bias z"]) <= 4 else "does not hold, because a bias exceeds 4 SE"
    )
    chi = {r["method"]: r["chi[P]"] for r in rows}
    size = {r["method"]: r["n"] for r in rows}

    def circulant_chi(n: int) -> int:  # cycles of length n / gcd(n, shift): odd iff n != 2^k
        return 3 if n & (n - 1) else 2

    circulants = ("circulant", "circulant_hd", "skew_circulant", "skew_circulant_hd")
    measured = [m for m in circulants if m in chi]
    values["circulant_numbers"] = (
        ", ".join(f"{m}: chi[P] = {chi[m]} at n = {size[m]}" for m in measured)
        + "; Fig. 1 (n = 5): every graph a 5-cycle, chi = 3 (tests)"
    )
    circulant_ok = all(chi[m] == circulant_chi(size[m]) for m in measured)
    values["circulant_verdict"] = (
        "holds" if circulant_ok else "does not hold, because a circulant chi[P] differs from 2-3"
    )
    toeplitz = [chi[m] for m in ("toeplitz", "toeplitz_hd", "hankel", "hankel_hd") if m in chi]
    values["toeplitz_numbers"] = (
        f"chi[P] of Toeplitz/Hankel (plain, HD): {', '.join(map(str, toeplitz))}; Fig. 2 (5 x 5): "
        "four path forests, chi = 2 (tests)"
    )
    values["toeplitz_verdict"] = "holds" if all(c == 2 for c in toeplitz) else "does not hold"
    budget_pairs = [
        (by_name[method_name("toeplitz", p)], by_name[method_name("circulant", p)])
        for p in config.preprocess
        if method_name("toeplitz", p) in by_name and method_name("circulant", p) in by_name
    ]
    values["budget_numbers"] = "; ".join(_compare(a, b) for a, b in budget_pairs) or "-"
    values["budget_verdict"] = (
        _ordering_verdict(budget_pairs, "Toeplitz: t = 2n - 1, chi = 2; circulant: t = n")
        if budget_pairs
        else "not measured"
    )
    ldr_pairs = [
        (by_name[method_name(big, p)], by_name[method_name(small, p)])
        for p in config.preprocess
        for small, big in (("ldr1", "ldr2"), ("ldr2", "ldr4"))
        if method_name(big, p) in by_name and method_name(small, p) in by_name
    ]
    values["ldr_numbers"] = "; ".join(_compare(a, b) for a, b in ldr_pairs) or "-"
    values["ldr_verdict"] = (
        _ordering_verdict(ldr_pairs, "larger r, larger budget") if ldr_pairs else "not measured"
    )
    hd_pairs = [
        (by_name[method_name(f, True)], by_name[method_name(f, False)])
        for f in config.families
        if f != REFERENCE and method_name(f, True) in by_name and method_name(f, False) in by_name
    ]
    values["hd_numbers"] = (
        "MSE ratio plain / HD: "
        + ", ".join(f"{LABELS[b['family']]} {b['MSE'] / a['MSE']:.2f}" for a, b in hd_pairs)
        if hd_pairs
        else "-"
    )
    values["hd_verdict"] = (
        _ordering_verdict(hd_pairs, "HD vs plain") if hd_pairs else "not measured"
    )
    values.update(structure_verdicts(rows, by_name))
    for bound, key in (
        ("Hoeffding", "hoeffding"),
        ("P-model", "p_model"),
        ("chromatic", "chromatic"),
    ):
        checked = [t for t in tails if bound != "Hoeffding" or t["family"] == REFERENCE]
        above = [t for t in checked if t["tail"] > t[bound] + 4 * t["tail SE"]]
        useful = [t for t in checked if t[bound] < 1]
        slack = min((t[bound] / max(t["tail"], 1e-300) for t in useful), default=float("nan"))
        values[f"{key}_numbers"] = (
            f"{len(checked) - len(above)} of {len(checked)} (method, eps) cells below the bound "
            f"(+4 SE); smallest bound / empirical ratio where the bound is < 1: {slack:.3g}"
        )
        values[f"{key}_verdict"] = (
            "holds"
            if not above
            else "does not hold, because the empirical tail exceeds it for "
            + ", ".join(sorted({f"{t['method']} (eps {t['eps']:g})" for t in above}))
        )
    m, dim = results["num_features"], results["dim"]
    needed = features_for_uniform_bound(0.1, 0.05, dim, results["diameter"])
    reference_tails = [t for t in tails if t["method"] == REFERENCE]
    at_01 = min(reference_tails, key=lambda t: abs(t["eps"] - 0.1))
    values["uniform_numbers"] = (
        f"bound at m = {m}: {at_01['uniform']:.3g} at eps = {at_01['eps']:g} (vacuous); "
        f"m needed for <= 0.05 at eps = 0.1: {needed:,}; empirical P(max over pairs > "
        f"{at_01['eps']:g}) at m = {m}: {at_01['max tail']:.3g} ± {at_01['max tail SE']:.2g}"
    )
    values["uniform_verdict"] = (
        "holds (vacuously at this m)"
        if all(t["max tail"] <= t["uniform"] + 4 * t["max tail SE"] for t in reference_tails)
        else "does not hold"
    )
    return values


def structure_verdicts(rows: list[dict], by_name: dict[str, dict]) -> dict[str, str]:
    """Does chi[P], or lambda (a coherence measure), order the structured methods' MSEs?"""
    structured = [r for r in rows if r["family"] != REFERENCE]
    values = {}
    for key, preprocess in (("ratio_plain", False), ("ratio_hd", True)):
        ratios = [r["ratio to Gaussian"] for r in structured if r["preprocess"] == preprocess]
        values[key] = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
    if len(structured) < 3:
        for key in ("chi_order", "lambda_order"):
            values[f"{key}_numbers"], values[f"{key}_verdict"] = "-", "not measured"
        return values
    mse = [r["MSE"] for r in structured]
    chi = stats.spearmanr([r["chi[P]"] for r in structured], mse)
    lam = stats.spearmanr([r["mean lambda"] for r in structured], mse)
    lowest = min(structured, key=lambda r: r["MSE"])
    equal_chi = [
        (by_name[a], by_name[b])
        for a, b in (("toeplitz_hd", "circulant_hd"),)
        if a in by_name and b in by_name and by_name[a]["chi[P]"] == by_name[b]["chi[P]"]
    ]
    values["chi_order_numbers"] = (
        f"Spearman(chi[P], MSE) = {chi.statistic:.2f} (p = {chi.pvalue:.2g}) over "
        f"{len(structured)} structured methods; lowest MSE: {lowest['method']}, chi[P] = "
        f"{lowest['chi[P]']}"
        + "".join(f"; at equal chi[P] = {a['chi[P]']}: {_compare(a, b)}" for a, b in equal_chi)
    )
    values["chi_order_verdict"] = (
        "holds"
        if chi.statistic >= 0.5 and chi.pvalue < 0.01
        else f"does not hold, because chi[P] does not order the MSEs (rank correlation "
        f"{chi.statistic:.2f}): {lowest['method']} has the lowest MSE and chi[P] = "
        f"{lowest['chi[P]']} = n (dense P_i, complete coherence graphs)"
    )
    values["lambda_order_numbers"] = (
        f"Spearman(mean lambda, MSE) = {lam.statistic:.2f} (p = {lam.pvalue:.2g}) over the "
        "same methods"
    )
    values["lambda_order_verdict"] = (
        "holds"
        if lam.statistic >= 0.8 and lam.pvalue < 0.01
        else f"does not hold, because the rank correlation is only {lam.statistic:.2f}"
    )
    return values


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


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures and the summary of ``measure``'s results."""
    rows = method_rows(results, config)
    tails = tail_rows(results, config)
    outputs.write_csv(f"{workdir}/tails.csv", tails)
    plot_budget(rows, results, f"{workdir}/error_vs_budget.png")
    plot_tails(tails, config, f"{workdir}/tails.png")
    table = [
        {
            key: row[key]
            for key in (
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
        }
        for row in rows
    ]
    eps_shown = min(config.epsilons, key=lambda e: abs(e - 0.15))
    bound_table = [
        {
            "method": t["method"],
            "P(abs err > eps)": t["tail"],
            "SE": t["tail SE"],
            "P-model bound": t["P-model"],
            "k/chi bound": t["chromatic"],
            "Hoeffding": t["Hoeffding"],
        }
        for t in tails
        if t["eps"] == eps_shown
    ]
    summary = outputs.render_summary(
        "structured_concentration",
        dim=results["dim"],
        hd_dim=max(r["n"] for r in rows),
        num_points=config.num_points,
        num_pairs=config.num_pairs,
        num_draws=config.num_draws,
        bound_draws=config.bound_draws,
        seed=config.seed,
        lengthscale=f"{results['lengthscale']:.3f}",
        method_table=outputs.markdown_table(table, float_format="{:.4g}"),
        eps_shown=eps_shown,
        bound_table=outputs.markdown_table(bound_table, float_format="{:.3g}"),
        iid_mse=f"{results['iid_mse']:.4g}",
        power=power_note(rows),
        runtime=f"{results['seconds'] / 60:.1f}",
        **verdicts(rows, tails, results, config),
    )
    paths = outputs.save_run(
        workdir, rows=rows, summary=summary, config=config, csv_name="methods.csv"
    )
    return {
        "rows": rows,
        "tails": tails,
        "summary": summary,
        "paths": paths,
        "iid_mse": results["iid_mse"],
    }


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    return report(measure(config, workdir), config, workdir)
