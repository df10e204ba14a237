"""The suite's test-time budget: CPU seconds per test file, checked against
``tests/cpu_budgets.json``.

  python -m pytest -n 2 --runstatistical --runintegration --cpu-times=.test-cpu-times.json
  python tests/cpu_budget.py .test-cpu-times.json            # checks; exit 1 over budget
  python tests/cpu_budget.py .test-cpu-times.json --update   # budgets from a run

A file's CPU seconds (user + system of the processes that ran its tests, their child processes
included) measure the work its tests cost, not how busy the machine was, so a budget holds on a
loaded CI machine as on an idle one. A file over its budget (or over the default budget, if it
has none), or a suite over the total budget, fails the check: speed a test up, move what need
not run in CI behind ``slow`` (``--runslow``), or raise the budget in the
same commit with the reason. ``--update`` writes every measured file's budget as
``HEADROOM`` times its seconds plus ``XDIST_MOVE_SECONDS`` (rounded up to 5 s): under
pytest-xdist a program that two files compile alike is compiled by whichever file's test runs
first on a worker, which moves a few seconds between files from run to run whatever their size
(a 14.4 s file measured 20.5 s in the next run), so the slack is additive as well as relative.
The total is ``HEADROOM`` times the suite's seconds: the moves cancel there.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

BUDGETS = pathlib.Path(__file__).resolve().parent / "cpu_budgets.json"
HEADROOM = 1.5
XDIST_MOVE_SECONDS = 10


def over_budget(times: dict, budgets: dict) -> list[str]:
    """The files (and the total) whose CPU seconds exceed their budgets, as messages."""
    default = budgets["default_file_seconds"]
    problems = [
        f"{path}: {entry['cpu_seconds']:.1f} CPU s > budget {budgets['files'].get(path, default)}"
        f"{'' if path in budgets['files'] else ' (the default: the file has no budget)'}"
        for path, entry in times["files"].items()
        if entry["cpu_seconds"] > budgets["files"].get(path, default)
    ]
    if times["total_cpu_seconds"] > budgets["total_seconds"]:
        problems.append(
            f"the suite: {times['total_cpu_seconds']:.1f} CPU s > total budget "
            f"{budgets['total_seconds']}"
        )
    return problems


def table(times: dict, budgets: dict, rows: int = 25) -> str:
    default = budgets["default_file_seconds"]
    lines = [f"{'CPU s':>8} {'budget':>7} {'tests':>6}  file"]
    for path, entry in list(times["files"].items())[:rows]:
        budget = budgets["files"].get(path, default)
        lines.append(f"{entry['cpu_seconds']:8.1f} {budget:7} {entry['tests']:6}  {path}")
    lines.append(
        f"{times['total_cpu_seconds']:8.1f} {budgets['total_seconds']:7} "
        f"{sum(e['tests'] for e in times['files'].values()):6}  all {len(times['files'])} files"
    )
    return "\n".join(lines)


def updated(times: dict, budgets: dict) -> dict:
    def budget(seconds: float, slack: float = 0.0) -> int:
        return 5 * math.ceil((HEADROOM * seconds + slack) / 5)

    files = {
        path: budget(entry["cpu_seconds"], XDIST_MOVE_SECONDS)
        for path, entry in sorted(times["files"].items())
    }
    return {**budgets, "files": files, "total_seconds": budget(times["total_cpu_seconds"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", type=pathlib.Path, help="the JSON of pytest --cpu-times")
    parser.add_argument("--budgets", type=pathlib.Path, default=BUDGETS)
    parser.add_argument("--update", action="store_true", help="write budgets from this run")
    args = parser.parse_args(argv)
    times = json.loads(args.times.read_text())
    budgets = json.loads(args.budgets.read_text())
    if args.update:
        args.budgets.write_text(json.dumps(updated(times, budgets), indent=1) + "\n")
        print(f"budgets written to {args.budgets}")
        return 0
    print(table(times, budgets))
    problems = over_budget(times, budgets)
    for problem in problems:
        print(f"over budget: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
