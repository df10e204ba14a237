"""The tables of a GPU run, from its raw JSON (``python -m benchmarks.gpu_report``).

  python -m benchmarks.gpu_report DIR [--fwht FILE] [--attention FILE ...]
      [--long-context FILE ...] [--out summary.md]

Reads ``benchmarks.fwht_gpu``, ``benchmarks.attention_gpu`` and ``benchmarks.long_context``
JSON files of one run directory
(``benchmarks/gpu_runs/<date>-<gpu>/``) and writes ``summary.md`` there: fwht time per call as a
ratio to a device copy for every implementation, the best one and ``"auto"``'s; FAVOR attention
against cuDNN flash attention, XLA exact attention and flash-linear-attention (time and memory
ratios, crossover lengths, the causal path's share of the roofline); the profile's kernels; the
long-context LM's training step, perplexity and decoding tables. Every number in the summary
comes from the JSON; nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib

from benchmarks.attention_gpu import BATCHES, DTYPES, MODES, PASSES


def _load(path: pathlib.Path) -> dict:
    with open(path) as handle:
        return json.load(handle)


# The fwht table's columns, those a run timed (a launch added later is absent from older runs).
FWHT_COLUMNS = (
    "mosaic_gpu",
    "mosaic_gpu_pipelined",
    "pallas_triton",
    "matmul",
    "xla_butterfly",
    "auto",
)


def fwht_section(report: dict) -> list[str]:
    """The fwht table: median time per call over a copy's, per case and implementation."""
    results = report["results"]
    timed = {key.split("/")[0] for res in results.values() for key in res["ratios"]}
    timed |= {name for res in results.values() for name in res["failed"]}
    names = [name for name in FWHT_COLUMNS if name in timed]
    lines = [
        f"## fwht on {report['device']} (sm {report['compute_capability']}, JAX {report['jax']})",
        "",
        f"{report['total_elements']:,} elements per call (rows x n); {report['timing']}. "
        "Entries: time per call / time of a copy of the same array in the same case (1.00 = the "
        "memory-bandwidth floor; `-` = does not take this case). Target: best <= 1.2 for "
        "n <= 8,192, <= 1.8 above. The last column holds the best against the fastest copy of "
        "the run (a case whose own copy ran slow cannot meet the target by it).",
        "",
        "| case | " + " | ".join(names) + " | copy (us, GB/s) | best | target met | best / "
        "fastest copy |",
        "|---|" + "---|" * (len(names) + 4),
    ]
    # per dtype: every case moves the same bytes, so one floor per dtype
    fastest: dict[str, float] = {}
    for case, res in results.items():
        dtype = case.split()[0]
        copy_ms = res["timings"]["copy"]["median_ms"]
        fastest[dtype] = min(fastest.get(dtype, copy_ms), copy_ms)
    for case, res in results.items():
        cells = []
        for name in names:
            ratio = res["ratios"].get(f"{name}/copy")
            cells.append(
                "failed" if name in res["failed"] else "-" if ratio is None else f"{ratio:.2f}"
            )
        copy = res["timings"]["copy"]
        copy_cell = f"{1e3 * copy['median_ms']:.0f}, {copy['gb_per_s']:,.0f}"
        met = "yes" if res["target_met"] else "no"
        floor = res["timings"][res["best"]]["median_ms"] / fastest[case.split()[0]]
        lines.append(
            f"| {case} | " + " | ".join(cells) + f" | {copy_cell} | {res['best']} | {met} | "
            f"{floor:.2f} |"
        )
    missing = report.get("not_measured") or []
    if missing:
        lines += ["", f"Not measured (the run's time budget ran out): {', '.join(missing)}."]
    failed = {
        f"{case} {name}": why
        for case, res in results.items()
        for name, why in res["failed"].items()
    }
    if failed:
        lines += ["", "Failures: " + "; ".join(f"{k}: {v}" for k, v in failed.items())]
    return lines


def _rows(reports: list[dict]) -> list[dict]:
    return [row for report in reports for row in report["rows"] if "pass" in row]


def _time(rows, dtype, batch, mode, name, method, length):
    for row in rows:
        key = (row["dtype"], row["batch"], row["mode"], row["pass"], row["method"], row["length"])
        if key == (dtype, batch, mode, name, method, length):
            return row
    return None


def _cell(row) -> str:
    if row is None:
        return "-"
    if row.get("median_s"):
        return f"{1e3 * row['median_s']:.2f}"
    reason = row.get("skipped") or ""
    return "OOM" if "memory" in reason.lower() or "limit" in reason else "n/a"


METHODS = ("favor", "cudnn", "xla", "fla", "features")
EXTRA = ("FAVOR memory / cuDNN's", "FAVOR memory / fla's", "FAVOR roofline share")
# Columns of runs that measured the fused kernels (``favor_pallas``) too, and of those that
# measured the Mosaic GPU forward kernels (``favor_mosaic``, from 2026-12-01) besides.
FUSED_METHODS = ("favor", "favor_pallas", "cudnn", "xla", "fla", "features")
FUSED_EXTRA = (
    "favor_pallas memory / cuDNN's",
    "favor_pallas memory / fla's",
    "favor roofline share",
    "favor_pallas roofline share",
)
MOSAIC_METHODS = ("favor", "favor_pallas", "favor_mosaic", "cudnn", "xla", "fla", "features")
MOSAIC_EXTRA = (*FUSED_EXTRA, "favor_mosaic roofline share")


def _columns(rows: list[dict]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(methods, extra columns) of the table: the fused kernels' where the run measured them."""
    measured = {row["method"] for row in rows}
    if "favor_mosaic" in measured:
        return MOSAIC_METHODS, MOSAIC_EXTRA
    if "favor_pallas" in measured:
        return FUSED_METHODS, FUSED_EXTRA
    return METHODS, EXTRA


def _memory_ratio(favor: dict, peer: dict | None) -> str:
    if favor.get("memory_bytes") and peer and peer.get("memory_bytes"):
        return f"{favor['memory_bytes'] / peer['memory_bytes']:.1f}"
    return "-"


def _share(row: dict | None) -> str:
    share = (row or {}).get("roofline", {}).get("share")
    return "-" if share is None else f"{100 * share:.1f}%"


def _attention_line(rows, dtype, batch, mode, name, length, methods) -> str:
    """One table line: every method's time, FAVOR's memory ratios and roofline share (with the
    fused kernels' (``favor_pallas`` in ``methods``): theirs against the peers, and every FAVOR
    method's share)."""
    fused = "favor_pallas" in methods
    found = {m: _time(rows, dtype, batch, mode, name, m, length) for m in methods}
    if mode == "bidirectional" or name != "forward":
        found["features"] = None  # timed once per case, under causal forward
    favor = found["favor_pallas" if fused else "favor"] or {}
    extra = [_memory_ratio(favor, found["cudnn"]), _memory_ratio(favor, found["fla"])]
    extra += [_share(found[m]) for m in methods if m.startswith("favor")]
    cells = [_cell(found[m]) for m in methods] + extra
    return f"| {mode} | {name} | {length:,} | " + " | ".join(cells) + " |"


def attention_section(reports: list[dict]) -> list[str]:
    """Time (ms) per method and length; FAVOR's ratios; memory; roofline; crossovers."""
    rows = _rows(reports)
    methods, extra = _columns(rows)
    fused = "favor_pallas" in methods
    head = reports[0]
    shape = head["shape"]
    peaks = head["peaks"]
    lines = [
        f"## FAVOR attention on {head['device']} (JAX {head['jax']})",
        "",
        f"{shape['heads']} heads of dimension {shape['head_dim']}, m = {shape['num_features']} "
        "FAVOR+ features. Times: median ms per call (interleaved repeats). `OOM`: exact attention "
        "does not fit (its T x T scores); `n/a`: not compiled (cuDNN takes no float32); `-`: not "
        "run (fla is causal only; cases beyond the run's time budget). fla times start from the "
        "features; `features` is the feature map alone. Peaks measured in the same run: "
        f"bf16 matmul {peaks['matmul_bfloat16_flop_per_s'] / 1e12:.0f} TFLOP/s, f32 (default "
        f"precision) {peaks['matmul_float32_default_flop_per_s'] / 1e12:.0f} TFLOP/s, copy "
        f"{peaks['copy_bytes_per_s'] / 1e12:.2f} TB/s.",
        "",
    ]
    for dtype in DTYPES:
        for batch in BATCHES:
            lengths = sorted(
                {r["length"] for r in rows if (r["dtype"], r["batch"]) == (dtype, batch)}
            )
            if not lengths:
                continue
            lines += [f"### {dtype}, B = {batch}", ""]
            lines += [
                "| mode | pass | T | " + " | ".join(methods) + " | " + " | ".join(extra) + " |"
            ]
            lines += ["|---|---|---|" + "---|" * (len(methods) + len(extra))]
            for mode, name, length in itertools.product(MODES, PASSES, lengths):
                lines.append(_attention_line(rows, dtype, batch, mode, name, length, methods))
            lines.append("")
    lines += crossover_lines(reports[0].get("summary", {}))
    if fused:
        lines += end_to_end_lines(reports[0].get("summary", {}))
    return lines


def crossover_lines(summary: dict) -> list[str]:
    lines = ["### Crossover against exact attention", ""]
    lines += [
        "| case | first T where FAVOR is faster | FAVOR / fla at each T "
        "| exact (XLA) fits up to T |"
    ]
    lines += ["|---|---|---|---|"]
    for case, values in summary.items():
        fla: dict = next((v for k, v in values["ratios"].items() if k.endswith("/fla")), {})
        fla_cell = ", ".join(f"{int(t):,}: {r:.1f}" for t, r in fla.items()) or "-"
        crossover = values["crossover_T"]
        fits = values["xla_exact_fits_up_to_T"]
        crossover_cell = "none measured" if crossover is None else f"{crossover:,}"
        fits_cell = "-" if fits is None else f"{fits:,}"
        lines.append(f"| {case} | {crossover_cell} | {fla_cell} | {fits_cell} |")
    return [*lines, ""]


def end_to_end_lines(summary: dict) -> list[str]:
    """FAVOR end to end from q, k, v against flash-linear-attention's chunked kernel plus the
    feature map's time (issue 42's target: <= 1.0)."""
    lines = ["### FAVOR end to end against flash-linear-attention plus the features", ""]
    lines += ["| case | FAVOR / (fla + features) at each T |", "|---|---|"]
    for case, values in summary.items():
        ratio: dict = next(
            (v for k, v in values["ratios"].items() if k.endswith("/fla+features")), {}
        )
        if ratio:
            cells = ", ".join(f"{int(t):,}: {r:.2f}" for t, r in ratio.items())
            lines.append(f"| {case} | {cells} |")
    return [*lines, ""]


def profile_section(profile: dict) -> list[str]:
    method = f" ({profile['method']})" if "method" in profile else ""
    lines = [
        f"## Profile: causal FAVOR{method} forward + backward, {profile['dtype']}, "
        f"B = {profile['batch']}, T = {profile['length']:,}"
        if method
        else f"## Profile: causal FAVOR forward + backward, {profile['dtype']}, "
        f"B = {profile['batch']}, T = {profile['length']:,}",
        "",
    ]
    if "error" in profile:
        return [*lines, f"Not profiled: {profile['error']}", ""]
    lines += [f"JAX's profiler over {profile['calls']} calls; GPU time per call by kernel.", ""]
    for line, values in profile["lines"].items():
        lines += [f"{line}: {values['total_ms_per_call']:.2f} ms per call", ""]
        lines += ["| kernel | ms per call | share |", "|---|---|---|"]
        total = values["total_ms_per_call"]
        for kernel, ms in values["top_ms_per_call"].items():
            lines.append(f"| `{kernel[:80]}` | {ms:.3f} | {100 * ms / total:.1f}% |")
        lines.append("")
    return lines


def long_context_section(reports: list[dict]) -> list[str]:
    """``benchmarks.long_context``'s tables from one or more of its JSONs (sections merged: a
    run's training steps from one, its perplexity and decoding rows from another)."""
    from benchmarks.long_context import table

    merged: dict = {"steps": [], "perplexity": [], "decode": []}
    for report in reports:
        for section in merged:
            merged[section] += report.get(section, [])
    first = reports[0]
    return [
        f"## Long-context causal LM on {first.get('device_kind', first['machine'])} "
        f"(JAX {first['jax']})",
        "",
        "`benchmarks.long_context` (issue 31): training step of `configs/performer_lm.py`'s "
        "model (memory: XLA's compiled analysis; tokens/s: median of interleaved steps), "
        "validation perplexity of the trained checkpoints, greedy decoding. Commands: "
        + "; ".join(f"`{report['command']}`" for report in reports)
        + ".",
        "",
        table(merged),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--fwht", default="fwht_gpu.json")
    parser.add_argument("--attention", nargs="+", default=["attention_gpu.json"])
    # Where benchmarks.gpu_run's steps write: its long_context step runs benchmarks.long_context
    # with --out DIR/long_context, which writes results.json there.
    parser.add_argument("--long-context", nargs="*", default=["long_context/results.json"])
    parser.add_argument("--out", default="summary.md")
    args = parser.parse_args()
    directory = args.directory
    lines = [f"# GPU run `{directory.name}`", ""]
    lines += [
        f"Generated by `python -m benchmarks.gpu_report` from the raw JSON in `{directory}`.",
        "",
    ]
    if (directory / args.fwht).exists():
        lines += [*fwht_section(_load(directory / args.fwht)), ""]
    attention = [_load(directory / name) for name in args.attention if (directory / name).exists()]
    measured = [report for report in attention if _rows([report])]
    if measured:
        lines += attention_section(measured)
    profiles = [
        profile
        for report in attention
        for profile in report.get("profiles", [report["profile"]] if "profile" in report else [])
    ]
    if profiles and "method" not in profiles[0]:
        lines += profile_section(profiles[0])
    else:
        for profile in profiles:
            lines += profile_section(profile)
    long_context = [directory / name for name in args.long_context]
    if any(path.exists() for path in long_context):
        lines += long_context_section([_load(path) for path in long_context if path.exists()])
    (directory / args.out).write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {directory / args.out}")


if __name__ == "__main__":
    main()
