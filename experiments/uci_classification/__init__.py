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

Modules: ``task`` (one data set: split, exact kernel, accuracies over draws), ``tables``
(tables and figure), ``reporting`` (verdicts, summary); this module validates the config and
measures.
"""

from __future__ import annotations

import time

import ml_collections

from experiments.core.kernel_classifier import (
    SPLITS,
    split_and_scale,
)
from experiments.core.study import Study
from experiments.core.validate import (
    require_int,
    require_interval,
    require_names,
    require_no_repeats,
    require_positive,
)
from experiments.uci_classification.reporting import (
    judge,
    report,
)
from experiments.uci_classification.tables import (
    approach_table,
    fig8_table,
    orderings,
    table2,
    table3,
)
from experiments.uci_classification.task import (
    LABELS,
    PAPER_TABLE_2,
    draw_accuracies,
    exact_accuracy,
    measure_dataset,
    prepare,
    ratios_for,
    typical_norm_of_sum,
)
from rfjax import data, projections

__all__ = [
    "LABELS",
    "PAPER_TABLE_2",
    "SPLITS",
    "STUDY",
    "approach_table",
    "draw_accuracies",
    "exact_accuracy",
    "fig8_table",
    "judge",
    "measure",
    "measure_dataset",
    "orderings",
    "prepare",
    "ratios_for",
    "report",
    "split_and_scale",
    "table2",
    "table3",
    "typical_norm_of_sum",
    "validate_config",
]


STUDY = Study(
    paper="Simplex Random Features (Reid et al., ICML 2023)",
    order=40,
    reproduces=(
        "SimRF Fig. 8, Tables 2 and 3: kernel-regression classification on 8 UCI sets "
        "(shipped in `rfjax/data/uci`)"
    ),
)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the data sets, ratios, couplings and splits before anything runs (by hand only the
    rule that spans fields: a repetition count for every data set).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(
        config,
        "datasets",
        "couplings",
        "ratios",
        "approach_couplings",
        "approach_ratios",
        "extra_ratios",
        "fast_couplings",
        "fast_ratios",
        "table2_splits",
    )
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
    require_int(config.repetitions, *config.datasets, minimum=1, prefix="config.repetitions")
    if config.approach_ratios:
        require_int(config, "approach_repetitions", minimum=1)
    require_interval(config, "test_fraction", interval="(0, 1)")
    require_interval(config, "exact_tolerance", interval="[0, 1]")  # an accuracy gap
    require_int(config, "split_seed", minimum=0)
    require_positive(config, "memory_mb")
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
