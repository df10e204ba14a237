"""FAVOR vs exact softmax attention: time and peak memory over sequence length (issue: speed).

  python -m benchmarks.attention [--lengths 256 ... 16384] [--batch 1] [--repeats 10]
      [--chunk-sizes 64 128 256] [--torch-python /work/torchvenv/bin/python] [--json PATH]

For each length T and mode (bidirectional, causal), on (B, T, 4, 64) float32 inputs: the jitted
forward and the jitted ``value_and_grad`` (of the sum of the outputs, for q, k and v) of
``favor_attention`` (orthogonal projection shared by the heads, m = 128) and of exact
``jax.nn.dot_product_attention`` (``is_causal`` for causal). Times are medians over interleaved
repeats (fewer at long lengths; FAVOR and exact in separate interleaved groups); peak memory is
XLA's compiled memory analysis (temporaries; arguments and outputs are the same for both). Exact
attention is compiled but not run where its temporaries would exceed ``--exact-limit-gb`` (the T
x T scores).

Causal FAVOR is timed at every chunk size of ``--chunk-sizes``; the one with the smallest
geometric mean time (forward and forward + backward, all lengths) is the configuration reported.

Targets: the crossover length (first T where FAVOR's forward beats exact), linear growth (FAVOR
time at 16,384 / at 4,096 <= 5), and, with ``--torch-python`` (an interpreter with CPU torch and
performer-pytorch, running ``benchmarks/peers/performer_torch.py``), rfjax / performer-pytorch
time <= 1.0 per mode, length and pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.timing import save_json, time_interleaved
from rfjax.attention import draw_projection, favor_attention

HEADS = 4
HEAD_DIM = 64
NUM_FEATURES = 128
MODES = ("bidirectional", "causal")
PASSES = ("forward", "forward_backward")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "performer_torch.py")


def favor_fn(causal: bool, chunk_size: int):
    def forward(q, k, v, projection):
        return favor_attention(q, k, v, projection, causal=causal, chunk_size=chunk_size)

    return forward


def exact_fn(causal: bool):
    def forward(q, k, v, projection):
        del projection
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    return forward


def with_grad(forward):
    return jax.value_and_grad(lambda q, k, v, p: jnp.sum(forward(q, k, v, p)), argnums=(0, 1, 2))


def compile_with_memory(fn, args) -> tuple[object, dict[str, int]]:
    compiled = jax.jit(fn).lower(*args).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError("XLA gave no memory analysis")
    memory = {
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
    }
    return compiled, memory


def repeats_for(length: int, repeats: int) -> int:
    """All ``repeats`` up to T = 1,024, then fewer (at least 5) as T grows."""
    return max(5, min(repeats, repeats * 1024 // length))


def benchmark_length(
    length: int,
    batch: int,
    chunk_sizes: tuple[int, ...],
    repeats: int,
    exact_limit_bytes: float,
) -> list[dict]:
    keys = jax.random.split(jax.random.key(length), 4)
    q, k, v = (jax.random.normal(key, (batch, length, HEADS, HEAD_DIM)) for key in keys[:3])
    projection = draw_projection(keys[3], HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    args = (q, k, v, projection)

    variants: list[tuple[str, str, int | None, Any]] = []  # (method, mode, chunk_size, forward)
    for mode in MODES:
        causal = mode == "causal"
        variants.append(("exact", mode, None, exact_fn(causal)))
        for chunk_size in chunk_sizes if causal else (None,):
            variants.append(("favor", mode, chunk_size, favor_fn(causal, chunk_size or 128)))

    rows: list[dict] = []
    functions: dict[int, Any] = {}
    for method, mode, chunk_size, forward in variants:
        for name, fn in (("forward", forward), ("forward_backward", with_grad(forward))):
            compiled, memory = compile_with_memory(fn, args)
            row = {
                "length": length,
                "mode": mode,
                "method": method,
                "chunk_size": chunk_size,
                "pass": name,
                **memory,
                "median_s": None,
                "skipped": None,
            }
            if method == "exact" and memory["temp_bytes"] > exact_limit_bytes:
                row["skipped"] = (
                    f"not run: temporaries {memory['temp_bytes'] / 1e9:.1f} GB > "
                    f"{exact_limit_bytes / 1e9:.0f} GB"
                )
            else:
                functions[len(rows)] = lambda compiled=compiled: compiled(*args)
            rows.append(row)
    count = repeats_for(length, repeats)
    timings: dict[str, Any] = {}
    # One interleaved group per method: a call right after exact attention's backward (GBs of
    # temporaries just freed) pays for page faults and cold caches, which would be charged to
    # whichever FAVOR variant came next in a shared round.
    for method in ("favor", "exact"):
        group = {str(i): fn for i, fn in functions.items() if rows[i]["method"] == method}
        timings |= time_interleaved(group, repeats=count, warmup=1 if length >= 4096 else 3)
    for index in functions:
        timing = timings[str(index)]
        rows[index].update(
            median_s=timing["median_s"],
            min_s=timing["min_s"],
            iqr_s=timing["q75_s"] - timing["q25_s"],
            repeats=count,
        )
    return rows


def best_chunk_size(rows: list[dict], chunk_sizes: tuple[int, ...]) -> int:
    """Chunk size with the smallest geometric mean causal FAVOR time over lengths and passes."""

    def score(chunk_size: int) -> float:
        times = [
            row["median_s"]
            for row in rows
            if row["method"] == "favor" and row["mode"] == "causal"
            if row["chunk_size"] == chunk_size
        ]
        return sum(map(math.log, times)) / len(times)

    return min(chunk_sizes, key=score)


def run_peer(torch_python: str, lengths: list[int], batch: int, repeats: int) -> dict:
    command = [torch_python, "-W", "ignore", PEER, "--lengths", *map(str, lengths)]
    # As many threads as XLA's CPU client uses (every core; 2 was right on the 2-core machine
    # only).
    threads = str(os.cpu_count() or 1)
    command += ["--batch", str(batch), "--repeats", str(max(3, repeats // 2)), "--threads", threads]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def lookup(rows, **fields) -> Any:
    for row in rows:
        if all(row.get(name) == value for name, value in fields.items()):
            return row
    return None


def fmt_ms(seconds: float | None) -> str:
    return "--" if seconds is None else f"{1e3 * seconds:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384]
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--exact-limit-gb", type=float, default=8.0)
    parser.add_argument("--torch-python", type=str, default=None, help="runs the torch peer")
    parser.add_argument("--json", type=str, default=None, help="also write the results here")
    args = parser.parse_args()
    chunk_sizes = tuple(args.chunk_sizes)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} CPUs), float32, "
        f"B={args.batch} N={HEADS} H={HEAD_DIM} m={NUM_FEATURES}, orthogonal projection; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    for length in args.lengths:
        rows += benchmark_length(
            length, args.batch, chunk_sizes, args.repeats, 1e9 * args.exact_limit_gb
        )
        print(f"  T={length} done", file=sys.stderr, flush=True)
    chunk = best_chunk_size(rows, chunk_sizes)

    peer = None
    if args.torch_python:
        peer = run_peer(args.torch_python, args.lengths, args.batch, args.repeats)
        for row in peer["rows"]:
            row["method"] = "performer_pytorch"

    print("\ncausal FAVOR chunk sizes (median ms, forward / forward+backward):")
    print(f"{'T':>6} " + " ".join(f"{'C=' + str(c):>17}" for c in chunk_sizes))
    for length in args.lengths:
        cells = []
        for c in chunk_sizes:
            f, g = (
                lookup(
                    rows, length=length, mode="causal", method="favor", chunk_size=c, **{"pass": p}
                )
                for p in PASSES
            )
            cells.append(f"{fmt_ms(f['median_s'])} / {fmt_ms(g['median_s'])}")
        print(f"{length:>6} " + " ".join(f"{cell:>17}" for cell in cells))
    print(f"configuration used: chunk_size={chunk} (smallest geometric mean time)")

    def favor(length, mode, name):
        return lookup(
            rows,
            length=length,
            mode=mode,
            method="favor",
            chunk_size=chunk if mode == "causal" else None,
            **{"pass": name},
        )

    def exact(length, mode, name):
        return lookup(rows, length=length, mode=mode, method="exact", **{"pass": name})

    def torch_row(length, mode, name):
        return peer and lookup(peer["rows"], length=length, mode=mode, **{"pass": name})

    header = (
        f"{'mode':>13} {'T':>6} {'pass':>8} {'FAVOR ms':>9} {'exact ms':>9} {'F/exact':>8} "
        f"{'FAVOR MB':>9} {'exact MB':>9} {'torch ms':>9} {'F/torch':>8}"
    )
    print("\n" + header)
    summary: dict[str, Any] = {
        "chunk_size": chunk,
        "crossover": {},
        "growth_16384_4096": {},
        "peer_ratio": {},
    }
    for mode in MODES:
        for length in args.lengths:
            for name in PASSES:
                f, e, t = favor(length, mode, name), exact(length, mode, name), None
                t = torch_row(length, mode, name)
                e_time = e["median_s"]
                t_time = t["median_s"] if t else None
                ratio = f"{f['median_s'] / e_time:.2f}" if e_time else "--"
                peer_ratio = f"{f['median_s'] / t_time:.2f}" if t_time else "--"
                if t_time:
                    summary["peer_ratio"][f"{mode} {length} {name}"] = f["median_s"] / t_time
                print(
                    f"{mode:>13} {length:>6} {'fwd' if name == 'forward' else 'fwd+bwd':>8} "
                    f"{fmt_ms(f['median_s']):>9} {fmt_ms(e_time):>9} {ratio:>8} "
                    f"{f['temp_bytes'] / 1e6:>9.1f} {e['temp_bytes'] / 1e6:>9.1f}"
                    f"{'*' if e['skipped'] else ' '}{fmt_ms(t_time):>8} {peer_ratio:>8}"
                )
    print("  exact MB*: compiled but not run (temporaries over the limit); MB = XLA temp bytes")

    print()
    for mode in MODES:
        for name in PASSES:
            crossover = next(
                (
                    length
                    for length in args.lengths
                    if exact(length, mode, name)["median_s"] is None
                    or favor(length, mode, name)["median_s"] < exact(length, mode, name)["median_s"]
                ),
                None,
            )
            summary["crossover"][f"{mode} {name}"] = crossover
            line = f"{mode:>13} {name:>16}: crossover T = {crossover}"
            if 4096 in args.lengths and 16384 in args.lengths:
                growth = favor(16384, mode, name)["median_s"] / favor(4096, mode, name)["median_s"]
                summary["growth_16384_4096"][f"{mode} {name}"] = growth
                line += f", FAVOR time 16384 / 4096 = {growth:.2f} (target <= 5)"
            print(line)
    if peer:
        ratios = summary["peer_ratio"].values()
        print(
            f"rfjax / performer-pytorch (torch {peer['torch']}, {peer['threads']} threads, causal "
            f"path {peer['causal_path']}): max {max(ratios):.2f}, min {min(ratios):.2f} "
            "(target <= 1.0)"
        )
    if args.json:
        save_json(args.json, {"rows": rows, "peer": peer, "summary": summary}, settings=vars(args))


if __name__ == "__main__":
    main()
