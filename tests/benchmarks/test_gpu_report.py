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
