"""One-off: writes ``records.json`` into each committed ``results/<name>/`` from the files its
report wrote before studies stored their records (CSV and JSON tables; a few values that only
the committed summary kept, at the precision it printed them). Measures nothing.

Usage: python tools/migrate_records.py [NAME...]
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys

RESULTS = "results"


def typed(text: str):
    """A CSV cell as the value the report wrote: int, float, bool or str."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def rows(name: str, file: str) -> list[dict]:
    with open(os.path.join(RESULTS, name, file), newline="") as handle:
        return [{k: typed(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def summary_value(name: str, pattern: str) -> str:
    """The first group of ``pattern`` in the committed summary (values only it kept)."""
    with open(os.path.join(RESULTS, name, "summary.md")) as handle:
        match = re.search(pattern, handle.read())
    if match is None:
        raise ValueError(f"{name}: {pattern!r} not in summary.md")
    return match.group(1)


def kernel_mse(name: str):
    return rows(name, "results.csv")


def conformity(name: str):
    return {
        "rows": rows(name, "results.csv"),
        "differences": rows(name, "differences.csv"),
        "trace": rows(name, "trace.csv"),
        "norm_mismatch": float(summary_value(name, r"largest norm mismatch ([0-9.e+-]+)\)")),
    }


def gram_error(name: str):
    table = rows(name, "results.csv")
    first = table[0]
    return {
        "rows": table,
        "differences": rows(name, "differences.csv"),
        "data": {
            # |K|_F from the table (relative = frobenius / |K|_F); the mean |x_i + x_j| from
            # the summary, which alone kept it.
            "exact_norm": first["frobenius_mean"] / first["relative_mean"],
            "v_offdiag_mean": float(summary_value(name, r"over pairs ([0-9.]+)\)")),
        },
    }


def rff_error(name: str):
    return {
        "variance_rows": rows(name, "variance.csv"),
        "max_rows": rows(name, "max_error.csv"),
        "tail_rows": rows(name, "tail_probability.csv"),
    }


def structured_kernels(name: str):
    return {
        "rows": rows(name, "results.csv"),
        "lengthscale": float(summary_value(name, r"median pairwise distance =\s+([0-9.]+)")),
        "dim": int(summary_value(name, r"digits \(d = ([0-9]+);")),
    }


def structured_concentration(name: str):
    """measurements.json (the per-method measurements) and the data set's constants, which
    ``measure`` computes from the data (no draws): dim, lengthscale, diameter, i.i.d. MSE."""
    import numpy as np

    from experiments import structured_concentration as study
    from experiments.core import records
    from rfjax import theory

    with open(os.path.join(RESULTS, name, "measurements.json")) as handle:
        measured = json.load(handle)
    config = records.load_config(os.path.join(RESULTS, name))
    points, lengthscale = study.load_points(config)
    scaled = points / lengthscale
    first, second = study.choose_pairs(len(points), config.num_pairs, config.seed)
    distances = np.linalg.norm(scaled[:, None] - scaled[None], axis=-1)
    dim = points.shape[-1]
    return {
        **measured,
        "dim": dim,
        "num_features": dim,
        "lengthscale": lengthscale,
        "diameter": float(distances.max()),
        "iid_mse": float(np.mean(theory.rff_mse(scaled[first], scaled[second], dim))),
    }


def hrf_qmc(name: str):
    notes = []
    with open(os.path.join(RESULTS, name, "summary.md")) as handle:
        for line in handle:
            if line.startswith("- ") and "not registered" in line:
                notes.append(line[2:].strip())
    return {"rows": rows(name, "results.csv"), "notes": notes}


def hrf_clustered(name: str):
    return {"rows": rows(name, "results.csv"), "facts": rows(name, "configurations.csv")}


def uci_classification(name: str):
    """The tables; the run's wall and CPU time from the summary (printed in minutes)."""
    minutes = summary_value(name, r"Run time ([0-9.]+) min wall")
    cpu_minutes = summary_value(name, r"min wall, ([0-9.]+) min CPU")
    return {
        "rows": rows(name, "results.csv"),
        "facts": rows(name, "datasets.csv"),
        "seconds": float(minutes) * 60,
        "cpu_seconds": float(cpu_minutes) * 60,
    }


def markdown_rows(name: str, header: str) -> list[dict]:
    """The rows of the markdown table of the committed summary whose header line starts with
    ``header``, as typed values (empty cells NaN, bold z values unbolded)."""
    with open(os.path.join(RESULTS, name, "summary.md")) as handle:
        lines = handle.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("*") or "nan" for c in line.strip("|").split("|")]
        table.append({k: typed(v) for k, v in zip(names, cells, strict=True)})
    return table


def estimator_zoo(name: str):
    """The ranked rows, per-norm rows and ratios from their CSVs; the norm-coupled rows and the
    run time from the summary, which alone kept them (at its printed precision)."""
    ranked = rows(name, "results.csv")
    coupled = [
        {
            "data": r["data"],
            "mse_ratio": r["MSE norm-coupled / orthogonal"],
            "mse_z": r["z (MSE)"],
            "attention_ratio": r["attention error norm-coupled / orthogonal"],
            "attention_z": r["z (attention)"],
        }
        for r in markdown_rows(name, "| data | MSE norm-coupled")
    ]
    with open(os.path.join(RESULTS, name, "summary.md")) as handle:
        found = re.findall(
            r"(synthetic|real) ([0-9.]+) min \(load average ([0-9.]+) at its end\)", handle.read()
        )
    elapsed = {part: [float(minutes) * 60, float(load)] for part, minutes, load in found}
    return {
        "sets": [
            {"name": data, "paired": data == "synthetic"}
            for data in dict.fromkeys(r["data"] for r in ranked)
        ],
        "rows": ranked,
        "by_norm": rows(name, "by_norm.csv"),
        "norm_coupled": coupled,
        "ratios": rows(name, "ratios.csv"),
        "elapsed": elapsed,
    }


def metrics(name: str, run: str) -> list[dict]:
    """A committed run's metrics log (runs/<run>/metrics.jsonl)."""
    with open(os.path.join(RESULTS, name, "runs", run, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def conformer_ctc(name: str):
    """results.json held the runs, the split and the skipped kinds; the learning curves are the
    committed metrics logs."""
    with open(os.path.join(RESULTS, name, "results.json")) as handle:
        stored = json.load(handle)
    info_keys = ("train_recordings", "test_recordings", "train_speakers", "test_speakers")
    info = {k: stored[k] for k in (*info_keys, "max_frames", "mean_frames")}
    curves: dict[str, list] = {}
    for run in stored["runs"]:
        curves.setdefault(run["attention"], []).append(
            metrics(name, f"{run['attention']}_seed{run['seed']}")
        )
    return {"runs": stored["runs"], "curves": curves, "info": info, "skipped": stored["skipped"]}


def lstm_lm(name: str):
    """results.json held everything but the learning curves: those are the committed metrics
    logs (runs/<setting>-<estimator>_seed<k>)."""
    with open(os.path.join(RESULTS, name, "results.json")) as handle:
        stored = json.load(handle)
    curves: dict[str, list] = {}
    for run in stored["runs"]:
        folder = f"{run['setting']}-{run['estimator']}_seed{run['seed']}"
        curves.setdefault(run["arm"], []).append(metrics(name, folder))
    return {**stored, "curves": curves}


def performer_vit(name: str):
    """results.json held the runs; the learning curves are the committed metrics logs and the
    split sizes the summary's."""
    with open(os.path.join(RESULTS, name, "results.json")) as handle:
        stored = json.load(handle)
    curves: dict[str, list] = {}
    for run in sorted(stored["runs"], key=lambda r: r["seed"]):
        curves.setdefault(run["run"], []).append(metrics(name, f"{run['run']}_seed{run['seed']}"))
    return {
        "runs": stored["runs"],
        "curves": curves,
        "num_train": int(summary_value(name, r"([0-9]+) training and [0-9]+ test images")),
        "num_test": int(summary_value(name, r"[0-9]+ training and ([0-9]+) test images")),
    }


def performer_vit_maps(name: str):
    with open(os.path.join(RESULTS, name, "results.json")) as handle:
        stored = json.load(handle)
    return {
        "runs": stored["runs"],
        "num_test": int(summary_value(name, r"([0-9]+) test images")),
        # printed as "when this summary was written": the report was written when the sweep ended
        "load_average": float(summary_value(name, r"1-min load average ([0-9.]+) when")),
    }


def performer_lm(name: str):
    """results.json held the runs (and the comparison the report now judges from them); the
    devices and processes the run used from the summary, which alone printed them."""
    with open(os.path.join(RESULTS, name, "results.json")) as handle:
        stored = json.load(handle)
    return {
        "runs": stored["runs"],
        "devices": int(summary_value(name, r"([0-9]+) devices in [0-9]+ process")),
        "processes": int(summary_value(name, r"[0-9]+ devices in ([0-9]+) process")),
    }


MIGRATIONS = {
    "performer_lm": performer_lm,
    "performer_vit": performer_vit,
    "performer_vit_maps": performer_vit_maps,
    "lstm_lm": lstm_lm,
    "conformer_ctc": conformer_ctc,
    "conformer_ctc_attention_context": conformer_ctc,
    "estimator_zoo": estimator_zoo,
    "uci_classification": uci_classification,
    "hrf_clustered": hrf_clustered,
    "hrf_qmc": hrf_qmc,
    "hrf_pointwise": kernel_mse,  # the rows of results.csv
    "structured_concentration": structured_concentration,
    "structured_kernels": structured_kernels,
    "rff_error": rff_error,
    "kernel_mse": kernel_mse,
    "conformity": conformity,
    "gram_error": gram_error,
}


# iap_es and iap_es_pair: their results.json was measure's output already; it was renamed to
# records.json (git mv), nothing to migrate.


def main(names: list[str]) -> None:
    for name in names or sorted(MIGRATIONS):
        records = MIGRATIONS[name.split("@")[0]](name)
        with open(os.path.join(RESULTS, name, "records.json"), "w") as handle:
            json.dump(records, handle, indent=1)
        print(f"wrote {RESULTS}/{name}/records.json")


if __name__ == "__main__":
    main(sys.argv[1:])
