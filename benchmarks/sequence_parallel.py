"""Sequence-parallel FAVOR: time and memory per device, D devices against one (issue 15, part 2).

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m benchmarks.sequence_parallel \\
      [--lengths 65536 262144] [--repeats 2] [--time-up-to 65536] [--json PATH]

For each length T, mode (bidirectional, causal) and pass (the jitted forward, and the jitted
gradient for q, k and v of the sum of the outputs), on (1, T, 4, 64) float32 inputs with an
orthogonal projection shared by the heads (m = 128, the shapes of ``benchmarks.attention``):

* one device: ``favor_attention`` under ``jit`` on device 0;
* D devices: ``favor_attention(..., sequence_axis="seq")`` in ``jax.shard_map`` over a mesh of
  all devices, inputs split along T (T / D positions per device).

Memory is XLA's compiled memory analysis of one device's program (arguments + outputs +
temporaries); times are medians of interleaved repeats (``benchmarks.timing``), run only up to
``--time-up-to``. ``--modes``, ``--passes`` and ``--device-counts`` select programs, and
``--json`` merges their rows into the file, so that each program can run in a process of its
own (its buffers alone in memory; how ``benchmarks/results/sequence_parallel_cpu4.md`` measured
T = 256k on a 24 GB host):

  for dc in one all; do XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m \\
      benchmarks.sequence_parallel --lengths 262144 --time-up-to 262144 --repeats 3 \\
      --modes causal --passes forward_backward --device-counts $dc --json out.json; done

Reported, not asserted. The target is memory: each of D devices needs what one device needs at
T / D (``tests/rfjax/attention/test_sequence_parallel.py`` asserts it at T = 4096: the forward pass
and the gradient within 5%). Forced CPU devices share the host's cores, so the D-device time
measures the overhead of the split (collectives, the extra per-device state) rather than a speed-up;
on D accelerators the work per device is 1/D.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.attention import HEAD_DIM, HEADS, NUM_FEATURES, compile_with_memory
from benchmarks.timing import time_interleaved
from rfjax import features
from rfjax.attention import draw_projection, favor_attention

AXIS = "seq"
# causal_per_feature: causal with a map that keeps one key shift per feature (FAVOR#'s asymmetric
# DERF, fitted to N(0, I) inputs), the log-space prefix (``_sequence_parallel``'s
# ``sequence_parallel_feature_prefix``) rather than the per-key one.
MODES = ("bidirectional", "causal", "causal_per_feature")
PASSES = ("forward", "forward_backward")


def mode_options(mode: str) -> dict:
    """``favor_attention`` keywords of a mode."""
    if mode == "causal_per_feature":
        sample = jax.random.normal(jax.random.key(2), (2, 512, HEAD_DIM))
        fitted = features.get("derf_asymmetric")().fit(jax.random.key(3), *sample)
        return dict(causal=True, feature_map=fitted)
    return dict(causal=mode == "causal")


def attention_fn(options: dict, sequence_axis: str | None):
    def forward(q, k, v, projection):
        return favor_attention(q, k, v, projection, sequence_axis=sequence_axis, **options)

    return forward


def with_pass(forward, name: str):
    if name == "forward":
        return forward
    return jax.grad(lambda q, k, v, p: jnp.sum(forward(q, k, v, p)), argnums=(0, 1, 2))


def program_devices(compiled) -> set:
    """The devices a compiled program's outputs live on (the devices it runs on)."""
    return {
        device
        for sharding in jax.tree.leaves(compiled.output_shardings)
        for device in sharding.device_set
    }


def benchmark_length(
    length: int,
    repeats: int,
    timed: bool,
    modes: tuple[str, ...] = MODES,
    passes: tuple[str, ...] = PASSES,
    device_counts: tuple[str, ...] = ("one", "all"),
) -> list[dict]:
    """Memory (and, if ``timed``, time) of the selected programs at T = ``length``.

    ``device_counts`` selects one device, all devices or both: a process that times only one
    program holds only that program's buffers (at T = 256k, one gradient needs ~8 GiB).
    """
    devices = jax.device_count()
    mesh = jax.make_mesh((devices,), (AXIS,))
    split = P(None, AXIS)
    keys = jax.random.split(jax.random.key(length), 4)
    q, k, v = (jax.random.normal(key, (1, length, HEADS, HEAD_DIM)) for key in keys[:3])
    projection = draw_projection(keys[3], HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    one_args = (q, k, v, projection)
    replicated = jax.device_put(projection, NamedSharding(mesh, P()))
    split_args = (*(jax.device_put(x, NamedSharding(mesh, split)) for x in (q, k, v)), replicated)
    rows, functions = [], {}
    for mode in modes:
        options = mode_options(mode)
        sharded = jax.shard_map(
            attention_fn(options, AXIS),
            mesh=mesh,
            in_specs=(split, split, split, P()),
            out_specs=split,
        )
        for name in passes:
            for selector, count, forward, args in (
                ("one", 1, attention_fn(options, None), one_args),
                ("all", devices, sharded, split_args),
            ):
                if selector not in device_counts:
                    continue
                # Only the sharded program sees the mesh: under ``set_mesh`` the one-device
                # program would be replicated on every device of the mesh (D copies of the work).
                context = jax.set_mesh(mesh) if count > 1 else contextlib.nullcontext()
                with context:
                    compiled, memory = compile_with_memory(with_pass(forward, name), args)
                ran_on = len(program_devices(compiled))
                if ran_on != count:
                    raise RuntimeError(f"the {selector}-device program runs on {ran_on} devices")
                rows.append(
                    {
                        "length": length,
                        "mode": mode,
                        "pass": name,
                        "devices": count,
                        "program_devices": ran_on,
                        **memory,
                    }
                )
                rows[-1].update(median_s=None, min_s=None, repeats=0)
                if timed:
                    functions[str(len(rows) - 1)] = lambda c=compiled, a=args: c(*a)
    timings = time_interleaved(functions, repeats=repeats, warmup=1) if functions else {}
    for index, timing in timings.items():
        rows[int(index)].update(median_s=timing["median_s"], min_s=timing["min_s"], repeats=repeats)
    return rows


def seconds(row: dict | None) -> str:
    return "--" if row is None or row["median_s"] is None else f"{row['median_s']:.2f}"


def per_device_mb(row: dict) -> float:
    return (row["argument_bytes"] + row["output_bytes"] + row["temp_bytes"]) / 2**20


def same_program(row: dict, other: dict) -> bool:
    return all(row[f] == other[f] for f in ("length", "mode", "pass", "devices"))


def table(rows: list[dict]) -> str:
    """One line per (T, mode, pass); "--" where a program was not timed or not run."""
    lines = [
        "| T | mode | pass | 1 device: s | MiB | D devices: s | MiB per device | memory ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    programs = sorted({(row["length"], row["mode"], row["pass"]) for row in rows})
    for length, mode, name in programs:
        pair = [
            row for row in rows if (row["length"], row["mode"], row["pass"]) == (length, mode, name)
        ]
        one = next((row for row in pair if row["devices"] == 1), None)
        many = next((row for row in pair if row["devices"] > 1), None)
        mb = [f"{per_device_mb(row):.0f}" if row else "--" for row in (one, many)]
        ratio = f"{per_device_mb(many) / per_device_mb(one):.3f}" if one and many else "--"
        lines.append(
            f"| {length} | {mode} | {name} | {seconds(one)} | {mb[0]} | {seconds(many)} | "
            f"{mb[1]} | {ratio} |"
        )
    return "\n".join(lines)


def merged(path: str, rows: list[dict]) -> list[dict]:
    """The rows already in ``path`` (if any), with the same programs replaced by ``rows``."""
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        kept = [old for old in json.load(f)["rows"] if not any(same_program(old, r) for r in rows)]
    return kept + rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[65536, 262144])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--time-up-to", type=int, default=65536)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES))
    parser.add_argument(
        "--device-counts",
        nargs="+",
        choices=("one", "all"),
        default=["one", "all"],
        help="one device, all devices or both (one program per process keeps its memory alone)",
    )
    parser.add_argument(
        "--json",
        type=str,
        default=None,
        help="also write the results here, keeping rows of other programs already in the file",
    )
    args = parser.parse_args()
    devices = jax.device_count()
    if devices < 2:
        raise SystemExit(
            "sequence parallelism needs several devices: run with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=4 (CPU) or on D accelerators"
        )
    for length in args.lengths:
        if length % devices:
            raise SystemExit(f"--lengths: T = {length} must be a multiple of D = {devices}")
    print(
        f"jax {jax.__version__}, {devices} {jax.devices()[0].platform} devices on "
        f"{os.cpu_count()} CPUs, float32, B=1 N={HEADS} H={HEAD_DIM} m={NUM_FEATURES}, "
        f"repeats {args.repeats}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: list[dict] = []
    for length in args.lengths:
        rows += benchmark_length(
            length,
            args.repeats,
            length <= args.time_up_to,
            tuple(args.modes),
            tuple(args.passes),
            tuple(args.device_counts),
        )
        print(f"  T={length} done", file=sys.stderr, flush=True)
        if args.json:  # after each length: a later one may run out of time or memory
            all_rows = merged(args.json, rows)
            with open(args.json, "w") as f:
                json.dump({"devices": devices, "rows": all_rows}, f, indent=1)
    print(table(merged(args.json, rows) if args.json else rows))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
