"""Nonparametric classification by Gaussian kernel regression on the UCI sets (SimRF Sec. 5.3).

Protocol (SimRF Sec. 5.3, App. B.1-B.2; split and encoding as the authors' public script): one
fixed random split per data set, a seeded permutation with the last ``test_fraction`` (5%) held
out for testing; inputs standardised with the training mean and standard deviation, then
multiplied by the paper's sigma (``rfjax.data.UCI_BANDWIDTHS``). A test point x gets the class

    argmax_c sum_{j: y_j = c} K_hat(x, x_j),   K_hat(x, x_j) = phi(x) . phi(x_j),

with Gaussian-kernel positive random features phi (K = exp(-|x - y|^2 / 2)). By linearity the
sum is phi(x) . S_c with S_c = sum_{j in c} phi(x_j), so one draw costs O(N m d) for all test
points, never the O(N_train N_test) kernel matrix. The exact-kernel classifier uses
sum_{j in c} exp(-|x - x_j|^2 / 2). Each coupling is drawn ``num_repetitions`` times (keys
vmapped in batches within one jitted call); accuracy mean and standard error over the draws.

Splits (``SPLITS``): ``"all_rows"`` permutes every row of the file (``default_rng(seed)``) and
holds out its last int(0.05 n) rows, training on the rest; ``"authors"`` is the authors'
``load_data_onehot``: the file's last line dropped (``load_uci(rows="authors")``: n is one
smaller for every set but nursery), training on the first int(0.95 n) rows of the permutation
and testing on the last int(0.05 n), so one row between them is unused when the two round
down (banknote: 1,302 + 68 of 1,371 rows). The same seed thus gives different test sets.

Fig. 8: accuracy vs m/d for IID, ORF, SimRF (and SimRF+) beside the exact kernel, m/d up to
``max(config.ratios + config.extra_ratios)`` for sets with d <= ``extra_ratios_max_dim``.
Table 2: SimRF vs SimRF+ at m = d on every split of ``table2_splits``. Table 3: the fast
HD-product couplings vs the regular ones, on inputs zero-padded to p = 2^ceil(log2 d) with
m = (m/d) p for every coupling (the paper's "same effective d").

``measure`` computes; ``report`` writes the tables, the figure and the summary (claims and
verdicts from ``experiments/uci_classification/summary.md``).
"""

from __future__ import annotations

import math
import os
import time
import zlib

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, plots, stats, tabulate, verdicts
from experiments.core.kernel_classifier import (
    SPLITS,
    random_feature_accuracies,
    split_and_scale,
)
from experiments.core.stats import Estimate
from experiments.core.study import Study
from experiments.core.validate import require_int, require_names
from rfjax import data, projections
from rfjax.ops import pad_to_power_of_two

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Simplex Random Features (Reid et al., ICML 2023)",
    order=40,
    reproduces=(
        "SimRF Fig. 8, Tables 2 and 3: kernel-regression classification on 8 UCI sets "
        "(shipped in `rfjax/data/uci`)"
    ),
)

LABELS = {**outputs.COUPLING_LABELS, "exact": "exact"}

# SimRF paper Table 2 (m = d, the Fig. 8 protocol), rows in the order of UCI_DATASETS (the row
# labels were lost in the seed's extraction; the order is that of the paper's Fig. 8 and the
# authors' script, and its first column, the typical |x + y|, matches ours row by row):
# (typical |x + y|, SimRF, SimRF SE, SimRF+, SimRF+ SE).
PAPER_TABLE_2 = {
    "abalone": (1.7, 0.1421, 0.0002, 0.1419, 0.0002),
    "banknote": (2.6, 0.7229, 0.0012, 0.7132, 0.0012),
    "car": (5.0, 0.6754, 0.0004, 0.6751, 0.0004),
    "yeast": (3.1, 0.3202, 0.0004, 0.3208, 0.0004),
    "cmc": (2.0, 0.4047, 0.0005, 0.4065, 0.0005),
    "nursery": (1.4, 0.6874, 0.0005, 0.6917, 0.0004),
    "wifi": (0.8, 0.6314, 0.0018, 0.6473, 0.0018),
    "chess": (2.3, 0.2000, 0.0001, 0.2000, 0.0001),
}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def typical_norm_of_sum(x: np.ndarray, key: int = 0, num_pairs: int = 20_000) -> float:
    """Mean |x_i + x_j| over random pairs of (scaled) inputs: Table 2's first column."""
    rng = np.random.default_rng(key)
    i, j = rng.integers(0, len(x), (2, num_pairs))
    return float(np.linalg.norm(x[i] + x[j], axis=1).mean())


def _padded_columns(x: np.ndarray) -> np.ndarray:
    """Zero-padded columns to p = 2^ceil(log2 d) (the paper's padding for HD products)."""
    return np.asarray(pad_to_power_of_two(x, axis=1))


def ratios_for(config: ml_collections.ConfigDict, dim: int) -> tuple[int, ...]:
    """The m/d values of a data set: ``ratios``, plus ``extra_ratios`` if d is small."""
    extra = tuple(config.extra_ratios) if dim <= config.extra_ratios_max_dim else ()
    return tuple(sorted({*config.ratios, *extra}))


# ---------------------------------------------------------------------------------------------
# Classifiers
# ---------------------------------------------------------------------------------------------


@jax.jit
def _exact_log_scores(x_train, onehot_train, x_test):
    """log sum_{j in c} exp(-|x - x_j|^2 / 2) up to a per-row constant, shape (N_test, C)."""
    squared = (
        jnp.sum(x_test**2, axis=-1, keepdims=True)
        - 2 * x_test @ x_train.T
        + jnp.sum(x_train**2, axis=-1)
    )
    log_kernel = -0.5 * squared
    shift = jnp.max(log_kernel, axis=-1, keepdims=True)
    return jnp.log(jnp.exp(log_kernel - shift) @ onehot_train) + shift


def exact_accuracy(
    x_train: np.ndarray,
    onehot_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    test_batch: int = 256,
) -> float:
    """Test accuracy of the exact Gaussian-kernel classifier (test points in batches)."""
    correct = 0
    for start in range(0, len(x_test), test_batch):
        scores = _exact_log_scores(x_train, onehot_train, x_test[start : start + test_batch])
        correct += int(
            np.sum(np.argmax(np.asarray(scores), axis=-1) == y_test[start:][:test_batch])
        )
    return correct / len(x_test)


def repetition_batch(num_train: int, num_features: int, budget_mb: float, repetitions: int) -> int:
    """How many draws to vmap at once so the training features fit in ``budget_mb``."""
    per_draw = 4 * num_train * num_features * 2  # float32 features and their exp argument
    return int(min(repetitions, max(1, budget_mb * 2**20 // per_draw)))


def draw_accuracies(
    keys: jax.Array,
    couplings: tuple[str, ...],
    num_blocks: tuple[int, ...],
    split: tuple[np.ndarray, ...],
    repetitions: int,
    memory_mb: float,
    description: str,
) -> np.ndarray:
    """Accuracies of ``repetitions`` independent draws per coupling (one key each in ``keys``).

    Draws are vmapped in equal chunks sized to ``memory_mb`` (one compilation per call); the
    last chunk is filled up with extra keys whose results are dropped.

    Returns:
      Shape ``(len(couplings), repetitions, len(num_blocks))``.
    """
    x_train, onehot_train, x_test, y_test = split
    num_features = max(num_blocks) * x_train.shape[1] * len(couplings)
    chunk = repetition_batch(len(x_train), num_features, memory_mb, repetitions)
    num_chunks = math.ceil(repetitions / chunk)
    draws = jax.vmap(lambda key: jax.random.split(key, num_chunks * chunk))(keys)
    draws = draws.reshape(len(couplings), num_chunks, chunk).swapaxes(0, 1)
    parts = [
        np.asarray(
            random_feature_accuracies(
                chunk_keys, couplings, num_blocks, x_train, onehot_train, x_test, y_test
            )
        )
        for chunk_keys in outputs.progress(draws, description)
    ]
    return np.concatenate(parts, axis=1)[:, :repetitions]


def _stable_id(name: str) -> int:
    return zlib.crc32(name.encode())


def prepare(name: str, config: ml_collections.ConfigDict, split: str) -> dict:
    """Loads, splits and scales one data set; its facts (sizes, exact accuracy, |x + y|)."""
    x, y = data.load_uci(
        name,
        config.data_dir,
        categorical=config.categorical,
        rows="authors" if split == "authors" else "all",
    )
    x_train, y_train, x_test, y_test = split_and_scale(
        x,
        y,
        sigma=data.UCI_BANDWIDTHS[name],
        test_fraction=config.test_fraction,
        seed=config.split_seed,
        split=split,
    )
    onehot_train = np.eye(int(y.max()) + 1, dtype=np.float32)[y_train]
    counts = np.bincount(y_test, minlength=onehot_train.shape[1])
    facts = {
        "dataset": name,
        "split": split,
        "num_rows": len(x),
        "num_train": len(x_train),
        "num_test": len(x_test),
        "dim": x.shape[1],
        "padded_dim": _padded_columns(x_test[:1]).shape[1],
        "num_classes": onehot_train.shape[1],
        "sigma": data.UCI_BANDWIDTHS[name],
        "majority_rate": float(counts.max() / counts.sum()),
        "exact_accuracy": exact_accuracy(x_train, onehot_train, x_test, y_test),
        "norm_of_sum": typical_norm_of_sum(x_train),
        "paper_norm_of_sum": PAPER_TABLE_2[name][0],
    }
    return {"facts": facts, "split": (x_train, onehot_train, x_test, y_test)}


def _padded(split: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    x_train, onehot_train, x_test, y_test = split
    return _padded_columns(x_train), onehot_train, _padded_columns(x_test), y_test


def measure_dataset(
    index: int, prepared: dict, config: ml_collections.ConfigDict, tables: dict
) -> list[dict]:
    """Rows (split, table, coupling, m/d, accuracy mean and SE) of one set on one split.

    ``tables`` maps a table name ("fig8", "fast", "approach") to (couplings, ratios, padded,
    repetitions). Couplings that see the same inputs with the same number of draws (the Fig. 8
    ones on the scaled inputs, Table 3's on inputs padded to p; both the same when d = p) run
    in one call, and a coupling that appears in both tables with d = p is drawn once and
    reported in both.
    """
    facts = prepared["facts"]
    name, split = facts["dataset"], facts["split"]
    root = jax.random.fold_in(jax.random.key(config.seed, impl=config.prng_impl), index)
    root = jax.random.fold_in(root, SPLITS.index(split))
    groups: dict[
        tuple[int, int], dict
    ] = {}  # (input dimension, draws) -> inputs, couplings, ratios
    group_of = {}
    for table, (couplings, ratios, padded, repetitions) in tables.items():
        inputs = _padded(prepared["split"]) if padded else prepared["split"]
        group_of[table] = (inputs[0].shape[1], repetitions)
        group = groups.setdefault(group_of[table], {"inputs": inputs, "couplings": []})
        group["couplings"] += [c for c in couplings if c not in group["couplings"]]
        group["ratios"] = tuple(sorted(set(group.get("ratios", ())) | set(ratios)))
    accuracy = {}
    for (dim, repetitions), group in groups.items():
        couplings = tuple(group["couplings"])
        keys = jnp.stack(
            [
                jax.random.fold_in(
                    jax.random.fold_in(root, _stable_id(c)), dim * 100_003 + repetitions
                )
                for c in couplings
            ]
        )
        values = draw_accuracies(
            keys,
            couplings,
            group["ratios"],
            group["inputs"],
            repetitions,
            config.memory_mb,
            f"{name} {split} d={dim}",
        )
        for coupling, per_ratio in zip(couplings, values, strict=True):
            for ratio, draws in zip(group["ratios"], per_ratio.T, strict=True):
                accuracy[coupling, dim, repetitions, ratio] = draws
    rows = []
    for table, (couplings, ratios, _, repetitions) in tables.items():
        dim = group_of[table][0]
        for coupling in couplings:
            for ratio in ratios:
                draws = accuracy[coupling, dim, repetitions, ratio]
                rows.append(
                    {
                        "dataset": name,
                        "split": split,
                        "table": table,
                        "coupling": coupling,
                        "ratio": int(ratio),
                        "dim": dim,
                        "num_features": int(ratio * dim),
                        "repetitions": repetitions,
                        "accuracy": float(draws.mean()),
                        "accuracy_se": float(stats.mean_se(draws)[1]),
                    }
                )
    return rows


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the data sets, ratios, couplings and splits before anything runs (by hand only the
    rule that spans fields: a repetition count for every data set).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_names(config, "datasets", data.UCI_DATASETS)
    for field in ("ratios", "extra_ratios", "fast_ratios", "approach_ratios"):
        if config[field]:  # () runs none
            require_int(config, field, minimum=1)
    for field in ("couplings", "fast_couplings", "approach_couplings"):
        if config[field]:  # () runs none
            require_names(config, field, projections.available())
    missing = [name for name in config.datasets if name not in config.repetitions]
    if missing:
        raise ValueError(f"config.repetitions has no entry for {missing}")
    require_names(config, "table2_ratio", tuple(config.ratios))
    require_names(config, "split", SPLITS)
    if config.table2_splits:  # () makes no Table 2
        require_names(config, "table2_splits", SPLITS)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Fig. 8 and Table 3 on ``config.split``; Table 2 (SimRF, SimRF+ at m/d =
    ``table2_ratio``) on every other split of ``table2_splits``. Writes nothing."""
    del workdir  # nothing to resume
    validate_config(config)
    start, cpu_start = time.perf_counter(), time.process_time()
    rows, facts = [], []
    table2_couplings = tuple(c for c in ("simplex", "simplex_plus") if c in config.couplings)
    for index, name in enumerate(config.datasets):
        prepared = prepare(name, config, config.split)
        facts.append(prepared["facts"])
        dim, repetitions = prepared["facts"]["dim"], config.repetitions[name]
        tables = {"fig8": (config.couplings, ratios_for(config, dim), False, repetitions)}
        if config.fast_couplings:
            tables["fast"] = (config.fast_couplings, config.fast_ratios, True, repetitions)
        if config.approach_ratios and dim <= config.extra_ratios_max_dim:
            tables["approach"] = (
                config.approach_couplings,
                config.approach_ratios,
                False,
                config.approach_repetitions,
            )
        rows += measure_dataset(index, prepared, config, tables)
        for split in config.table2_splits:
            if split == config.split or not table2_couplings:
                continue
            other = prepare(name, config, split)
            facts.append(other["facts"])
            tables = {
                "fig8": (
                    table2_couplings,
                    (config.table2_ratio,),
                    False,
                    config.repetitions[name],
                )
            }
            rows += measure_dataset(index, other, config, tables)
    return {
        "rows": rows,
        "facts": facts,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
    }


# ---------------------------------------------------------------------------------------------
# Tables, orderings and the figure
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Verdicts and the summary
# ---------------------------------------------------------------------------------------------


def _public(rows: list[dict]) -> list[dict]:
    """Rows without the private ``_`` columns."""
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def _accuracy(cell: dict) -> Estimate:
    return Estimate(cell["accuracy"], cell["accuracy_se"], cell["repetitions"])


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares (couplings use independent draws; the m
    of one coupling share their draws)."""
    judge = verdicts.Verdicts(config)
    rows, facts = results["rows"], results["facts"]
    fig8 = _lookup(rows, "fig8", config.split)
    for name, (better, worse) in (
        ("simrf_orf", ("simplex", "orthogonal")),
        ("orf_iid", ("orthogonal", "gaussian")),
    ):
        judge.ordering(
            name,
            {
                (d, r): stats.independent_difference(_accuracy(fig8[d, better, r]), _accuracy(c))
                for (d, c_name, r), c in fig8.items()
                if c_name == worse and (d, better, r) in fig8
            },
            effect=f"accuracy {LABELS[better]} - {LABELS[worse]}",
            cell_name="(data set, m/d)",
            units="draws",
            shared_units=True,
        )
    _approach(judge, rows, facts, config)
    plus = {
        (split, d): stats.independent_difference(
            _accuracy(cells[d, "simplex_plus", config.table2_ratio]),
            _accuracy(cells[d, "simplex", config.table2_ratio]),
        )
        for split in dict.fromkeys((config.split, *config.table2_splits))
        for cells in (_lookup(rows, "fig8", split),)
        for d in config.datasets
        if (d, "simplex_plus", config.table2_ratio) in cells
    }
    judge.ordering(
        "simrf_plus_marginal",
        plus,
        effect=f"accuracy SimRF+ - SimRF at m/d = {config.table2_ratio}",
        cell_name="(split, data set)",
        units="draws",
    )
    fast = _lookup(rows, "fast", config.split)
    judge.ordering(
        "fast_regular",
        {
            (d, LABELS[quick], r): stats.independent_difference(
                _accuracy(fast[d, quick, r]), _accuracy(fast[d, regular, r])
            )
            for (d, c, r) in fast
            for regular, quick in (("orthogonal", "hd_orthogonal"), ("simplex", "fast_simplex"))
            if c == quick and (d, regular, r) in fast
        },
        effect="accuracy fast - regular coupling",
        cell_name="(data set, fast coupling, m/p)",
        units="draws",
    )
    authors = _lookup(rows, "fig8", "authors")
    judge.every(
        "reproduces_paper",
        {
            d: stats.independent_difference(
                _accuracy(authors[d, "simplex", config.table2_ratio]),
                Estimate(PAPER_TABLE_2[d][1], PAPER_TABLE_2[d][2], 1),
            )
            for d in config.datasets
            if (d, "simplex", config.table2_ratio) in authors
        },
        effect="our SimRF - the paper's (Table 2, authors' split)",
        cell_name="data sets",
        units="draws",
    )
    return judge


def _approach(judge, rows: list[dict], facts: list[dict], config) -> None:
    """ "Tends to the exact kernel" on the small-d sets: the gap exact - SimRF shrinks from the
    largest Fig. 8 m/d to the largest approach m/d, and ends within the declared margin."""
    cells = {**_lookup(rows, "approach", config.split), **_lookup(rows, "fig8", config.split)}
    largest, start = max(config.approach_ratios, default=0), max(config.ratios)
    shrink, final = {}, {}
    for fact in _facts(facts, config.split):
        name = fact["dataset"]
        if (name, "simplex", largest) not in cells or (name, "simplex", start) not in cells:
            continue
        first, last = (
            _accuracy(cells[name, "simplex", start]),
            _accuracy(cells[name, "simplex", largest]),
        )
        shrink[name] = stats.independent_difference(last, first)
        final[name] = Estimate(fact["exact_accuracy"] - last.mean, last.se, last.n)
    judge.ordering(
        "approach_trend",
        shrink,
        effect=f"SimRF accuracy at m/d = {largest} - at m/d = {start}",
        cell_name="data sets",
        units="draws",
    )
    judge.every(
        "approach_within",
        final,
        effect=f"exact - SimRF accuracy at m/d = {largest}",
        cell_name="data sets",
        units="draws",
    )


FACT_COLUMNS = (
    "dataset",
    "split",
    "num_rows",
    "num_train",
    "num_test",
    "dim",
    "padded_dim",
    "num_classes",
    "sigma",
    "majority_rate",
    "exact_accuracy",
)


def table2_sections(rows: list[dict], facts: list[dict], config, tables: dict) -> list[str]:
    """Table 2 (SimRF vs SimRF+ at m = d) per split that was run, as markdown sections; each
    table is also stored in ``tables`` as ``table2_<split>``."""
    sections: list[str] = []
    if "simplex_plus" not in config.couplings or "simplex" not in config.couplings:
        return sections
    for split in dict.fromkeys(
        s for s in (config.split, *config.table2_splits) if _facts(facts, s)
    ):
        tables[f"table2_{split}"] = table2(rows, facts, config, split)
        sections.append(
            f"### Split `{split}`\n\n{outputs.markdown_table(tables[f'table2_{split}'])}\n"
        )
    return sections


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes results.csv, datasets.csv, tables.json, the figure, summary.md, verdicts.json
    and config.json."""
    rows, facts = results["rows"], results["facts"]
    order = orderings(rows, config)
    approach = approach_table(rows, facts, config)
    tables = {"orderings": _public(order), "approach": approach}
    table2_text = table2_sections(rows, facts, config, tables)
    table3_text = "(not run)"
    if config.fast_couplings:
        tables["table3"] = _public(table3(rows, facts, config))
        table3_text = outputs.markdown_table(tables["table3"])
    summary = verdicts.write_summary(
        workdir,
        "uci_classification",
        judge(results, config),
        config,
        test_fraction=f"{config.test_fraction:.0%}",
        ratios=tuple(config.ratios),
        extra_ratios=tuple(config.extra_ratios),
        repetitions=", ".join(f"{name} {config.repetitions[name]}" for name in config.datasets),
        minutes=f"{results['seconds'] / 60:.1f}",
        cpu_minutes=f"{results['cpu_seconds'] / 60:.1f}",
        fact_table=outputs.markdown_table(outputs.select(facts, FACT_COLUMNS)),
        fig8_table=outputs.markdown_table(fig8_table(rows, facts, config)),
        ordering_table=outputs.markdown_table(_public(order)) if order else "(not run)",
        approach_ratios=tuple(config.approach_ratios),
        approach_couplings=", ".join(LABELS[c] for c in config.approach_couplings),
        approach_table=outputs.markdown_table(approach),
        table2=("\n".join(table2_text) or "(SimRF+ not run)"),
        table3=table3_text,
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), rows)
    outputs.write_csv(os.path.join(workdir, "datasets.csv"), facts)
    outputs.write_json(os.path.join(workdir, "tables.json"), tables)
    plot(rows, facts, config, os.path.join(workdir, "accuracy_vs_features.png"))
    print(summary)
    return {**results, "tables": tables}
