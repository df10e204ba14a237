"""The test-time budget check (tests/cpu_budget.py) and the ``--cpu-times`` report it reads."""

import json
import subprocess
import sys

import pytest

from tests import cpu_budget
from tests.support import ROOT

BUDGETS = {"default_file_seconds": 10, "total_seconds": 30, "files": {"tests/test_a.py": 20}}


def _times(**seconds):
    """A --cpu-times report whose files spend half their CPU seconds compiling two programs."""
    files = {
        f"tests/{name}.py": {"cpu_seconds": s, "compile_seconds": s / 2, "compiles": 2, "tests": 1}
        for name, s in seconds.items()
    }
    totals = {
        f"total_{field}": sum(entry[field] for entry in files.values())
        for field in ("cpu_seconds", "compile_seconds", "compiles")
    }
    return {**totals, "files": files}


def test_files_and_total_over_their_budgets_are_reported():
    assert cpu_budget.over_budget(_times(test_a=19.0, test_b=9.0), BUDGETS) == []
    problems = cpu_budget.over_budget(_times(test_a=21.0, test_b=11.0), BUDGETS)
    assert problems[0] == "tests/test_a.py: 21.0 CPU s > budget 20"
    assert problems[1].startswith("tests/test_b.py: 11.0 CPU s > budget 10 (the default")
    assert problems[2] == "the suite: 32.0 CPU s > total budget 30"


def test_update_sets_each_budget_to_the_headroom_times_the_seconds_plus_the_xdist_slack():
    budgets = cpu_budget.updated([_times(test_a=10.0, test_b=1.0, test_c=7.0)], BUDGETS, 4.567)
    # 1.5 x 10 + 10 = 25; 1.5 x 1 + 10 = 11.5 -> 15; 1.5 x 7 + 10 = 20.5 -> 25 (up to 5 s)
    assert budgets["files"] == {"tests/test_a.py": 25, "tests/test_b.py": 15, "tests/test_c.py": 25}
    assert budgets["total_seconds"] == 30 and budgets["default_file_seconds"] == 10
    assert budgets["reference_cpu_seconds"] == 4.57


def test_update_from_several_runs_takes_each_files_most_seconds():
    runs = [_times(test_a=10.0, test_b=1.0), _times(test_a=4.0, test_b=7.0, test_c=2.0)]
    budgets = cpu_budget.updated(runs, BUDGETS, 1.0)
    assert budgets["files"] == {"tests/test_a.py": 25, "tests/test_b.py": 25, "tests/test_c.py": 15}
    assert budgets["total_seconds"] == 20  # 1.5 x 13 (the second run's total) = 19.5 -> 20


def test_budgets_scale_by_how_much_slower_this_machine_is_and_never_tighten():
    written = {**BUDGETS, "reference_cpu_seconds": 5.0}
    assert cpu_budget.machine_factor(written, 6.0) == pytest.approx(1.2)
    assert cpu_budget.machine_factor(written, 4.0) == 1.0  # a faster machine: as written
    assert cpu_budget.machine_factor(BUDGETS, 6.0) == 1.0  # budgets set without a reference
    times = _times(test_a=23.0, test_b=11.5)  # over 20 and 10, within 24 and 12
    assert len(cpu_budget.over_budget(times, written)) == 3
    assert cpu_budget.over_budget(times, written, factor=1.2) == []
    problems = cpu_budget.over_budget(_times(test_a=24.5), written, factor=1.2)
    assert problems == ["tests/test_a.py: 24.5 CPU s > budget 20 x 1.20"]


def test_the_check_scales_by_the_reference_workload_it_measures(tmp_path, monkeypatch, capsys):
    times, budgets = tmp_path / "times.json", tmp_path / "budgets.json"
    times.write_text(json.dumps(_times(test_a=23.0)))
    budgets.write_text(json.dumps({**BUDGETS, "reference_cpu_seconds": 5.0}))
    args = [str(times), f"--budgets={budgets}"]
    monkeypatch.setattr(cpu_budget, "reference_seconds", lambda: 6.0)
    assert cpu_budget.main(args) == 0
    assert "budgets x 1.20" in capsys.readouterr().out
    monkeypatch.setattr(cpu_budget, "reference_seconds", lambda: 5.5)
    assert cpu_budget.main(args) == 1
    assert "test_a.py: 23.0 CPU s > budget 20 x 1.10" in capsys.readouterr().err


@pytest.mark.integration
def test_the_reference_workload_runs_in_two_processes_and_reports_their_cpu_seconds():
    seconds = cpu_budget.reference_seconds(rounds=1)
    assert 0.5 < seconds < 120  # JAX imported and 8 programs compiled: seconds, not zero


def test_cpu_times_option_writes_each_files_seconds_and_compiles(tmp_path):
    """pytest --cpu-times on two files: each file's tests and positive CPU seconds, and the XLA
    programs of the file whose test compiles one (none in the other's)."""
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text(encoding="utf-8"))
    (tmp_path / "test_toy.py").write_text(
        "def test_spin():\n    sum(i * i for i in range(200_000))\n\n"
        "def test_nothing():\n    pass\n"
    )
    (tmp_path / "test_jit.py").write_text(
        "import jax, numpy as np\n\n"
        "def test_one_program():\n    jax.jit(lambda x: x + 1)(np.ones(3)).block_until_ready()\n"
    )
    out = tmp_path / "times.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--cpu-times={out}"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    times = json.loads(out.read_text())
    toy, jit = times["files"]["test_toy.py"], times["files"]["test_jit.py"]
    assert (toy["tests"], toy["compiles"], toy["compile_seconds"]) == (2, 0, 0)
    assert jit["tests"] == 1 and jit["compiles"] == 1
    assert 0 < jit["compile_seconds"] < jit["cpu_seconds"]
    for field in ("cpu_seconds", "compile_seconds", "compiles"):
        assert times[f"total_{field}"] == pytest.approx(toy[field] + jit[field])
    budgets = tmp_path / "budgets.json"
    budgets.write_text(json.dumps(BUDGETS))
    check = [sys.executable, str(cpu_budget.__file__), str(out), f"--budgets={budgets}"]
    result = subprocess.run(check, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["CPU", "s", "budget", "XLA", "s", "programs", "tests", "file"]
    (jit_row,) = [row for row in rows if row.endswith("test_jit.py")]
    assert jit_row.split()[3:5] == ["1", "1"]  # one program, one test
