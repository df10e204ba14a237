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
The total is ``HEADROOM`` times the suite's seconds: the moves cancel there. ``--update`` given
several runs' files takes each file's most seconds among them.

CPU seconds are not the same on every machine, nor on one machine from hour to hour: nearly the
same suite took 2,013, 2,371 and 2,610 CPU s in three CI runs (2026-11-29 and 30, the last two on
one machine), and budgets set in a fast run failed unchanged code in a slower one. So the budgets
carry the CPU seconds of a fixed reference workload (``REFERENCE_PROGRAM``: JAX compiling and
running small programs with the suite's compiler flags, in two processes at once as ``pytest -n 2``
runs them) measured where they were set, and the check measures it again and scales every budget
by how much slower the machine is now (never tighter than written: a faster one keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys

BUDGETS = pathlib.Path(__file__).resolve().parent / "cpu_budgets.json"
ROOT = BUDGETS.parents[1]
HEADROOM = 1.5
XDIST_MOVE_SECONDS = 10
# The reference workload: forward and backward of a scan over small layers, compiled afresh for
# each of SIZES shapes with conftest.py's compiler flags and no compilation cache (most of the
# suite's CPU seconds are XLA compiling). Each round runs it in two processes at once, as the
# suite runs under ``pytest -n 2`` on two cores; the rounds' median is the machine's figure
# (rounds of the same program on one idle machine spread by +-17%, 2026-11-30).
REFERENCE_PROGRAM = """
import jax, jax.numpy as jnp
jax.config.update("jax_enable_compilation_cache", False)
def step(carry, w):
    h = jnp.tanh(carry @ w)
    return h - jax.nn.logsumexp(h, axis=-1, keepdims=True), h.sum()
def loss(w, x):
    h, s = jax.lax.scan(step, x, w)
    return (h ** 2).mean() + s.mean()
for size in range(16, 16 + SIZES):
    w = jnp.ones((4, size, size)) / size
    x = jnp.ones((8, size))
    jax.jit(jax.value_and_grad(loss))(w, x)[0].block_until_ready()
"""
REFERENCE_SIZES = 8
REFERENCE_ROUNDS = 5
REFERENCE_PROCESSES = 2


def reference_seconds(rounds: int = REFERENCE_ROUNDS) -> float:
    """This machine's CPU seconds (user + system) for one process of the reference workload:
    the median over ``rounds`` rounds of ``REFERENCE_PROCESSES`` processes run at once."""
    if str(ROOT) not in sys.path:  # run as a script: tests/ is on the path, the root is not
        sys.path.insert(0, str(ROOT))
    from conftest import FAST_COMPILE_FLAGS  # the suite's compiler flags

    program = REFERENCE_PROGRAM.replace("SIZES", str(REFERENCE_SIZES))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["XLA_FLAGS"] = FAST_COMPILE_FLAGS
    seconds = []
    for _ in range(rounds):
        processes = [
            subprocess.Popen([sys.executable, "-c", program], env=env)
            for _ in range(REFERENCE_PROCESSES)
        ]
        for process in processes:
            _, status, usage = os.wait4(process.pid, 0)
            if status != 0:
                raise RuntimeError(f"the reference workload failed (wait status {status})")
            seconds.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(seconds)


def machine_factor(budgets: dict, reference: float | None) -> float:
    """How much every budget is scaled on this machine: its reference seconds over those of the
    machine the budgets were set on, at least 1 (1 where either figure is missing)."""
    written = budgets.get("reference_cpu_seconds")
    if reference is None or written is None:
        return 1.0
    return max(1.0, reference / written)


def over_budget(times: dict, budgets: dict, factor: float = 1.0) -> list[str]:
    """The files (and the total) whose CPU seconds exceed their budgets times ``factor`` (this
    machine's, ``machine_factor``), as messages."""
    default = budgets["default_file_seconds"]
    scaled = "" if factor == 1.0 else f" x {factor:.2f}"
    problems = [
        f"{path}: {entry['cpu_seconds']:.1f} CPU s > budget {budgets['files'].get(path, default)}"
        f"{scaled}{'' if path in budgets['files'] else ' (the default: the file has no budget)'}"
        for path, entry in times["files"].items()
        if entry["cpu_seconds"] > factor * budgets["files"].get(path, default)
    ]
    if times["total_cpu_seconds"] > factor * budgets["total_seconds"]:
        problems.append(
            f"the suite: {times['total_cpu_seconds']:.1f} CPU s > total budget "
            f"{budgets['total_seconds']}{scaled}"
        )
    return problems


def table(times: dict, budgets: dict, factor: float = 1.0, rows: int = 25) -> str:
    """The ``rows`` costliest files and the suite: CPU seconds beside budgets times ``factor``,
    and the XLA programs the tests' own processes compiled (or loaded from the cache) and the
    seconds that took."""
    default = budgets["default_file_seconds"]
    lines = [f"{'CPU s':>8} {'budget':>7} {'XLA s':>7} {'programs':>8} {'tests':>6}  file"]

    def row(entry: dict, budget: float, tests: int, name: str) -> str:
        return (
            f"{entry['cpu_seconds']:8.1f} {budget:7.1f} {entry['compile_seconds']:7.1f} "
            f"{entry['compiles']:8} {tests:6}  {name}"
        )

    for path, entry in list(times["files"].items())[:rows]:
        budget = factor * budgets["files"].get(path, default)
        lines.append(row(entry, budget, entry["tests"], path))
    total = {name.removeprefix("total_"): value for name, value in times.items() if name != "files"}
    tests = sum(entry["tests"] for entry in times["files"].values())
    budget = factor * budgets["total_seconds"]
    lines.append(row(total, budget, tests, f"all {len(times['files'])} files"))
    return "\n".join(lines)


def updated(runs: list[dict], budgets: dict, reference: float) -> dict:
    """Budgets from one or more runs' times (each file's most seconds among them), set on a
    machine whose reference seconds are ``reference``."""

    def budget(seconds: float, slack: float = 0.0) -> int:
        return 5 * math.ceil((HEADROOM * seconds + slack) / 5)

    paths = sorted({path for times in runs for path in times["files"]})
    most = {
        path: max(t["files"][path]["cpu_seconds"] for t in runs if path in t["files"])
        for path in paths
    }
    files = {path: budget(seconds, XDIST_MOVE_SECONDS) for path, seconds in most.items()}
    total = budget(max(times["total_cpu_seconds"] for times in runs))
    return {
        **budgets,
        "reference_cpu_seconds": round(reference, 2),
        "files": files,
        "total_seconds": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "times", type=pathlib.Path, nargs="+", help="the JSON of pytest --cpu-times (one to check)"
    )
    parser.add_argument("--budgets", type=pathlib.Path, default=BUDGETS)
    parser.add_argument("--update", action="store_true", help="write budgets from these runs")
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.times]
    budgets = json.loads(args.budgets.read_text())
    if args.update:
        reference = reference_seconds()
        args.budgets.write_text(json.dumps(updated(runs, budgets, reference), indent=1) + "\n")
        print(f"budgets written to {args.budgets} (reference workload {reference:.2f} CPU s)")
        return 0
    if len(runs) != 1:
        parser.error(f"the check reads one run's times, not {len(runs)} (--update reads several)")
    (times,) = runs
    reference = reference_seconds() if "reference_cpu_seconds" in budgets else None
    factor = machine_factor(budgets, reference)
    if reference is not None:
        print(
            f"this machine: the reference workload takes {reference:.2f} CPU s, "
            f"{budgets['reference_cpu_seconds']:.2f} where the budgets were set: "
            f"budgets x {factor:.2f}"
        )
    print(table(times, budgets, factor))
    problems = over_budget(times, budgets, factor)
    for problem in problems:
        print(f"over budget: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
