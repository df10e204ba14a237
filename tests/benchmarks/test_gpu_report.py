"""The committed GPU runs' summaries are what ``benchmarks.gpu_report`` makes of their raw JSON."""

from __future__ import annotations

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
