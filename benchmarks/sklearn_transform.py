"""``rfjax.sklearn.RandomFeatures.transform`` vs scikit-learn's ``RBFSampler.transform``.

  python -m benchmarks.sklearn_transform [--inputs 10000] [--dim 64] [--components 1024 ...]
      [--dtypes float64 float32] [--variants positive fourier] [--repeats 20]
      [--no-first-call] [--json PATH]

Issue 46's figure (float32 100k x 64 at m = 1024, 2048, 4096, the default Fourier features):

  python -m benchmarks.sklearn_transform --inputs 100000 --components 1024 2048 4096 \
      --dtypes float32 --variants fourier --repeats 7 --no-first-call

Both transformers are fitted once (gamma = 1 / dim) and then timed on the same NumPy input
(``--inputs`` x ``--dim``), taking turns repeat by repeat; the time includes the input validation
and the conversion of the output back to a NumPy array, as a Pipeline sees it. Inputs are float64
(the scikit-learn default; RBFSampler then computes in float64, RandomFeatures in float32 unless
JAX runs with 64-bit floats, and both return float64) and float32. The ratio to RBFSampler is the
median over repeats of the paired ratio (repeat i of a transformer over repeat i of
RBFSampler), printed with the load average. Target: RandomFeatures / RBFSampler <= 1.0 for every
row. The JSON (``--json``, default ``benchmarks/results/sklearn_transform/transform.json``) holds
every sample.

A second table (unless ``--no-first-call``) times what a user's first call costs (issue 20, item
3): ``fit`` + the first ``transform`` of a fresh setting right after import (``cold``, once per
transformer: it includes XLA's compilation of the sampler and of the block function), the same
again with everything compiled (``warm``, median of repeats), and ``transform`` of inputs with
new ``n_samples`` (each a size not seen before; target: no compilation, so close to the warm
transform). Target: cold fit + first transform within 2x RBFSampler's for n <= 10^4.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import time
from typing import Any

import jax
import numpy as np
from sklearn.kernel_approximation import RBFSampler

from benchmarks.timing import load_average, paired_ratio, save_json, time_interleaved
from rfjax.sklearn import RandomFeatures

VARIANTS: dict[str, dict[str, Any]] = {
    "rfjax positive/simplex": dict(features="positive", coupling="simplex"),
    "rfjax fourier/orthogonal": dict(features="fourier", coupling="orthogonal"),
}
FIRST_CALL_SIZES = (1_000, 10_000)
RESULTS = pathlib.Path("benchmarks/results/sklearn_transform/transform.json")


def benchmark(
    num_inputs: int,
    dim: int,
    components: int,
    repeats: int,
    dtypes: tuple[str, ...] = ("float64", "float32"),
    variants: tuple[str, ...] = tuple(VARIANTS),
) -> list[dict]:
    """One row per (input dtype, transformer): median time and paired ratio to RBFSampler."""
    rows = []
    for dtype in dtypes:
        x = np.random.default_rng(0).normal(size=(num_inputs, dim)).astype(dtype)
        transformers = {"sklearn RBFSampler": RBFSampler(gamma=1 / dim, n_components=components)}
        for name in variants:
            options = VARIANTS[name]
            transformers[name] = RandomFeatures(gamma=1 / dim, n_components=components, **options)
        functions = {}
        for name, transformer in transformers.items():
            transformer.fit(x)
            functions[name] = lambda transformer=transformer, x=x: transformer.transform(x)
        load = load_average()
        timings = time_interleaved(functions, repeats=repeats, warmup=1)
        reference = timings["sklearn RBFSampler"]
        for name, timing in timings.items():
            rows.append(
                {
                    "components": components,
                    "inputs": num_inputs,
                    "input_dtype": dtype,
                    "transformer": name,
                    "median_ms": 1e3 * timing["median_s"],
                    "iqr_ms": 1e3 * (timing["q75_s"] - timing["q25_s"]),
                    "ratio_to_rbf_sampler": paired_ratio(
                        timing["samples_s"], reference["samples_s"]
                    ),
                    "samples_ms": [1e3 * t for t in timing["samples_s"]],
                    "load_average_before": load,
                    "load_average_after": load_average(),
                }
            )
    return rows


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _makers(dim: int, width: int) -> dict[str, functools.partial]:
    makers = {"sklearn RBFSampler": functools.partial(RBFSampler, n_components=width)}
    for name, options in VARIANTS.items():
        makers[name] = functools.partial(RandomFeatures, n_components=width, **options)
    return {name: functools.partial(make, gamma=1 / dim) for name, make in makers.items()}


def _fit_transform(make, x: np.ndarray) -> np.ndarray:
    return make().fit(x).transform(x)


def _first_call_times(make, x: np.ndarray, repeats: int, rng) -> dict[str, float]:
    cold = _seconds(functools.partial(_fit_transform, make, x))
    warm = [_seconds(functools.partial(_fit_transform, make, x)) for _ in range(repeats)]
    fitted = make().fit(x)
    sizes = len(x) - 1 - rng.permutation(len(x) // 2)[:repeats]  # sizes not seen before
    new_n = [_seconds(functools.partial(fitted.transform, x[:n])) for n in sizes]
    return {"cold_s": cold, "warm_s": statistics.median(warm), "new_n_s": statistics.median(new_n)}


def first_call(dim: int, components: int, repeats: int) -> list[dict]:
    """Seconds for cold and warm fit + first transform, and for transforms of new sizes."""
    rows = []
    rng = np.random.default_rng(1)
    for offset, num_inputs in enumerate(FIRST_CALL_SIZES):
        x = rng.normal(size=(num_inputs, dim))
        # A width not used before in this process, so that the first fit is cold.
        makers = _makers(dim, components + 2 * offset + 2)
        times = {name: _first_call_times(make, x, repeats, rng) for name, make in makers.items()}
        reference = times["sklearn RBFSampler"]
        for name, row in times.items():
            ratios = {key.replace("_s", "_ratio"): row[key] / reference[key] for key in row}
            rows.append({"inputs": num_inputs, "transformer": name, **row, **ratios})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--components", type=int, nargs="+", default=[1024])
    parser.add_argument("--dtypes", nargs="+", choices=("float64", "float32"), default=None)
    parser.add_argument(
        "--variants", nargs="+", choices=("positive", "fourier"), default=["positive", "fourier"]
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-first-call", action="store_true")
    parser.add_argument("--json", default=None, help=f"default {RESULTS}")
    args = parser.parse_args()
    variants = tuple(name for name in VARIANTS if name.split()[1].split("/")[0] in args.variants)
    dtypes = tuple(args.dtypes or ("float64", "float32"))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.inputs} x {args.dim}")
    print(
        f"{'m':>5} {'input':>8} {'transformer':>26} {'median ms':>10} {'IQR ms':>8} "
        f"{'/ RBFSampler [quartiles]':>26}  load before/after"
    )
    rows = []
    for components in args.components:
        for row in benchmark(args.inputs, args.dim, components, args.repeats, dtypes, variants):
            rows.append(row)
            ratio = row["ratio_to_rbf_sampler"]
            print(
                f"{components:>5} {row['input_dtype']:>8} {row['transformer']:>26} "
                f"{row['median_ms']:>10.2f} {row['iqr_ms']:>8.2f} {ratio['median']:>8.3f} "
                f"[{ratio['q25']:.2f}, {ratio['q75']:.2f}]  {row['load_average_before'][0]}/"
                f"{row['load_average_after'][0]}",
                flush=True,
            )
    path = pathlib.Path(args.json or RESULTS)
    report = {"jax": jax.__version__, "cpus": os.cpu_count(), "repeats": args.repeats}
    save_json(path, {**report, "rows": rows}, settings=vars(args))
    print(f"written: {path}")
    if args.no_first_call:
        return
    components = args.components[0]
    print(f"\nfit + first transform, d = {args.dim}, about {components} components (seconds)")
    print(
        f"{'inputs':>7} {'transformer':>26} {'cold':>7} {'/ RBF':>7} {'warm':>7} {'/ RBF':>7} "
        f"{'new n':>7} {'/ RBF':>7}"
    )
    for row in first_call(args.dim, components, min(args.repeats, 5)):
        print(
            f"{row['inputs']:>7} {row['transformer']:>26} {row['cold_s']:>7.3f} "
            f"{row['cold_ratio']:>7.1f} {row['warm_s']:>7.3f} {row['warm_ratio']:>7.1f} "
            f"{row['new_n_s']:>7.3f} {row['new_n_ratio']:>7.1f}"
        )


if __name__ == "__main__":
    main()
