"""FAVOR attention of this checkout against another commit's, interleaved in one process.

  python -m benchmarks.attention_ab --against f41641b [--lengths 1024 4096 16384]
      [--modes causal bidirectional] [--chunk-size N] [--pairs N] [--feature-map NAME]
      [--implementation NAME] [--runs K] [--json PATH]

Two runs of ``benchmarks/attention.py`` one after the other differ by this machine's drift
(several percent from one minute to the next on the 2-core development machine), which is the
size of the effects a change to the attention code has. Here both versions are compiled side by
side in one process and called in alternating order, so each pair of calls sees the same load:
the commit ``--against`` is extracted (``git archive`` of its ``rfjax/``) into a temporary
folder as a package named ``rfjax_base`` and imported beside ``rfjax``.

The setting is ``benchmarks/attention.py``'s: (1, T, 4, 64) float32 queries, keys and values,
an orthogonal projection of m = 128 features shared by the heads, forward and
``value_and_grad`` of the sum of the outputs (for q, k and v). Each version runs with its own
default chunk size unless ``--chunk-size`` sets both; ``--feature-map`` (a registered name,
drawn with ``init``) and ``--implementation`` set the map and the implementation of both (by
default each version's own defaults, so that commits from before these arguments run too).
Prints, per mode, pass and T, the median and quartiles of the per-pair time ratios (this
checkout / the other) and both programs' XLA temporaries, with the load; ``--json`` writes
every row. ``--pairs 0`` compiles without timing: the temporaries alone (for the fused kernels
in interpret mode on a CPU, whose times say nothing of a GPU's).

One run's quartiles are not an interval for its median, and the median itself moves by a few
percent from one process to the next (2026-12-01: 1.06, 1.06, 1.02, 1.00 and 1.00 in five runs
of one row), so one run cannot resolve an effect of that size. ``--runs K`` (K >= 2) runs the
same command K times, each in a fresh process, and takes each run's median ratio as one unit:
per row and pooled over the rows (each run's mean log ratio), the effect ln(this / other)
(``experiments.core.stats.sample_estimate``, t interval over the runs) is judged by
``experiments.core.verdicts`` against ``NOT_SLOWER_CLAIM``, declared here before the runs it
judges. ``--json`` then holds every run's record, the rows' and the pooled verdicts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

import rfjax.attention
from benchmarks.attention import HEAD_DIM, HEADS, NUM_FEATURES
from benchmarks.timing import quartiles
from experiments.core.outputs import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSES = ("forward", "forward_backward")
# Declared 2026-12-01, before the runs it judges. The margin is the suite-time claim's
# (``benchmarks.suite_time.SUITE_CLAIM``): a row is worse when it is slower by more than 2%.
NOT_SLOWER_CLAIM: dict[str, Any] = {
    "statement": "Issue 42's CPU row: no FAVOR attention time of this checkout is worse than "
    "the other commit's (benchmarks/attention.py's setting, interleaved pairs, one run per "
    "process)",
    "test": "nonsuperior",
    "margin": math.log(1.02),
}
# Runs for 80% power at the margin when the true effect is 0: ((1.96 + 0.84) sd / margin)^2
# with sd = 0.03, the spread of one run's median log ratio in the five runs above.
RUNS_FOR_POWER = 20


def import_other(revision: str, folder: str) -> Any:
    """``rfjax.attention`` of ``revision``, imported as ``rfjax_base.attention`` from ``folder``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "rfjax"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    path = os.path.join(folder, "archive.tar")
    with open(path, "wb") as file:
        file.write(archive)
    with tarfile.open(path) as tar:
        tar.extractall(folder, filter="data")
    package = os.path.join(folder, "rfjax_base")
    os.rename(os.path.join(folder, "rfjax"), package)
    for directory, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                source_path = os.path.join(directory, name)
                with open(source_path) as file:
                    source = file.read()
                with open(source_path, "w") as file:
                    file.write(re.sub(r"\brfjax\b", "rfjax_base", source))
    sys.path.insert(0, folder)
    return importlib.import_module("rfjax_base.attention")


def compiled_pass(module: Any, pass_name: str, causal: bool, options: dict[str, Any], args):
    """The jitted forward or forward + backward of ``module.favor_attention`` with ``options``
    (its keyword arguments but ``causal``), compiled."""
    options = {"causal": causal, **options}

    def forward(q, k, v, projection):
        return module.favor_attention(q, k, v, projection, **options)

    if pass_name == "forward_backward":
        function = jax.value_and_grad(lambda *a: jnp.sum(forward(*a)), argnums=(0, 1, 2))
    else:
        function = forward
    return jax.jit(function).lower(*args).compile()


def paired_ratios(calls, pairs: int) -> list[float]:
    """``pairs`` time ratios calls[0] / calls[1], the order alternating from pair to pair (none,
    and no call, for ``pairs`` 0)."""
    if not pairs:
        return []
    for compiled, arguments in calls:
        jax.block_until_ready(compiled(*arguments))  # warm
    ratios = []
    for i in range(pairs):
        seconds = {}
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            compiled, arguments = calls[which]
            start = time.perf_counter()
            jax.block_until_ready(compiled(*arguments))
            seconds[which] = time.perf_counter() - start
        ratios.append(seconds[0] / seconds[1])
    return ratios


def median_and_quartiles(ratios: list[float]) -> tuple[float | None, ...]:
    """(median, first quartile, third quartile) of ``ratios``; ``None`` for none (no timing)."""
    if not ratios:
        return None, None, None
    return statistics.median(ratios), *quartiles(ratios)


def version_options(module: Any, setting: argparse.Namespace) -> dict[str, Any]:
    """``favor_attention``'s keyword arguments for one version (``module``: its ``attention``)
    from the command line's ``setting``: the feature map drawn by that version's registry."""
    options: dict[str, Any] = {}
    if setting.feature_map is not None:
        registry = importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".features")
        fmap = registry.get(setting.feature_map)()
        options["feature_map"] = fmap.init(jax.random.key(1), HEAD_DIM)
    if setting.implementation is not None:
        options["implementation"] = setting.implementation
    if setting.chunk_size is not None:
        options["chunk_size"] = setting.chunk_size
    return options


def measure(other: Any, mode: str, length: int, setting: argparse.Namespace) -> list[dict]:
    pairs = default_pairs(length) if setting.pairs is None else setting.pairs
    keys = jax.random.split(jax.random.key(length), 4)
    q, k, v = (jax.random.normal(key, (1, length, HEADS, HEAD_DIM)) for key in keys[:3])
    modules = (rfjax.attention, other)
    options = [version_options(module, setting) for module in modules]
    arguments = [
        (q, k, v, module.draw_projection(keys[3], HEAD_DIM, NUM_FEATURES, coupling="orthogonal"))
        for module in modules
    ]
    rows = []
    for pass_name in PASSES:
        calls = [
            (compiled_pass(module, pass_name, mode == "causal", option, args), args)
            for module, option, args in zip(modules, options, arguments, strict=True)
        ]
        median, q1, q3 = median_and_quartiles(paired_ratios(calls, pairs))
        rows.append(
            dict(
                mode=mode,
                length=length,
                pass_name=pass_name,
                ratio_median=median,
                ratio_q1=q1,
                ratio_q3=q3,
                pairs=pairs,
                feature_map=setting.feature_map,
                implementation=setting.implementation,
                temp_this_MiB=calls[0][0].memory_analysis().temp_size_in_bytes / 2**20,
                temp_other_MiB=calls[1][0].memory_analysis().temp_size_in_bytes / 2**20,
                load=os.getloadavg(),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def default_pairs(length: int) -> int:
    """The default number of pairs: 101 up to T = 4,096, proportionally fewer above, at least 7."""
    return max(7, 101 * 4096 // max(length, 4096))


def run_arguments(setting: argparse.Namespace) -> list[str]:
    """The command line of one run with ``setting``'s rows, map, implementation and pairs."""
    arguments = ["--against", setting.against, "--lengths", *map(str, setting.lengths)]
    arguments += ["--modes", *setting.modes]
    for flag, value in (
        ("--chunk-size", setting.chunk_size),
        ("--pairs", setting.pairs),
        ("--feature-map", setting.feature_map),
        ("--implementation", setting.implementation),
    ):
        if value is not None:
            arguments += [flag, str(value)]
    return arguments


def repeated_runs(setting: argparse.Namespace, folder: str) -> list[dict]:
    """``setting.runs`` records of this benchmark, each from a fresh process, one after the
    other."""
    records = []
    for run in range(setting.runs):
        path = os.path.join(folder, f"run_{run}.json")
        command = [sys.executable, "-m", "benchmarks.attention_ab", *run_arguments(setting)]
        subprocess.run([*command, "--json", path], cwd=ROOT, check=True)
        with open(path) as file:
            records.append(json.load(file))
    return records


def judged_runs(records: list[dict]) -> dict[str, Any]:
    """``NOT_SLOWER_CLAIM`` judged per row and pooled over the rows, each run's median ratio a
    unit: ``{"rows": [...], "pooled": {...}}``, each with the estimate of ln(this / other)
    over the runs, its ratio and interval, and the verdict."""
    import ml_collections
    import numpy as np

    from configs.common import claim
    from experiments.core.stats import sample_estimate
    from experiments.core.verdicts import Verdicts

    cells = [(r["mode"], r["length"], r["pass_name"]) for r in records[0]["rows"]]
    logs = np.array(
        [[math.log(r["ratio_median"]) for r in record["rows"]] for record in records]
    )  # (runs, rows)

    def judged(samples) -> dict[str, Any]:
        estimate = sample_estimate(samples)
        verdicts = Verdicts(
            ml_collections.ConfigDict({"claims": {"not_slower": claim(**NOT_SLOWER_CLAIM)}})
        )
        verdict = verdicts.effect(
            "not_slower", estimate, effect="ln(this / other)", units="runs", number=".3f"
        )
        low, high = estimate.interval(verdicts.claims["not_slower"].level)
        return {
            "ratio": math.exp(estimate.mean),
            "ratio_low": math.exp(low),
            "ratio_high": math.exp(high),
            "estimate": estimate.as_dict(),
            "verdict": verdict.as_dict(),
        }

    rows = [
        {"mode": mode, "length": length, "pass_name": pass_name, **judged(logs[:, i])}
        for i, (mode, length, pass_name) in enumerate(cells)
    ]
    return {"rows": rows, "pooled": judged(logs.mean(axis=1))}


def _judged_line(name: str, judged: dict[str, Any]) -> str:
    outcome = judged["verdict"]["outcome"]
    interval = f"[{judged['ratio_low']:.3f}, {judged['ratio_high']:.3f}]"
    return f"{name:36s} {judged['ratio']:.3f} {interval}  {outcome}"


def main_runs(setting: argparse.Namespace, this: str) -> None:
    """``--runs K``: K runs in fresh processes, judged per row and pooled."""
    with tempfile.TemporaryDirectory() as folder:
        records = repeated_runs(setting, folder)
    measured = {(record["this"], record["against"]) for record in records}
    if measured != {(this, setting.against)}:  # e.g. a commit made while the runs went on
        raise RuntimeError(
            f"the runs measured {sorted(measured)}, not this checkout ({this}) against "
            f"{setting.against}: runs of different code are not pooled"
        )
    result = judged_runs(records)
    for row in result["rows"]:
        print(_judged_line(f"{row['mode']} T={row['length']} {row['pass_name']}", row))
    print(_judged_line("pooled over the rows", result["pooled"]))
    print(result["pooled"]["verdict"]["evidence"])
    if setting.json:
        record = dict(
            this=this, against=setting.against, jax=jax.__version__, claim=NOT_SLOWER_CLAIM,
            runs=records, **result,
        )  # fmt: skip
        write_json(setting.json, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the other commit")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--modes", nargs="+", choices=("causal", "bidirectional"),
                        default=["causal", "bidirectional"])  # fmt: skip
    parser.add_argument("--chunk-size", type=int, default=None, help="both; default: each own")
    parser.add_argument("--pairs", type=int, default=None,
                        help="pairs per row (default 101 at T <= 4,096, fewer above; "
                        "0: no timing)")  # fmt: skip
    parser.add_argument("--feature-map", default=None, help="a registered map's name")
    parser.add_argument("--implementation", default=None, help="favor_attention's")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs, each in a fresh process; from 2 on, judged against "
                        f"NOT_SLOWER_CLAIM (sized for power: {RUNS_FOR_POWER})")  # fmt: skip
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if args.runs > 1 and args.pairs == 0:
        parser.error("--runs above 1 judges timed runs: --pairs 0 times nothing")
    this = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()  # "-dirty": the checkout differs from the commit it names
    if args.runs > 1:
        main_runs(args, this)
        return
    with tempfile.TemporaryDirectory() as folder:
        other = import_other(args.against, folder)
        rows = [
            row
            for mode in args.modes
            for length in args.lengths
            for row in measure(other, mode, length, args)
        ]
    if args.json:
        write_json(args.json, dict(this=this, against=args.against, jax=jax.__version__, rows=rows))


if __name__ == "__main__":
    main()
