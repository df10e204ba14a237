"""Draw a projection and compute positive features, per coupling (issue: SimRF ~ ORF cost).

  python -m benchmarks.features [--inputs 8192] [--dim 64] [--repeats 30]

For 8,192 inputs of d = 64 and m in {64, 256}: the time of one jitted call that draws the
projection from a key and returns softmax positive features, median over interleaved repeats,
and its paired ratio to ORF in the same run (``timing.paired_ratio``: the median and quartiles
of repeat i over ORF's repeat i), with the load average before and after. Target:
SimRF / ORF <= 1.05.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.timing import load_average, paired_ratio, save_json, time_interleaved
from rfjax import features, projections

COUPLINGS = ("gaussian", "orthogonal", "simplex", "simplex_plus", "halton")


def draw_and_featurize(coupling: str, num_features: int):
    sampler = projections.get(coupling)

    @jax.jit
    def run(key, x):
        projection = sampler(key, x.shape[-1], num_features)
        return features.positive_features(x, projection, kernel="softmax")

    return run


def benchmark(
    num_inputs: int, dim: int, feature_counts: tuple[int, ...], repeats: int
) -> list[dict]:
    x = jax.random.normal(jax.random.key(0), (num_inputs, dim)) / dim**0.25
    rows = []
    for num_features in feature_counts:
        functions = {}
        for index, coupling in enumerate(COUPLINGS):
            run = draw_and_featurize(coupling, num_features)
            key = jax.random.key(index)
            functions[coupling] = lambda run=run, key=key: run(key, x)
        load = load_average()
        timings = time_interleaved(functions, repeats=repeats)
        reference = timings["orthogonal"]["samples_s"]
        for coupling, timing in timings.items():
            rows.append(
                {
                    "num_features": num_features,
                    "coupling": coupling,
                    "median_ms": 1e3 * timing["median_s"],
                    "iqr_ms": 1e3 * (timing["q75_s"] - timing["q25_s"]),
                    "over_orthogonal": paired_ratio(timing["samples_s"], reference),
                    "load_average_before": load,
                    "load_average_after": load_average(),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--features", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=str, default=None, help="also write the rows here")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {jnp.zeros(()).dtype}")
    rows = benchmark(args.inputs, args.dim, tuple(args.features), args.repeats)
    print(f"{'m':>5} {'coupling':>13} {'median ms':>10} {'IQR ms':>8} {'/ ORF [quartiles]':>24}")
    for row in rows:
        ratio = row["over_orthogonal"]
        print(
            f"{row['num_features']:>5} {row['coupling']:>13} {row['median_ms']:>10.3f} "
            f"{row['iqr_ms']:>8.3f} {ratio['median']:>7.3f} [{ratio['q25']:.3f}, "
            f"{ratio['q75']:.3f}]"
        )
    for row in rows[:: len(COUPLINGS)]:
        print(
            f"m = {row['num_features']}: load average {row['load_average_before']} before, "
            f"{row['load_average_after']} after"
        )
    if args.json:
        save_json(args.json, rows, settings=vars(args))


if __name__ == "__main__":
    main()
