"""Random-feature ridge at scale: Fashion-MNIST against scikit-learn, and a 10^7-row stream.

  python -m benchmarks.ridge [--components 1024 2048 4096] [--rfjax-only-components 8192]
      [--stream-rows 100000 1000000 10000000] [--methods NAME ...] [--out benchmarks/results/ridge]
  python -m benchmarks.ridge --versus-sklearn [--components 1024 4096] [--rows 200000]
      [--repeats 3] [--out benchmarks/results/ridge]

``--versus-sklearn`` (issue 46's figure): ``rfjax.sklearn.RandomFeatureRidgeClassifier``
(defaults: Fourier features of an orthogonal coupling) against ``make_pipeline(RBFSampler,
RidgeClassifier)`` at the same m, gamma = 1 / (2 d) and alpha = 1, on
``make_classification(rows, 64 features, 16 informative, 4 classes)`` in float32: the two fit
and predict (on the training rows) in turn, repeat by repeat, in one process, after one rfjax
warm-up fit and predict on 4096 rows at the same m (compilation not counted); then rfjax predicts
on a row count it has not seen (first call) and again on it (warm). Reported: median fit and
predict times and the paired ratios rfjax / scikit-learn (repeat i over repeat i; targets <=
1.0), rfjax's first / warm predict on a new row count (target <= 1.2), the training accuracies,
the load average, and the peak memory of each contender's fit + predict, measured in a fresh
process each (the peak resident set above the one before the fit, the data already loaded;
target: rfjax <= 1/3 of scikit-learn's). JSON: ``versus_sklearn.json`` in ``--out``.

Fashion-MNIST (60,000 training and 10,000 test images, pixels / 255, d = 784), Gaussian kernel
exp(-gamma |x - y|^2) with gamma = 1 / median |x - y|^2 of 1,000 training images (the median
heuristic), one-vs-all ridge classification on +-1 targets (``RidgeClassifier``'s encoding), the
same alpha for every method: chosen on a 50,000 / 10,000 split of the training set from a grid
by ``solve_ridge_path`` at m = 1024 (rfjax, Fourier/orthogonal; the largest alpha within one
standard error of the best validation accuracy), then used for all.

At each m (equal numbers of features: m random features, m Nystroem components):

* ``rfjax fourier/orthogonal``: ``rfjax.linear_models`` with sin/cos random Fourier features
  of m / 2 orthogonal projection vectors; float32; one streaming pass in 4096-row blocks.
* ``rfjax positive/simplex``: positive (FAVOR+) features of m simplex-coupled vectors for the
  Gaussian kernel.
* ``sklearn RBFSampler + RidgeClassifier`` and ``sklearn Nystroem + RidgeClassifier`` (float32
  inputs, so both keep float32 features).

``--rfjax-only-components`` adds larger m for ``rfjax fourier/orthogonal`` alone: scikit-learn's
pipelines hold the 60,000 x m feature matrix (and Nystroem an m x m SVD), which at m = 16,384 is
3.9 GB in float32 before RidgeClassifier's copies, where rfjax holds the m x m statistics (1 GiB).

Fit time is the wall time of ``fit`` on the 60,000 training rows (features included, one run;
each rfjax fit follows a warm-up fit on one 4096-row block at the same m, so that compilation is
not counted); accuracy is on the
10,000 test images with its binomial standard error sqrt(p (1 - p) / 10000) (the test-set
sampling error; the feature draw's own variation is one seed here, not measured). Exact kernel
ridge (``sklearn.kernel_ridge.KernelRidge``) is fitted on the first 10,000 training images, and
the rfjax Fourier model is also fitted on that subset, for the like-for-like comparison.

The stream: y = sin(x_1) + x_2 x_3 + noise, x ~ N(0, I_16), generated block by block (never
held), m = 64 Fourier features; wall time per row and the process's peak resident memory after
n = 10^5, 10^6, 10^7 rows (the statistics are O(m^2) whatever n).

Times are wall-clock on whatever machine runs it; the committed table came from 2 CPU cores
shared with other jobs, so absolute times are inflated and only ratios measured in the same run
are meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import make_classification
from sklearn.kernel_approximation import Nystroem, RBFSampler
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import RidgeClassifier
from sklearn.pipeline import make_pipeline

from benchmarks.timing import load_average, paired_ratio, save_json
from rfjax import data, features, projections
from rfjax.linear_models import (
    RandomFeatureTransform,
    array_blocks,
    fit_random_feature_ridge,
    ridge_statistics,
    solve_ridge_path,
)
from rfjax.sklearn import RandomFeatureRidgeClassifier

ALPHA_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
BLOCK_ROWS = 4096
RFJAX_VARIANTS = {
    "rfjax fourier/orthogonal": ("orthogonal", "fourier"),
    "rfjax positive/simplex": ("simplex", "positive"),
}


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST as float32 rows in [0, 1] and int labels."""
    (x, y), (x_test, y_test) = (data.load_fashion_mnist(split) for split in ("train", "test"))
    flat = [(v.reshape(v.shape[0], -1) / np.float32(255)).astype(np.float32) for v in (x, x_test)]
    return flat[0], y, flat[1], y_test


def median_gamma(x: np.ndarray) -> float:
    """1 / median squared distance between 1,000 rows (the median heuristic)."""
    sample = x[:1000].astype(np.float64)
    squared = (sample**2).sum(1)
    distances = squared[:, None] + squared[None] - 2 * sample @ sample.T
    return float(1.0 / np.median(distances[np.triu_indices(1000, 1)]))


def one_hot(labels: np.ndarray) -> np.ndarray:
    """+-1 one-vs-all targets, as ``RidgeClassifier`` encodes them."""
    return np.where(labels[:, None] == np.arange(10)[None], 1.0, -1.0).astype(np.float32)


def rfjax_transform(
    coupling: str, feature_map: str, dim: int, width: int, gamma: float, seed: int = 0
) -> RandomFeatureTransform:
    """Features of the Gaussian kernel exp(-gamma |x - y|^2) of total width ``width``."""
    fmap = features.get(feature_map)()
    vectors = width // 2 if isinstance(fmap, features.FourierFeatureMap) else width
    projection = projections.get(coupling)(jax.random.key(seed), dim, vectors)
    return RandomFeatureTransform(projection, fmap, 1 / np.sqrt(2 * gamma), "gaussian")


def rfjax_fit(transform, x, y, alpha):
    model = fit_random_feature_ridge(
        transform, array_blocks(x, one_hot(y), BLOCK_ROWS), alpha, block_rows=BLOCK_ROWS
    )
    jax.block_until_ready(model.weights)
    return model


def rfjax_scores(model, x) -> np.ndarray:
    return np.concatenate(
        [np.asarray(model.predict(x[i : i + 8192])) for i in range(0, len(x), 8192)]
    )


def choose_alpha(x, y, gamma) -> tuple[float, list[float]]:
    """The largest alpha of ``ALPHA_GRID`` whose validation accuracy is within one standard error
    of the best (the one-standard-error rule; Fourier/orthogonal, m = 1024, trained on the first
    50,000 rows, validated on the last 10,000). A larger alpha also keeps the float32 Cholesky
    solves of every method well conditioned."""
    transform = rfjax_transform("orthogonal", "fourier", x.shape[1], 1024, gamma, seed=99)
    statistics = ridge_statistics(transform, array_blocks(x[:50000], one_hot(y[:50000])))
    weights, intercepts = solve_ridge_path(statistics, ALPHA_GRID)
    phi = np.asarray(transform(jnp.asarray(x[50000:])))
    accuracies = [
        float(((phi @ np.asarray(w) + np.asarray(b)).argmax(1) == y[50000:]).mean())
        for w, b in zip(weights, intercepts, strict=True)
    ]
    best = max(accuracies)
    threshold = best - standard_error(best, 10000)
    return max(a for a, v in zip(ALPHA_GRID, accuracies, strict=True) if v >= threshold), accuracies


def timed(fit):
    start = time.perf_counter()
    result = fit()
    return result, time.perf_counter() - start


def standard_error(accuracy: float, n: int) -> float:
    return float(np.sqrt(accuracy * (1 - accuracy) / n))


EXACT = "exact kernel ridge (10k subset)"
RFJAX_SUBSET = "rfjax fourier/orthogonal (10k subset)"
SKLEARN_SAMPLERS = {
    "sklearn RBFSampler + RidgeClassifier": RBFSampler,
    "sklearn Nystroem + RidgeClassifier": Nystroem,
}
METHODS = (*RFJAX_VARIANTS, RFJAX_SUBSET, *SKLEARN_SAMPLERS, EXACT)


def fashion_mnist_rows(components, rfjax_only_components, out, methods=METHODS):
    """Measures ``methods`` (in that order) at every m of ``components`` and the first rfjax
    variant alone at ``rfjax_only_components``."""
    x, y, x_test, y_test = load()
    gamma = median_gamma(x)
    alpha, validation = choose_alpha(x, y, gamma)
    write(out, {"gamma": gamma, "alpha": alpha, "alpha_grid": ALPHA_GRID, "validation": validation})
    if EXACT in methods:
        exact = KernelRidge(alpha=alpha, kernel="rbf", gamma=gamma)
        measure(
            out,
            EXACT,
            None,
            10000,
            y_test,
            lambda: exact.fit(x[:10000], one_hot(y[:10000])),
            lambda model: model.predict(x_test).argmax(1),
        )
    for m in sorted({*components, *rfjax_only_components}):
        available = METHODS if m in components else METHODS[:1]
        for name in (name for name in methods if name in available and name != EXACT):
            rows, fit = method_fit(name, m, x, y, gamma, alpha)
            predict = (
                (lambda model: rfjax_scores(model, x_test).argmax(1))
                if name.startswith("rfjax")
                else (lambda model: model.predict(x_test))
            )
            measure(out, name, m, rows, y_test, fit, predict)


def method_fit(name, m, x, y, gamma, alpha):
    """``(training rows, fit)`` of method ``name`` at m features. An rfjax fit is compiled here
    on one block of rows at the same m, so that compilation is not in the timed fit."""
    if name in SKLEARN_SAMPLERS:
        pipeline = make_pipeline(
            SKLEARN_SAMPLERS[name](gamma=gamma, n_components=m, random_state=0),
            RidgeClassifier(alpha=alpha),
        )
        return 60000, lambda: pipeline.fit(x, y)
    coupling, feature_map = RFJAX_VARIANTS.get(name, RFJAX_VARIANTS["rfjax fourier/orthogonal"])
    transform = rfjax_transform(coupling, feature_map, 784, m, gamma)
    rows = 10000 if name == RFJAX_SUBSET else 60000
    rfjax_fit(transform, x[:BLOCK_ROWS], y[:BLOCK_ROWS], alpha)
    return rows, lambda: rfjax_fit(transform, x[:rows], y[:rows], alpha)


def measure(out, method, m, train_rows, y_test, fit, predict) -> None:
    """Fits (timed), predicts the test labels, writes the row; a failed fit is written too."""
    try:
        model, seconds = timed(fit)
    except (ValueError, MemoryError) as error:
        write(out, {"method": method, "m": m, "train_rows": train_rows, "error": str(error)})
        return
    accuracy = float((predict(model) == y_test).mean())
    write(out, row(method, m, train_rows, accuracy, seconds))


def row(method, m, train_rows, accuracy, seconds):
    return {
        "method": method,
        "m": m,
        "train_rows": train_rows,
        "test_accuracy": accuracy,
        "accuracy_se": standard_error(accuracy, 10000),
        "fit_s": seconds,
    }


def stream_blocks(rows: int, dim: int, seed: int):
    rng = np.random.default_rng(seed)
    for start in range(0, rows, BLOCK_ROWS * 4):
        b = min(BLOCK_ROWS * 4, rows - start)
        x = rng.standard_normal((b, dim), dtype=np.float32)
        y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.standard_normal(b, dtype=np.float32)
        yield x, y


def stream_rows(sizes, out, m=64, dim=16):
    transform = rfjax_transform("orthogonal", "fourier", dim, m, 1 / (2 * dim))
    ridge_statistics(transform, stream_blocks(BLOCK_ROWS, dim, 0), block_rows=BLOCK_ROWS)  # compile
    for n in sizes:
        statistics, seconds = timed(
            lambda n=n: jax.block_until_ready(
                ridge_statistics(transform, stream_blocks(n, dim, 1), block_rows=BLOCK_ROWS)
            )
        )
        weights, intercepts = solve_ridge_path(statistics, [1.0])
        x_check, y_check = next(stream_blocks(10000, dim, 2))
        predictions = np.asarray(transform(jnp.asarray(x_check))) @ np.asarray(
            weights[0]
        ) + np.asarray(intercepts[0])
        write(
            out,
            {
                "stream_rows": n,
                "m": m,
                "count": int(statistics.count),
                "seconds": seconds,
                "microseconds_per_row": 1e6 * seconds / n,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "statistics_bytes": sum(a.nbytes for a in jax.tree.leaves(statistics)),
                "heldout_rmse": float(np.sqrt(np.mean((predictions[:, 0] - y_check) ** 2))),
            },
        )


def write(out: str, record: dict) -> None:
    print(json.dumps(record), flush=True)
    with open(os.path.join(out, "ridge.jsonl"), "a") as handle:
        handle.write(json.dumps(record) + "\n")


def table(out: str) -> str:
    """The markdown tables of ``ridge.jsonl`` in ``out``: Fashion-MNIST (accuracy +- 1 SE, fit
    time and its ratio to RBFSampler + RidgeClassifier at the same m) and the stream."""
    with open(os.path.join(out, "ridge.jsonl")) as handle:
        records = [json.loads(line) for line in handle]
    setting = next(r for r in records if "alpha" in r)
    runs = [r for r in records if "method" in r]
    peer = {  # a peer's error row (e.g. a MemoryError) has no time
        r["m"]: r["fit_s"]
        for r in runs
        if r["method"].startswith("sklearn RBFSampler") and "fit_s" in r
    }
    lines = [
        f"Fashion-MNIST, gamma = {setting['gamma']:.5f} (median heuristic), alpha = "
        f"{setting['alpha']} (validation accuracy over alpha = {setting['alpha_grid']}: "
        f"{setting['validation']}). Accuracy on the 10,000 test images +- 1 binomial SE; fit "
        "time: one run, wall clock.",
        "",
        "| method | m | train rows | test accuracy | fit s | fit / RBFSampler+Ridge |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["m"] or 0, r["method"])):
        if "error" in r:
            lines.append(
                f"| {r['method']} | {r['m']} | {r['train_rows']} | failed: {r['error']} | | |"
            )
            continue
        ratio = f"{r['fit_s'] / peer[r['m']]:.2f}" if r["m"] in peer else ""
        lines.append(
            f"| {r['method']} | {r['m'] or 'exact'} | {r['train_rows']} | "
            f"{r['test_accuracy']:.4f} +- {r['accuracy_se']:.4f} | {r['fit_s']:.1f} | {ratio} |"
        )
    lines += [
        "",
        "Stream (m = 64 Fourier features, d = 16, blocks generated on the fly):",
        "",
        "| rows | seconds | us / row | peak RSS MiB | statistics bytes | held-out RMSE |",
        "|---|---|---|---|---|---|",
    ]
    for r in (r for r in records if "stream_rows" in r):
        lines.append(
            f"| {r['stream_rows']:,} | {r['seconds']:.1f} | {r['microseconds_per_row']:.2f} | "
            f"{r['peak_rss_mib']:.0f} | {r['statistics_bytes']} | {r['heldout_rmse']:.3f} |"
        )
    return "\n".join(lines) + "\n"


VERSUS_GAMMA_DIM = 64  # input features of the versus-sklearn data


def versus_data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The versus-sklearn data: ``make_classification``, float32 inputs, 4 classes."""
    x, y = make_classification(
        n_samples=rows,
        n_features=VERSUS_GAMMA_DIM,
        n_informative=16,
        n_classes=4,
        random_state=0,
    )
    return x.astype(np.float32), y


def versus_estimators(m: int) -> dict:
    """rfjax's classifier and scikit-learn's pipeline at m features, the same gamma and alpha."""
    gamma = 1.0 / (2 * VERSUS_GAMMA_DIM)
    return {
        "rfjax": RandomFeatureRidgeClassifier(
            n_components=m, gamma=gamma, alpha=1.0, random_state=0
        ),
        "sklearn": make_pipeline(
            RBFSampler(gamma=gamma, n_components=m, random_state=0), RidgeClassifier(alpha=1.0)
        ),
    }


def versus_times(m: int, x: np.ndarray, y: np.ndarray, repeats: int) -> dict:
    """Fit and predict times of both contenders in turn, and rfjax's first / warm predict."""
    estimators = versus_estimators(m)
    estimators["rfjax"].fit(x[:BLOCK_ROWS], y[:BLOCK_ROWS]).predict(x[:BLOCK_ROWS])  # compile
    times: dict[str, list[float]] = {
        f"{name} {step}": [] for step in ("fit", "predict") for name in estimators
    }
    times |= {"rfjax predict new n (first)": [], "rfjax predict new n (warm)": []}
    accuracy = {}
    load = load_average()
    for repeat in range(repeats):
        for name, estimator in estimators.items():
            _, seconds = timed(lambda estimator=estimator: estimator.fit(x, y))
            times[f"{name} fit"].append(seconds)
        for name, estimator in estimators.items():
            labels, seconds = timed(lambda estimator=estimator: estimator.predict(x))
            times[f"{name} predict"].append(seconds)
            accuracy[name] = float((labels == y).mean())
        count = len(x) - 1 - 977 * repeat  # a row count not predicted before
        for kind in ("first", "warm"):
            _, seconds = timed(lambda count=count: estimators["rfjax"].predict(x[:count]))
            times[f"rfjax predict new n ({kind})"].append(seconds)
    return {
        "m": m,
        "rows": len(x),
        "repeats": repeats,
        "accuracy": accuracy,
        "median_s": {name: statistics.median(t) for name, t in times.items()},
        "samples_s": times,
        "ratios": {
            "fit rfjax/sklearn": paired_ratio(times["rfjax fit"], times["sklearn fit"]),
            "predict rfjax/sklearn": paired_ratio(times["rfjax predict"], times["sklearn predict"]),
            "rfjax predict new n first/warm": paired_ratio(
                times["rfjax predict new n (first)"], times["rfjax predict new n (warm)"]
            ),
        },
        "load_average_before": load,
        "load_average_after": load_average(),
    }


def _status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (``VmRSS``: resident now, ``VmHWM``: its peak)."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def versus_memory_probe(name: str, m: int, rows: int) -> None:
    """In a fresh process: the peak resident memory of ``name``'s fit + predict above the
    resident memory before it (data loaded; the kernel's high-water mark reset first)."""
    x, y = versus_data(rows)
    estimator = versus_estimators(m)[name]
    with open("/proc/self/clear_refs", "w") as handle:  # resets VmHWM (Linux >= 4.0)
        handle.write("5")
    before = _status_bytes("VmRSS")
    estimator.fit(x, y).predict(x)
    peak = _status_bytes("VmHWM")
    print(json.dumps({"name": name, "m": m, "peak_above_start_bytes": peak - before}))


def versus_memory(m: int, rows: int) -> dict[str, int]:
    """Peak memory above the start of each contender's fit + predict, each in a fresh process."""
    peaks = {}
    for name in ("rfjax", "sklearn"):
        command = [sys.executable, "-m", "benchmarks.ridge", "--memory-probe", name, str(m)]
        result = subprocess.run(
            [*command, "--rows", str(rows)], capture_output=True, text=True, check=True
        )
        peaks[name] = json.loads(result.stdout.strip().splitlines()[-1])["peak_above_start_bytes"]
    return peaks


def versus_sklearn(components, rows: int, repeats: int, out: str) -> list[dict]:
    # Each repeat predicts on a row count not predicted before: len(x) - 1 - 977 repeat.
    if repeats < 1 or rows - 1 - 977 * (repeats - 1) < 1:
        raise ValueError(
            f"--versus-sklearn needs --repeats >= 1 and --rows > 977 (--repeats - 1) + 1 (each "
            f"repeat predicts on a new row count); got --rows {rows}, --repeats {repeats}"
        )
    x, y = versus_data(rows)
    records = []
    for m in components:
        record = versus_times(m, x, y, repeats)
        record["peak_memory_bytes"] = versus_memory(m, rows)
        record["peak_memory rfjax/sklearn"] = (
            record["peak_memory_bytes"]["rfjax"] / record["peak_memory_bytes"]["sklearn"]
        )
        records.append(record)
        _print_versus(record)
        save_json(
            os.path.join(out, "versus_sklearn.json"),
            {"jax": jax.__version__, "cpus": os.cpu_count(), "records": records},
            settings={"components": list(components), "rows": rows, "repeats": repeats},
        )
    return records


def _print_versus(record: dict) -> None:
    print(
        f"m = {record['m']}, {record['rows']} rows, {record['repeats']} repeats; load average "
        f"{record['load_average_before']} before, {record['load_average_after']} after; "
        f"training accuracy {record['accuracy']}"
    )
    for name, seconds in record["median_s"].items():
        print(f"  {name:30s} {seconds:8.2f} s (median)")
    for name, ratio in record["ratios"].items():
        print(f"  {name:30s} {ratio['median']:6.2f} [{ratio['q25']:.2f}, {ratio['q75']:.2f}]")
    peaks = record["peak_memory_bytes"]
    print(
        f"  peak memory above start: rfjax {peaks['rfjax'] / 2**20:.0f} MiB, scikit-learn "
        f"{peaks['sklearn'] / 2**20:.0f} MiB, ratio {record['peak_memory rfjax/sklearn']:.3f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--components",
        type=int,
        nargs="*",
        default=None,
        help="default 1024 2048 4096 (--versus-sklearn: 1024 4096)",
    )
    parser.add_argument("--rfjax-only-components", type=int, nargs="*", default=[8192])
    parser.add_argument("--stream-rows", type=int, nargs="*", default=[10**5, 10**6, 10**7])
    parser.add_argument(
        "--methods",
        nargs="*",
        choices=METHODS,
        default=list(METHODS),
        help="the Fashion-MNIST methods to run, in this order (default: all)",
    )
    parser.add_argument("--out", default="benchmarks/results/ridge")
    parser.add_argument("--table", action="store_true", help="only write ridge.md from ridge.jsonl")
    parser.add_argument("--versus-sklearn", action="store_true", help="issue 46's figure")
    parser.add_argument("--rows", type=int, default=200_000, help="--versus-sklearn rows")
    parser.add_argument("--repeats", type=int, default=3, help="--versus-sklearn repeats")
    parser.add_argument("--memory-probe", nargs=2, metavar=("NAME", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        versus_memory_probe(args.memory_probe[0], int(args.memory_probe[1]), args.rows)
        return
    if args.versus_sklearn:
        os.makedirs(args.out, exist_ok=True)
        components = [1024, 4096] if args.components is None else args.components
        versus_sklearn(components, args.rows, args.repeats, args.out)
        return
    if args.components is None:
        args.components = [1024, 2048, 4096]
    if args.table:
        with open(os.path.join(args.out, "ridge.md"), "w") as handle:
            handle.write(table(args.out))
        return
    os.makedirs(args.out, exist_ok=True)
    write(args.out, {"jax": jax.__version__, "devices": str(jax.devices()), "cpus": os.cpu_count()})
    if args.stream_rows:
        stream_rows(args.stream_rows, args.out)
    if args.components or args.rfjax_only_components:
        fashion_mnist_rows(args.components, args.rfjax_only_components, args.out, args.methods)
    with open(os.path.join(args.out, "ridge.md"), "w") as handle:
        handle.write(table(args.out))


if __name__ == "__main__":
    main()
