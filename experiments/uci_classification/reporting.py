"""UCI classification's verdicts and summary."""

from __future__ import annotations

import os

import ml_collections

from experiments.core import outputs, stats, verdicts
from experiments.core.stats import Estimate
from experiments.uci_classification.tables import (
    _facts,
    _lookup,
    approach_table,
    fig8_table,
    orderings,
    plot,
    table2,
    table3,
)
from experiments.uci_classification.task import LABELS, PAPER_TABLE_2


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
