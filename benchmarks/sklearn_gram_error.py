"""Gram-matrix error of ``rfjax.sklearn.RandomFeatures`` vs scikit-learn's ``RBFSampler``.

  python -m benchmarks.sklearn_gram_error [--points 300] [--components 512] [--seeds 10]

Data: the 1,797 8x8 digits of ``sklearn.datasets.load_digits``, standardised per pixel (d = 64),
and their first 8 principal components, standardised (d = 8); ``--points`` of them, the same
for every transformer. Kernel: exp(-gamma |x - y|^2) with gamma = 1 / d (the Gram entries then
spread over (0, 1); with gamma = 1 on standardised data the kernel is nearly the identity).
Error: the relative Frobenius error |Z Z^T - K|_F / |K|_F, per seed (``random_state`` = seed,
paired across transformers), reported as the mean +- 1 standard error over seeds, as the
ratio of means to RBFSampler's and with the standard error of the paired difference from
RBFSampler's errors (seed by seed), which says whether a ratio's distance from 1 is resolved.
Used for the choice of ``RandomFeatures``' defaults.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.kernel_approximation import RBFSampler
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.preprocessing import StandardScaler

from rfjax.sklearn import RandomFeatures

VARIANTS: dict[str, dict[str, Any] | None] = {
    "sklearn RBFSampler": None,
    "fourier/gaussian": dict(features="fourier", coupling="gaussian"),
    "fourier/orthogonal": dict(features="fourier", coupling="orthogonal"),
    "fourier/simplex": dict(features="fourier", coupling="simplex"),
    "fourier/halton": dict(features="fourier", coupling="halton"),
    "positive/simplex": dict(features="positive", coupling="simplex"),
}


def data_sets(num_points: int) -> dict[str, np.ndarray]:
    digits = StandardScaler().fit_transform(load_digits().data)
    components = StandardScaler().fit_transform(PCA(8, random_state=0).fit_transform(digits))
    chosen = np.random.default_rng(0).permutation(len(digits))[:num_points]
    return {"digits d=64": digits[chosen], "digits PCA d=8": components[chosen]}


def relative_error(transformer, x: np.ndarray, exact: np.ndarray) -> float:
    z = transformer.fit_transform(x)
    return float(np.linalg.norm(z @ z.T - exact) / np.linalg.norm(exact))


def benchmark(num_points: int, components: int, seeds: int) -> list[dict]:
    rows = []
    for data_name, x in data_sets(num_points).items():
        gamma = 1.0 / x.shape[1]
        exact = rbf_kernel(x, gamma=gamma)
        errors = {}
        for name, options in VARIANTS.items():
            errors[name] = np.array(
                [
                    relative_error(
                        RBFSampler(gamma=gamma, n_components=components, random_state=seed)
                        if options is None
                        else RandomFeatures(
                            gamma=gamma, n_components=components, random_state=seed, **options
                        ),
                        x,
                        exact,
                    )
                    for seed in range(seeds)
                ]
            )
        reference = errors["sklearn RBFSampler"]
        for name, values in errors.items():
            rows.append(
                {
                    "data": data_name,
                    "transformer": name,
                    "mean": values.mean(),
                    "se": values.std(ddof=1) / np.sqrt(seeds),
                    "ratio": values.mean() / reference.mean(),
                    "paired_diff_se": (values - reference).std(ddof=1) / np.sqrt(seeds),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=300)
    parser.add_argument("--components", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    if args.seeds < 2:  # the standard error needs two (one printed NaN)
        parser.error(f"--seeds must be >= 2, got {args.seeds}")
    rows = benchmark(args.points, args.components, args.seeds)
    print(f"{args.points} points, {args.components} components, {args.seeds} paired seeds")
    print(
        f"{'data':>15} {'transformer':>20} {'rel. error':>11} {'+-1 SE':>8} {'/ RBFSampler':>13} "
        f"{'paired diff SE':>15}"
    )
    for row in rows:
        print(
            f"{row['data']:>15} {row['transformer']:>20} {row['mean']:>11.4f} {row['se']:>8.4f} "
            f"{row['ratio']:>13.3f} {row['paired_diff_se']:>15.4f}"
        )


if __name__ == "__main__":
    main()
