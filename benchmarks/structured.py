"""Fast structured couplings vs dense ones, m = d.

  python -m benchmarks.structured [--dims 256 1024 4096] [--inputs 1024] [--repeats 5]
  python -m benchmarks.structured --apply [--dims 256 1024 4096 16384] [--inputs 64]

Default: for each d, one jitted call draws the projection from a key and computes softmax
positive features of ``--inputs`` inputs: dense ORF (QR, O(d^3) draw, O(d^2) per input) and
dense SimRF against ``hd_orthogonal`` and ``fast_simplex`` (Rademacher draws, O(d log d) per input
through the FWHT op). Target: the fast ones win from d = 1024 on.

``--apply``: the P-model families (circulant, skew-circulant, Toeplitz, Hankel, low displacement
rank r = 1, 2, 4, and circulant with the HD preprocessing) against the dense Gaussian W: the time
of ``x W^T`` for drawn projections (jitted, no draw), as ratios to dense in one interleaved run.
Dense costs O(d^2) per input, the families O(d log d) (O(r d log d) for rank r).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax

from benchmarks.features import draw_and_featurize
from benchmarks.timing import time_interleaved
from rfjax import projections

PAIRS = (("orthogonal", "hd_orthogonal"), ("simplex", "fast_simplex"))
# (label, coupling, options) of the P-model families timed against the dense Gaussian W.
P_MODEL_FAMILIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
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
        timings = time_interleaved(functions, repeats=repeats, warmup=1)
        for dense, fast in PAIRS:
            rows.append(
                {
                    "dim": dim,
                    "dense": dense,
                    "fast": fast,
                    "dense_ms": 1e3 * timings[dense]["median_s"],
                    "fast_ms": 1e3 * timings[fast]["median_s"],
                    "fast_over_dense": timings[fast]["median_s"] / timings[dense]["median_s"],
                }
            )
    return rows


@jax.jit
def _project(projection: projections.Projection, x: jax.Array) -> jax.Array:
    return projection(x)


def apply_benchmark(dims: tuple[int, ...], num_inputs: int, repeats: int) -> list[dict]:
    """Time of ``x W^T`` per P-model family and for the dense Gaussian W, ratios to dense."""
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
        timings = time_interleaved(functions, repeats=repeats, warmup=1)
        dense = timings["dense"]["median_s"]
        rows += [
            {
                "dim": dim,
                "family": label,
                "ms": 1e3 * timing["median_s"],
                "over_dense": timing["median_s"] / dense,
            }
            for label, timing in timings.items()
        ]
    return rows


def print_apply_table(rows: list[dict]) -> None:
    dims = sorted({row["dim"] for row in rows})
    labels = list(dict.fromkeys(row["family"] for row in rows))
    cells = {(row["dim"], row["family"]): row for row in rows}
    print("median ms per call (ratio to dense)")
    print(f"{'family':>16} " + " ".join(f"{f'd = {dim}':>20}" for dim in dims))
    for label in labels:
        entries = [cells[(dim, label)] for dim in dims]
        text = " ".join(f"{e['ms']:>10.3f} ({e['over_dense']:>6.3f})" for e in entries)
        print(f"{label:>16} {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=None)
    parser.add_argument("--inputs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--apply", action="store_true", help="P-model families vs dense W")
    args = parser.parse_args()
    if args.apply:
        dims, inputs = args.dims or [256, 1024, 4096, 16384], args.inputs or 64
        print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {inputs} inputs, m = d")
        print_apply_table(apply_benchmark(tuple(dims), inputs, args.repeats))
        return
    args.dims, args.inputs = args.dims or [256, 1024, 4096], args.inputs or 1024
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.inputs} inputs, m = d")
    print(f"{'d':>5} {'dense':>11} {'ms':>9} {'fast':>14} {'ms':>9} {'fast/dense':>10}")
    for row in benchmark(tuple(args.dims), args.inputs, args.repeats):
        print(
            f"{row['dim']:>5} {row['dense']:>11} {row['dense_ms']:>9.2f} {row['fast']:>14} "
            f"{row['fast_ms']:>9.2f} {row['fast_over_dense']:>10.3f}"
        )


if __name__ == "__main__":
    main()
