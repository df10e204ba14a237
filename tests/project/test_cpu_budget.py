"""The test-time budget check (tests/cpu_budget.py) and the ``--cpu-times`` report it reads."""

import json
import subprocess
import sys

from tests import cpu_budget
from tests.support import ROOT

BUDGETS = {"default_file_seconds": 10, "total_seconds": 30, "files": {"tests/test_a.py": 20}}


def _times(**seconds):
    files = {f"tests/{name}.py": {"cpu_seconds": s, "tests": 1} for name, s in seconds.items()}
    return {"total_cpu_seconds": sum(seconds.values()), "files": files}


def test_files_and_total_over_their_budgets_are_reported():
    assert cpu_budget.over_budget(_times(test_a=19.0, test_b=9.0), BUDGETS) == []
    problems = cpu_budget.over_budget(_times(test_a=21.0, test_b=11.0), BUDGETS)
    assert problems[0] == "tests/test_a.py: 21.0 CPU s > budget 20"
    assert problems[1].startswith("tests/test_b.py: 11.0 CPU s > budget 10 (the default")
    assert problems[2] == "the suite: 32.0 CPU s > total budget 30"


def test_update_sets_each_budget_to_the_headroom_times_the_seconds_plus_the_xdist_slack():
    budgets = cpu_budget.updated(_times(test_a=10.0, test_b=1.0, test_c=7.0), BUDGETS)
    # 1.5 x 10 + 10 = 25; 1.5 x 1 + 10 = 11.5 -> 15; 1.5 x 7 + 10 = 20.5 -> 25 (up to 5 s)
    assert budgets["files"] == {"tests/test_a.py": 25, "tests/test_b.py": 15, "tests/test_c.py": 25}
    assert budgets["total_seconds"] == 30 and budgets["default_file_seconds"] == 10


def test_cpu_times_option_writes_each_files_seconds(tmp_path):
    """pytest --cpu-times on a two-test file: the file's tests and a positive CPU time."""
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text(encoding="utf-8"))
    (tmp_path / "test_toy.py").write_text(
        "def test_spin():\n    sum(i * i for i in range(200_000))\n\n"
        "def test_nothing():\n    pass\n"
    )
    out = tmp_path / "times.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--cpu-times={out}"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    times = json.loads(out.read_text())
    (path,) = times["files"]
    assert path == "test_toy.py" and times["files"][path]["tests"] == 2
    assert 0 < times["files"][path]["cpu_seconds"] == times["total_cpu_seconds"]
    budgets = tmp_path / "budgets.json"
    budgets.write_text(json.dumps(BUDGETS))
    check = [sys.executable, str(cpu_budget.__file__), str(out), f"--budgets={budgets}"]
    assert subprocess.run(check, capture_output=True).returncode == 0
