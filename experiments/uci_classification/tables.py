"""UCI classification's tables and figure: Fig. 8, Tables 2 and 3, the orderings of the
couplings and the approach to the exact kernel.
"""

from __future__ import annotations

import math

import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, plots, tabulate
from experiments.uci_classification.task import LABELS, PAPER_TABLE_2, ratios_for

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _lookup(rows: list[dict], table: str, split: str) -> dict[tuple[str, str, int], dict]:
    return {
        (r["dataset"], r["coupling"], r["ratio"]): r
        for r in rows
        if r["table"] == table and r["split"] == split
    }


def _facts(facts: list[dict], split: str) -> list[dict]:
    return [f for f in facts if f["split"] == split]


def _difference(a: dict, b: dict) -> tuple[float, float]:
    """a - b and its SE (independent draws)."""
    return a["accuracy"] - b["accuracy"], math.hypot(a["accuracy_se"], b["accuracy_se"])


def orderings(rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """How often SimRF >= ORF, ORF >= IID, SimRF >= IID over the (data set, m/d) cells.

    ``ahead`` counts cells with a non-negative mean difference; ``significant_ahead`` /
    ``significant_behind`` those with difference / SE > 2 / < -2. ``average_*`` is the
    difference of the accuracies averaged over the data sets, per m/d of ``config.ratios``
    (the m/d every set has), with its SE.
    """
    fig8 = _lookup(rows, "fig8", config.split)
    datasets = list(config.datasets)
    result = []
    for better, worse in (
        ("simplex", "orthogonal"),
        ("orthogonal", "gaussian"),
        ("simplex", "gaussian"),
        ("simplex_plus", "simplex"),
    ):
        if better not in config.couplings or worse not in config.couplings:
            continue
        cells = [
            _difference(fig8[d, better, r], fig8[d, worse, r]) for (d, c, r) in fig8 if c == better
        ]
        row = {
            "comparison": f"{LABELS[better]} >= {LABELS[worse]}",
            "cells": len(cells),
            "ahead": sum(diff >= 0 for diff, _ in cells),
            "significant_ahead": sum(diff > 2 * se for diff, se in cells),
            "significant_behind": sum(diff < -2 * se for diff, se in cells),
        }
        for r in config.ratios:
            diffs = [_difference(fig8[d, better, r], fig8[d, worse, r]) for d in datasets]
            mean = sum(diff for diff, _ in diffs) / len(diffs)
            se = math.sqrt(sum(se**2 for _, se in diffs)) / len(diffs)
            row[f"average_m/d={r}"] = tabulate.plus_minus(mean, se, "+.4f")
            row[f"_average_{r}"] = (mean, se)
        result.append(row)
    return result


def _accuracy_text(cell: dict) -> str:
    """A cell's accuracy ± its SE over draws."""
    return tabulate.plus_minus(cell["accuracy"], cell["accuracy_se"])


def fig8_table(
    rows: list[dict], facts: list[dict], config: ml_collections.ConfigDict
) -> list[dict]:
    """Accuracy ± SE per data set and m/d, one column per coupling, the exact kernel beside."""
    fig8 = _lookup(rows, "fig8", config.split)
    table = []
    for fact in _facts(facts, config.split):
        for ratio in ratios_for(config, fact["dim"]):
            row = {"dataset": fact["dataset"], "m/d": int(ratio)}
            for coupling in config.couplings:
                cell = fig8[fact["dataset"], coupling, ratio]
                row[LABELS[coupling]] = _accuracy_text(cell)
            row["exact"] = f"{fact['exact_accuracy']:.4f}"
            table.append(row)
    return table


def approach_table(
    rows: list[dict], facts: list[dict], config: ml_collections.ConfigDict
) -> list[dict]:
    """Exact minus random-feature accuracy per small-d set (the "approach" draws) and m/d, for
    each approach coupling; whether SimRF is within ``config.exact_tolerance``."""
    cells = _lookup(rows, "approach", config.split)
    table = []
    for fact in _facts(facts, config.split):
        for ratio in config.approach_ratios:
            if (fact["dataset"], config.approach_couplings[0], ratio) not in cells:
                continue
            row = {"dataset": fact["dataset"], "d": fact["dim"], "m/d": ratio}
            row["exact"] = f"{fact['exact_accuracy']:.4f}"
            for coupling in config.approach_couplings:
                cell = cells[fact["dataset"], coupling, ratio]
                gap = fact["exact_accuracy"] - cell["accuracy"]
                row[f"exact - {LABELS[coupling]}"] = tabulate.plus_minus(
                    gap, cell["accuracy_se"], "+.4f"
                )
            if "simplex" in config.approach_couplings:
                gap = fact["exact_accuracy"] - cells[fact["dataset"], "simplex", ratio]["accuracy"]
                row[f"SimRF within {config.exact_tolerance}"] = abs(gap) <= config.exact_tolerance
            table.append(row)
    return table


def table2(
    rows: list[dict], facts: list[dict], config: ml_collections.ConfigDict, split: str
) -> list[dict]:
    """SimRF vs SimRF+ per data set at m/d = ``config.table2_ratio`` on ``split``, the paper's
    values beside with our distance from them in SE."""
    fig8 = _lookup(rows, "fig8", split)
    ratio = config.table2_ratio
    table = []
    for fact in _facts(facts, split):
        name = fact["dataset"]
        simrf, plus = fig8[name, "simplex", ratio], fig8[name, "simplex_plus", ratio]
        diff, se = _difference(plus, simrf)
        paper = PAPER_TABLE_2[name]
        z = (simrf["accuracy"] - paper[1]) / math.hypot(simrf["accuracy_se"], paper[2])
        table.append(
            {
                "dataset": name,
                "rows used": fact["num_train"] + fact["num_test"],
                "mean ‖x+y‖": f"{fact['norm_of_sum']:.2f}",
                "paper ‖x+y‖": f"{paper[0]:.1f}",
                "SimRF": _accuracy_text(simrf),
                "SimRF+": _accuracy_text(plus),
                "SimRF+ - SimRF": tabulate.plus_minus(diff, se, "+.4f"),
                "paper SimRF": tabulate.plus_minus(paper[1], paper[2]),
                "paper SimRF+": tabulate.plus_minus(paper[3], paper[4]),
                "SimRF - paper (SE)": f"{z:+.1f}",
                "exact": f"{fact['exact_accuracy']:.4f}",
            }
        )
    return table


def table3(rows: list[dict], facts: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Regular vs fast (HD-product) couplings on inputs padded to p, per data set and m/p."""
    fast = _lookup(rows, "fast", config.split)
    table = []
    for fact in _facts(facts, config.split):
        for ratio in config.fast_ratios:
            row = {"dataset": fact["dataset"], "d -> p": f"{fact['dim']} -> {fact['padded_dim']}"}
            row["m/p"] = int(ratio)
            for coupling in config.fast_couplings:
                cell = fast[fact["dataset"], coupling, ratio]
                row[LABELS[coupling]] = _accuracy_text(cell)
            for regular, quick in (("orthogonal", "hd_orthogonal"), ("simplex", "fast_simplex")):
                if regular in config.fast_couplings and quick in config.fast_couplings:
                    diff, se = _difference(
                        fast[fact["dataset"], quick, ratio], fast[fact["dataset"], regular, ratio]
                    )
                    row[f"{LABELS[quick]} - {LABELS[regular]}"] = tabulate.plus_minus(
                        diff, se, "+.4f"
                    )
                    row[f"_z_{quick}"] = diff / se if se > 0 else 0.0
            table.append(row)
    return table


def plot(rows: list[dict], facts: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Fig. 8: accuracy vs m/d per data set (mean, band ±2 SE), exact kernel dashed; average
    panel over the sets at the m/d they all have."""
    fig8 = {**_lookup(rows, "approach", config.split), **_lookup(rows, "fig8", config.split)}
    facts = _facts(facts, config.split)
    names = [fact["dataset"] for fact in facts]
    panels = len(names) + (len(names) > 1)
    columns = min(3, panels)
    fig, axes = plt.subplots(
        math.ceil(panels / columns),
        columns,
        figsize=(3.6 * columns, 2.9 * math.ceil(panels / columns)),
        squeeze=False,
    )
    for ax, name in zip(axes.flat, [*names, "average"][:panels], strict=False):
        subset = names if name == "average" else [name]
        for index, coupling in enumerate(config.couplings):
            ratios = np.asarray(
                config.ratios
                if name == "average"
                else sorted(r for (d, c, r) in fig8 if d == name and c == coupling)
            )
            mean = np.mean([[fig8[d, coupling, r]["accuracy"] for r in ratios] for d in subset], 0)
            se = np.sqrt(
                np.sum(
                    [[fig8[d, coupling, r]["accuracy_se"] ** 2 for r in ratios] for d in subset], 0
                )
            ) / len(subset)
            plots.series(
                ax,
                ratios,
                mean,
                mean - 2 * se,
                mean + 2 * se,
                color=f"C{index}",
                label=LABELS[coupling],
                alpha=0.25,
                marker="o",
                ms=3,
            )
        exact = np.mean([f["exact_accuracy"] for f in facts if f["dataset"] in subset])
        ax.axhline(exact, color="black", linestyle="--", linewidth=1, label="exact kernel")
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("m / d")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, title="mean over draws, band ±2 SE", title_fontsize=6)
    outputs.save_figure(fig, path)
