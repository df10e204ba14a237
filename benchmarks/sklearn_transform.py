"""``rfjax.sklearn.RandomFeatures.transform`` vs scikit-learn's ``RBFSampler.transform``.

  python -m benchmarks.sklearn_transform [--inputs 10000] [--dim 64] [--components 1024]

Both transformers are fitted once (gamma = 1 / dim) and then timed on the same 10,000 x 64
NumPy input, median over interleaved repeats; the time includes the input validation and the
conversion of the output back to a NumPy array, as a Pipeline sees it. Inputs are float64 (the
scikit-learn default; RBFSampler then computes in float64, RandomFeatures in float32 unless JAX
runs with 64-bit floats, and both return float64) and float32. Target: RandomFeatures /
RBFSampler <= 1.0 for every row.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from sklearn.kernel_approximation import RBFSampler

from benchmarks.timing import time_interleaved
from rfjax.sklearn import RandomFeatures

VARIANTS = {
    "rfjax positive/simplex": dict(features="positive", coupling="simplex"),
    "rfjax fourier/orthogonal": dict(features="fourier", coupling="orthogonal"),
}


def benchmark(num_inputs: int, dim: int, components: int, repeats: int) -> list[dict]:
    """One row per (input dtype, transformer): median time and ratio to RBFSampler."""
    rows = []
    for dtype in (np.float64, np.float32):
        x = np.random.default_rng(0).normal(size=(num_inputs, dim)).astype(dtype)
        transformers = {"sklearn RBFSampler": RBFSampler(gamma=1 / dim, n_components=components)}
        for name, options in VARIANTS.items():
            transformers[name] = RandomFeatures(gamma=1 / dim, n_components=components, **options)
        functions = {}
        for name, transformer in transformers.items():
            transformer.fit(x)
            functions[name] = lambda transformer=transformer, x=x: transformer.transform(x)
        timings = time_interleaved(functions, repeats=repeats)
        reference = timings["sklearn RBFSampler"]["median_s"]
        for name, timing in timings.items():
            rows.append(
                {
                    "input_dtype": np.dtype(dtype).name,
                    "transformer": name,
                    "median_ms": 1e3 * timing["median_s"],
                    "iqr_ms": 1e3 * (timing["q75_s"] - timing["q25_s"]),
                    "ratio_to_rbf_sampler": timing["median_s"] / reference,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--components", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    rows = benchmark(args.inputs, args.dim, args.components, args.repeats)
    print(f"{'input':>8} {'transformer':>26} {'median ms':>10} {'IQR ms':>8} {'/ RBFSampler':>13}")
    for row in rows:
        print(
            f"{row['input_dtype']:>8} {row['transformer']:>26} {row['median_ms']:>10.2f} "
            f"{row['iqr_ms']:>8.2f} {row['ratio_to_rbf_sampler']:>13.3f}"
        )


if __name__ == "__main__":
    main()
