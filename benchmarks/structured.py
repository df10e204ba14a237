"""Fast structured couplings vs dense ones: draw + positive features, m = d.

  python -m benchmarks.structured [--dims 256 1024 4096] [--inputs 1024] [--repeats 5]

For each d, one jitted call draws the projection from a key and computes softmax positive
features of ``--inputs`` inputs: dense ORF (QR, O(d^3) draw, O(d^2) per input) and dense SimRF
against ``hd_orthogonal`` and ``fast_simplex`` (Rademacher draws, O(d log d) per input through
the FWHT op). Target: the fast ones win from d = 1024 on.
"""

from __future__ import annotations

import argparse

import jax

from benchmarks.features import draw_and_featurize
from benchmarks.timing import time_interleaved

PAIRS = (("orthogonal", "hd_orthogonal"), ("simplex", "fast_simplex"))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.inputs} inputs, m = d")
    print(f"{'d':>5} {'dense':>11} {'ms':>9} {'fast':>14} {'ms':>9} {'fast/dense':>10}")
    for row in benchmark(tuple(args.dims), args.inputs, args.repeats):
        print(
            f"{row['dim']:>5} {row['dense']:>11} {row['dense_ms']:>9.2f} {row['fast']:>14} "
            f"{row['fast_ms']:>9.2f} {row['fast_over_dense']:>10.3f}"
        )


if __name__ == "__main__":
    main()
