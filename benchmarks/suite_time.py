"""The default suite's time against an earlier commit's, alternated in one run (issue 45).

  python -m benchmarks.suite_time --against f41641b [--repeats 1] [--json PATH]

Issue 45 asks that the default suite's time does not grow (the README's test command,
``python -m pytest -q -n 2``). A time measured on another day is no peer: this machine's speed
drifts by more than the effect. Here the suites run in turn, repeat by repeat (each repeat
starting one contender later), with this checkout's Python and packages:

* ``peer``: the default suite of the commit ``--against``, in a git worktree of it (its C++
  extension built in place first when it has a ``setup.py``);
* ``this``: the default suite of this checkout;
* ``this_peer_tests``: this checkout's default suite restricted to the tests that the peer's
  default suite holds, matched by test name and parameters (the node id after the file, so a
  test moved to another file still matches): how the tests that were there fare on today's
  code, apart from the tests added since.

Every run starts with an empty persistent compilation cache (``$JAX_COMPILATION_CACHE_DIR``, which
``conftest.py`` honours), as a first run in a fresh clone does. The table gives each run's wall
seconds, its pytest summary and the load average before and after it, and the paired ratios
``this / peer`` and ``this_peer_tests / peer`` (``benchmarks.timing.paired_ratio``); the JSON
(``--json``; default ``benchmarks/results/suite_time/against_<rev>.json``) holds every run.

Loaded as a pytest plugin (``-p benchmarks.suite_time``) with ``$RFJAX_SUITE_TIME_TESTS`` naming
a file of node ids, it deselects every collected test whose name and parameters are not in it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND = ("-m", "pytest", "-q", "-n", "2")  # the README's test command, after the interpreter
DEFAULT_SUITE = "not slow and not statistical and not integration"
TESTS_ENV = "RFJAX_SUITE_TIME_TESTS"
CONTENDERS = ("peer", "this", "this_peer_tests")


def name_and_params(nodeid: str) -> str:
    """A node id without its file: ``test_x[param]`` of ``tests/a/test_b.py::test_x[param]``."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def split_by_names(nodeids: Iterable[str], names: set[str]) -> tuple[list[str], list[str]]:
    """The node ids whose test name is in ``names``, and the others."""
    kept: list[str] = []
    dropped: list[str] = []
    for nodeid in nodeids:
        (kept if name_and_params(nodeid) in names else dropped).append(nodeid)
    return kept, dropped


def pytest_collection_modifyitems(config, items) -> None:
    """As a plugin: keep the tests named in the file ``$RFJAX_SUITE_TIME_TESTS``."""
    path = os.environ.get(TESTS_ENV)
    if not path:
        return
    lines = pathlib.Path(path).read_text().splitlines()
    names = {name_and_params(line.strip()) for line in lines if "::" in line}
    kept = set(split_by_names([item.nodeid for item in items], names)[0])
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in kept])
    items[:] = [item for item in items if item.nodeid in kept]


def parse_summary(output: str) -> dict[str, float | int]:
    """The counts and seconds of pytest's last summary line (``2488 passed, 737 skipped, 25
    warnings in 373.59s (0:06:13)``); a count pytest left out is 0."""
    lines = [line for line in output.splitlines() if re.search(r" in [0-9.]+s", line)]
    if not lines:
        raise ValueError(f"no pytest summary line in the output: {output[-500:]!r}")
    line = lines[-1]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", line.split(" in ")[0])}
    counts["errors"] = counts.get("errors", counts.get("error", 0))  # "1 error", "2 errors"
    return {
        **{kind: counts.get(kind, 0) for kind in ("passed", "failed", "skipped", "errors")},
        "pytest_s": float(re.findall(r" in ([0-9.]+)s", line)[-1]),
    }


def rotated(names: Sequence[str], repeat: int) -> list[str]:
    """``names`` starting ``repeat`` places later, so no contender always runs first."""
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


def default_test_ids(root: pathlib.Path) -> list[str]:
    """The node ids of the default suite of the checkout at ``root`` (collected, not run)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", DEFAULT_SUITE],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def run_suite(root: pathlib.Path, env: dict[str, str], extra: Sequence[str] = ()) -> dict:
    """One run of the README's test command (with ``extra`` arguments) at ``root`` with an empty
    compilation cache; ``failures`` are the node ids of pytest's FAILED and ERROR lines."""
    from benchmarks.timing import load_average

    with tempfile.TemporaryDirectory(prefix="suite_time_cache_") as cache:
        load_before = load_average()
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *COMMAND, *extra],
            cwd=root,
            env={**env, "JAX_COMPILATION_CACHE_DIR": cache},
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        **parse_summary(done.stdout),
        "returncode": done.returncode,
        "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE),
        "load_before": load_before,
        "load_after": load_average(),
    }


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[pathlib.Path]:
    """A detached git worktree of ``rev`` with its C++ extension built in place; removed after."""
    with tempfile.TemporaryDirectory(prefix="suite_time_peer_") as parent:
        path = pathlib.Path(parent) / "peer"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True
        )
        try:
            if (path / "setup.py").exists():
                subprocess.run(
                    [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                    cwd=path,
                    check=True,
                    capture_output=True,
                )
            yield path
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=True
            )


def commit_of(rev: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def measure(rev: str, repeats: int) -> dict:
    """Every contender's runs, alternated, and the paired ratios against the peer."""
    from benchmarks.timing import paired_ratio

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RFJAX_TEST_", TESTS_ENV))}
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    with worktree(rev) as peer, tempfile.TemporaryDirectory() as scratch:
        ids = pathlib.Path(scratch) / "peer_tests.txt"
        ids.write_text("\n".join(default_test_ids(peer)) + "\n")
        # The plugin on the command line, not in $PYTEST_ADDOPTS: the tests that run pytest in
        # a child process (tests/project/test_cpu_budget.py) must not inherit it.
        setups = {
            "peer": (peer, env, ()),
            "this": (ROOT, env, ()),
            "this_peer_tests": (
                ROOT,
                {**env, TESTS_ENV: str(ids)},
                ("-p", "benchmarks.suite_time"),
            ),
        }
        for repeat in range(repeats):
            for name in rotated(CONTENDERS, repeat):
                runs[name].append(run_suite(*setups[name]))
                print(f"  {name:16s} {_row(runs[name][-1])}", flush=True)
    walls = {name: [run["wall_s"] for run in runs[name]] for name in CONTENDERS}
    return {
        "against": rev,
        "against_commit": commit_of(rev),
        "this_commit": commit_of("HEAD"),
        "this_tree_clean": not subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "command": ["python", *COMMAND],
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "repeats": repeats,
        "runs": runs,
        "ratios": {
            f"{name} / peer": paired_ratio(walls[name], walls["peer"])
            for name in ("this", "this_peer_tests")
        },
    }


def _row(run: dict) -> str:
    counts = f"{run['passed']} passed, {run['skipped']} skipped, {run['failed']} failed"
    load = f"load {run['load_before']} -> {run['load_after']}"
    return f"{run['wall_s']:7.1f} s  {counts} {run['failures']}  {load}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the peer commit (any git revision)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the three suites")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    result = measure(args.against, args.repeats)
    for name, ratio in result["ratios"].items():
        quartiles = f"{ratio['q25']:.3f}-{ratio['q75']:.3f}"
        print(f"{name}: median {ratio['median']:.3f} (quartiles {quartiles})")
    path = (
        args.json or ROOT / "benchmarks" / "results" / "suite_time" / f"against_{args.against}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
