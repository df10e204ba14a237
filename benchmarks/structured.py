"""Fast structured couplings vs dense ones, m = d.

  python -m benchmarks.structured [--dims 256 1024 4096] [--inputs 1024] [--repeats 5]
  python -m benchmarks.structured --apply [--dims 256 512 1024 2048 4096] [--inputs 4096]
      [--repeats 5] [--json PATH]     # the committed apply*.json ran with --repeats 15

Default: for each d, one jitted call draws the projection from a key and computes softmax
positive features of ``--inputs`` inputs: dense ORF (QR, O(d^3) draw, O(d^2) per input) and
dense SimRF against ``hd_orthogonal`` and ``fast_simplex`` (Rademacher draws, O(d log d) per input
through the FWHT op), each fast one's paired ratio to its dense one (as ``--apply``'s, below)
printed with the load average. Target: the fast ones win from d = 1024 on.

``--apply``: every structured map against the dense Gaussian W, the time of ``x W^T`` for drawn
projections (jitted, no draw) of a batch of ``--inputs`` rows (default 4096; issue 46: every map
<= 1.0x dense from d = 256 at batch 4096): the Hadamard-diagonal chains ``hd_orthogonal`` and
``fast_simplex`` (k = 3 rotations: one batched transform per rotation over all rows and blocks),
and the P-model families (circulant, skew-circulant, Toeplitz, Hankel, low displacement rank
r = 1, 2, 4, and circulant with the HD preprocessing), m = d. Dense costs O(d^2) per input, the
HD chains and the circulant O(d log d) with a transform of length d, the others O(d log d) with
FFTs of length 2d (O(r d log d) for rank r). The contenders take turns repeat by repeat; each
ratio is the median over repeats of the paired ratio (repeat i of the map over repeat i of
dense; the order of the contenders shuffled in every round, so that none always runs after the
same one), printed with the load average and written with every sample to ``--json`` (default
``benchmarks/results/structured/apply.json``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
from typing import Any

import jax

from benchmarks.features import draw_and_featurize
from benchmarks.timing import load_average, paired_ratio, save_json, time_interleaved
from rfjax import projections

PAIRS = (("orthogonal", "hd_orthogonal"), ("simplex", "fast_simplex"))
APPLY_JSON = pathlib.Path("benchmarks/results/structured/apply.json")
# (label, coupling, options) of the structured maps timed against the dense Gaussian W.
P_MODEL_FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("hd_orthogonal", "hd_orthogonal", {}),
    ("fast_simplex", "fast_simplex", {}),
    ("circulant", "circulant", {}),
    ("skew_circulant", "skew_circulant", {}),
    ("toeplitz", "toeplitz", {}),
    ("hankel", "hankel", {}),
    ("ldr r=1", "low_displacement_rank", {"rank": 1}),
    ("ldr r=2", "low_displacement_rank", {"rank": 2}),
    ("ldr r=4", "low_displacement_rank", {"rank": 4}),
    ("circulant + HD", "circulant", {"preprocess": True}),
)


def benchmark(dims: tuple[int, ...], num_inputs: int, repeats: int) -> list[dict]:
    rows = []
    for dim in dims:
        x = jax.random.normal(jax.random.key(0), (num_inputs, dim)) / dim**0.5
        functions = {}
        for index, coupling in enumerate(c for pair in PAIRS for c in pair):
            run = draw_and_featurize(coupling, dim)
            key = jax.random.key(index)
            functions[coupling] = lambda run=run, key=key, x=x: run(key, x)
        load = load_average()
        timings = time_interleaved(functions, repeats=repeats, warmup=1)
        for dense, fast in PAIRS:
            rows.append(
                {
                    "dim": dim,
                    "dense": dense,
                    "fast": fast,
                    "dense_ms": 1e3 * timings[dense]["median_s"],
                    "fast_ms": 1e3 * timings[fast]["median_s"],
                    "fast_over_dense": paired_ratio(
                        timings[fast]["samples_s"], timings[dense]["samples_s"]
                    ),
                    "load_average_before": load,
                    "load_average_after": load_average(),
                }
            )
    return rows


@jax.jit
def _project(projection: projections.Projection, x: jax.Array) -> jax.Array:
    return projection(x)


def apply_benchmark(dims: tuple[int, ...], num_inputs: int, repeats: int) -> list[dict]:
    """Time of ``x W^T`` per structured map and for the dense Gaussian W, paired ratios to dense."""
    rows = []
    for dim in dims:
        x = jax.random.normal(jax.random.key(0), (num_inputs, dim))
        drawn: dict[str, projections.Projection] = {
            "dense": projections.gaussian(jax.random.key(1), dim, dim)
        }
        for index, (label, coupling, options) in enumerate(P_MODEL_FAMILIES):
            key = jax.random.key(2 + index)
            drawn[label] = projections.get(coupling)(key, dim, dim, **options)
        functions = {
            label: lambda p=projection, x=x: _project(p, x) for label, projection in drawn.items()
        }
        load = load_average()
        timings = time_interleaved(functions, repeats=repeats, warmup=2, shuffle_seed=dim)
        dense = timings["dense"]
        rows += [
            {
                "dim": dim,
                "inputs": num_inputs,
                "family": label,
                "ms": 1e3 * timing["median_s"],
                "over_dense": paired_ratio(timing["samples_s"], dense["samples_s"]),
                "samples_ms": [1e3 * t for t in timing["samples_s"]],
                "load_average_before": load,
                "load_average_after": load_average(),
            }
            for label, timing in timings.items()
        ]
    return rows


def print_apply_table(rows: list[dict]) -> None:
    dims = sorted({row["dim"] for row in rows})
    labels = list(dict.fromkeys(row["family"] for row in rows))
    cells = {(row["dim"], row["family"]): row for row in rows}
    print("median ms per call (paired ratio to dense: median [quartiles])")
    print(f"{'family':>16} " + " ".join(f"{f'd = {dim}':>29}" for dim in dims))
    for label in labels:
        entries = [cells[(dim, label)] for dim in dims]
        text = " ".join(
            f"{e['ms']:>9.3f} ({e['over_dense']['median']:>5.2f} "
            f"[{e['over_dense']['q25']:.2f}, {e['over_dense']['q75']:.2f}])"
            for e in entries
        )
        print(f"{label:>16} {text}")
    for dim in dims:
        load = cells[(dim, "dense")]
        print(
            f"d = {dim}: load average {load['load_average_before']} before, "
            f"{load['load_average_after']} after"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=None)
    parser.add_argument("--inputs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--apply", action="store_true", help="structured maps vs dense W")
    parser.add_argument("--json", default=None, help="--apply: default " + str(APPLY_JSON))
    args = parser.parse_args()
    if args.apply:
        dims, inputs = args.dims or [256, 512, 1024, 2048, 4096], args.inputs or 4096
        print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {inputs} inputs, m = d")
        rows = apply_benchmark(tuple(dims), inputs, args.repeats)
        print_apply_table(rows)
        path = pathlib.Path(args.json or APPLY_JSON)
        report = {"jax": jax.__version__, "cpus": os.cpu_count(), "repeats": args.repeats}
        save_json(path, {**report, "rows": rows}, settings=vars(args))
        print(f"written: {path}")
        return
    args.dims, args.inputs = args.dims or [256, 1024, 4096], args.inputs or 1024
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.inputs} inputs, m = d")
    print(
        f"{'d':>5} {'dense':>11} {'ms':>9} {'fast':>14} {'ms':>9} "
        f"{'fast/dense [quartiles]':>24} {'load before, after':>20}"
    )
    for row in benchmark(tuple(args.dims), args.inputs, args.repeats):
        ratio = row["fast_over_dense"]
        print(
            f"{row['dim']:>5} {row['dense']:>11} {row['dense_ms']:>9.2f} {row['fast']:>14} "
            f"{row['fast_ms']:>9.2f} {ratio['median']:>8.3f} [{ratio['q25']:.3f}, "
            f"{ratio['q75']:.3f}] {row['load_average_before']}, {row['load_average_after']}"
        )


if __name__ == "__main__":
    main()
