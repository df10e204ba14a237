"""Feature-construction cost: angular hybrid HRF-A(16, 8) vs positive features (HRF App. L).

  python -m benchmarks.hybrid [--inputs 8192] [--dim 64] [--repeats 30]

For 8,192 inputs of d = 64, one jitted call computes query features from already drawn
projections (drawing is not timed); median over interleaved repeats.

Widths. App. L counts the hybrid's map as sum_k m_k n_k-dimensional (m = 16 base features
times n = 8 coefficient features = 128), built in O(d (m + n) + m n) time against O(d m n) for
a regular estimator of that dimension; so the paper's comparison is HRF-A(16, 8) vs positive
features with 128 projections. The actual width of ``angular_hybrid_features`` is
(2 m + 2 m)(n + 1) = 576 (antithetic positive 2m and sin/cos 2m base blocks, each with its
offset copy and its Kronecker product with the n signs), so positive features with 576
projections are the width-matched comparison. Both are timed, with the hybrid's two variants
(independent base projections: 16 + 16 + 8 rows; shared: 16 + 8 rows).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.timing import load_average, paired_ratio, time_interleaved
from rfjax import features, projections


def hybrid_width(m: int, n: int) -> int:
    """Width of ``angular_hybrid_features`` with m projections per base estimator, n signs."""
    return (2 * m + 2 * m) * (n + 1)


@jax.jit
def _hybrid(x, positive_projection, trigonometric_projection, sign_projection):
    return features.angular_hybrid_features(
        x, positive_projection, trigonometric_projection, sign_projection, side="query"
    )


@jax.jit
def _positive(x, projection):
    return features.positive_features(x, projection)


def benchmark(num_inputs: int, dim: int, m: int, n: int, repeats: int) -> dict:
    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (num_inputs, dim)) / dim**0.25
    w_pos = projections.gaussian(keys[1], dim, m)
    w_trig = projections.gaussian(keys[2], dim, m)
    signs = projections.gaussian(keys[3], dim, n)
    paper_width, width = m * n, hybrid_width(m, n)
    w_paper = projections.gaussian(keys[4], dim, paper_width)
    w_width = projections.gaussian(keys[5], dim, width)
    functions = {
        f"hybrid ({m},{n}) independent": lambda: _hybrid(x, w_pos, w_trig, signs),
        f"hybrid ({m},{n}) shared": lambda: _hybrid(x, w_pos, w_pos, signs),
        f"positive m={paper_width}": lambda: _positive(x, w_paper),
        f"positive m={width}": lambda: _positive(x, w_width),
    }
    widths = {
        f"hybrid ({m},{n}) independent": width,
        f"hybrid ({m},{n}) shared": width,
        f"positive m={paper_width}": paper_width,
        f"positive m={width}": width,
    }
    for name, fn in functions.items():
        shape = fn().shape
        if shape != (num_inputs, widths[name]):
            raise RuntimeError(f"{name}: expected width {widths[name]}, got shape {shape}")
    load = load_average()
    timings = time_interleaved(functions, repeats=repeats)
    names = list(timings)
    ratios = {
        (hybrid, positive): paired_ratio(
            timings[hybrid]["samples_s"], timings[positive]["samples_s"]
        )
        for hybrid in names[:2]
        for positive in names[2:]
    }
    loads = {"before": load, "after": load_average()}
    return {"timings": timings, "widths": widths, "ratios": ratios, "load_average": loads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {jnp.zeros(()).dtype}")
    result = benchmark(args.inputs, args.dim, args.m, args.n, args.repeats)
    timings, widths = result["timings"], result["widths"]
    print(f"{'features':>30} {'width':>6} {'median ms':>10} {'IQR ms':>8}")
    for name, timing in timings.items():
        iqr = 1e3 * (timing["q75_s"] - timing["q25_s"])
        print(f"{name:>30} {widths[name]:>6} {1e3 * timing['median_s']:>10.3f} {iqr:>8.3f}")
    for (hybrid, positive), ratio in result["ratios"].items():
        print(
            f"{hybrid} / {positive}: {ratio['median']:.3f} [{ratio['q25']:.3f}, {ratio['q75']:.3f}]"
        )
    load = result["load_average"]
    print(f"load average {load['before']} before, {load['after']} after")


if __name__ == "__main__":
    main()
