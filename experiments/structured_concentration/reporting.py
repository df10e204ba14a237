"""Structured concentration's report: tables, figures and the summary."""

from __future__ import annotations

import math
import os

import matplotlib
import ml_collections
import numpy as np
from scipy import stats as scipy_stats

from experiments.core import outputs, plots, stats, tabulate, verdicts
from experiments.structured_concentration.contrast import chi_contrast_text, contrast_values
from experiments.structured_concentration.judging import (
    features_for_uniform_bound,
    judge,
    power_note,
)
from experiments.structured_concentration.methods import LABELS, REFERENCE, method_name
from experiments.structured_concentration.rows import _mse, method_rows, tail_rows

matplotlib.use("Agg")
import matplotlib.pyplot as plt


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


def _ratio_range(rows: list[dict], preprocess: bool) -> str:
    ratios = [
        r["ratio to Gaussian"]
        for r in rows
        if r["family"] != REFERENCE and r["preprocess"] == preprocess
    ]
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
