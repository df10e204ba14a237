"""The committed GPU runs' summaries are what ``benchmarks.gpu_report`` makes of their raw JSON."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.support import ROOT

RUNS = sorted(p.parent for p in (ROOT / "benchmarks" / "gpu_runs").glob("*/command.txt"))


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_committed_summary_is_regenerated_from_the_json(run, tmp_path):
    command = shlex.split((run / "command.txt").read_text())
    assert command[:3] == ["python", "-m", "benchmarks.gpu_report"]
    out = tmp_path / "summary.md"
    subprocess.run([sys.executable, *command[1:], "--out", str(out)], cwd=ROOT, check=True)
    assert out.read_text() == (run / "summary.md").read_text()


def test_the_default_reads_what_gpu_run_writes(tmp_path):
    # benchmarks.gpu_run's long_context step writes long_context/results.json, and the README's
    # next-run command is `gpu_report DIR` with no options: the LM's tables must not go missing.
    run = ROOT / "benchmarks" / "gpu_runs" / "2026-11-30-h200" / "run2"
    for name in ("attention_gpu.json", "long_context/results.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((run / name).read_text())
    command = [sys.executable, "-m", "benchmarks.gpu_report", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    summary = (tmp_path / "summary.md").read_text()
    assert "## FAVOR attention on" in summary
    assert "## Long-context causal LM on" in summary


def test_the_fwht_table_marks_failures_and_cases_not_measured():
    """No committed run has a failed implementation or a case cut by the budget: a failure is
    "failed" (not "-", "does not take this case"), an implementation that failed in every case
    keeps its column, and the cases not measured and each failure's reason are listed."""
    from benchmarks import gpu_report

    def case(best, failed):
        timings = {"copy": {"median_ms": 0.01, "gb_per_s": 2000.0}, best: {"median_ms": 0.011}}
        return {
            "timings": timings,
            "ratios": {f"{best}/copy": 1.1},
            "failed": failed,
            "best": best,
            "target_met": best == "mosaic_gpu",
        }

    report = {
        "device": "GPU",
        "compute_capability": "9.0",
        "jax": "0",
        "total_elements": 1 << 24,
        "timing": "medians",
        "results": {
            "float32 n=64": case("mosaic_gpu", {"pallas_triton": "out of shared memory"}),
            "float32 n=128": case("matmul", {}),
        },
        "not_measured": ["bfloat16 n=64"],
    }
    lines = gpu_report.fwht_section(report)
    header = next(line for line in lines if line.startswith("| case |"))
    assert header.startswith("| case | mosaic_gpu | pallas_triton | matmul | copy (us, GB/s) |")
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| float32")}
    assert rows["| float32 n=64"].startswith("| float32 n=64 | 1.10 | failed | - | 10, 2,000 |")
    assert " | mosaic_gpu | yes | 1.10 |" in rows["| float32 n=64"]
    assert rows["| float32 n=128"].startswith("| float32 n=128 | - | - | 1.10 |")
    assert " | matmul | no | 1.10 |" in rows["| float32 n=128"]
    assert "Not measured (the run's time budget ran out): bfloat16 n=64." in lines
    assert "Failures: float32 n=64 pallas_triton: out of shared memory" in lines


def test_every_methods_profile_is_reported_and_a_run_without_rows_has_no_table(tmp_path):
    """attention_gpu profiles one method after another (favor_pallas, then favor_mosaic): each
    gets its section, one that failed says why; a JSON written before its first case (only the
    profiles) has no attention table."""
    profile = {"dtype": "bfloat16", "batch": 8, "length": 16384, "calls": 3}
    kernels = {"lines": {"forward + backward": {"total_ms_per_call": 2.0,
                                                "top_ms_per_call": {"k": 0.5}}}}  # fmt: skip
    profiles = [
        {**profile, "method": "favor_pallas", **kernels},
        {**profile, "method": "favor_mosaic", "error": "ValueError: no"},
    ]
    (tmp_path / "attention_gpu.json").write_text(json.dumps({"rows": [], "profiles": profiles}))
    command = [sys.executable, "-m", "benchmarks.gpu_report", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    summary = (tmp_path / "summary.md").read_text()
    assert "## FAVOR attention" not in summary
    assert "## Profile: causal FAVOR (favor_pallas) forward + backward, bfloat16" in summary
    assert "| `k` | 0.500 | 25.0% |" in summary
    assert "## Profile: causal FAVOR (favor_mosaic)" in summary
    assert "Not profiled: ValueError: no" in summary
