"""Speed of ``rfjax.ops.fwht`` on a GPU against its peers (``python -m benchmarks.fwht_gpu``).

For batches of 2^26 elements (rows x n, n = 16 ... 8192) in float32 and bfloat16, timed
interleaved in one run (``benchmarks.timing.time_interleaved``, median over repeats), on the
default JAX device:

* ``pallas``: ``jit(fwht(x, implementation="pallas"))``, the Pallas (Triton) kernel;
* ``xla_butterfly``: ``jit(fwht(x, implementation="xla"))``, the pure-XLA radix-2 butterfly;
* ``matmul``: ``jit(x @ H)`` with the dense Hadamard matrix in the input dtype, at
  ``Precision.HIGHEST`` for float32 (what the kernel computes) and the default for bfloat16
  (cuBLAS on the tensor cores);
* ``copy``: ``jit(x + 0)``, one read and one write of the array: the memory-bandwidth limit.

GB/s counts one read and one write of the array. Ratios: ``xla_butterfly / pallas`` and
``matmul / pallas`` (> 1: the kernel is faster) and ``pallas / copy`` (1.0 would be the
bandwidth limit).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jax import lax

from benchmarks.timing import time_interleaved
from rfjax.ops import fwht

SIZES = (16, 64, 128, 256, 1024, 4096, 8192)
DTYPES = ("float32", "bfloat16")
PEERS = ("xla_butterfly", "matmul")


def _functions(x: jax.Array, n: int) -> dict:
    precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    h = jnp.asarray(scipy.linalg.hadamard(n), dtype=x.dtype)
    pallas = jax.jit(lambda v: fwht(v, implementation="pallas"))
    butterfly = jax.jit(lambda v: fwht(v, implementation="xla"))
    matmul = jax.jit(lambda v, h: jnp.matmul(v, h, precision=precision))
    copy = jax.jit(lambda v: v + jnp.zeros((), v.dtype))
    return {
        "pallas": lambda: pallas(x),
        "xla_butterfly": lambda: butterfly(x),
        "matmul": lambda: matmul(x, h),
        "copy": lambda: copy(x),
    }


def run(total: int, sizes, dtypes, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(total, dtype=np.float32)
    results = {}
    for dtype in dtypes:
        for n in sizes:
            x = jnp.asarray(base.reshape(total // n, n), dtype=dtype)
            timings = time_interleaved(_functions(x, n), repeats=repeats)
            nbytes = 2 * x.nbytes
            row = {
                name: {"median_ms": 1e3 * t["median_s"], "gb_per_s": nbytes / t["median_s"] / 1e9}
                for name, t in timings.items()
            }
            ours = row["pallas"]["median_ms"]
            ratios = {f"{peer}/pallas": row[peer]["median_ms"] / ours for peer in PEERS}
            ratios["pallas/copy"] = ours / row["copy"]["median_ms"]
            results[f"{dtype} n={n}"] = {"rows": total // n, "timings": row, "ratios": ratios}
    return {
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "total_elements": total,
        "results": results,
    }


def _print(report: dict) -> None:
    print(
        f"fwht on {report['device']}, jax {report['jax']}, {report['total_elements']} elements "
        "per batch; median ms (GB/s, read + write)"
    )
    for case, res in report["results"].items():
        timings = "  ".join(
            f"{name} {t['median_ms']:.3f} ({t['gb_per_s']:.0f})"
            for name, t in res["timings"].items()
        )
        ratios = "  ".join(f"{name} {r:.2f}" for name, r in res["ratios"].items())
        print(f"{case:18s} {timings}\n{'':18s} {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--log2-total", type=int, default=26)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.fwht_gpu needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    report = run(1 << args.log2_total, tuple(args.sizes), tuple(args.dtypes), args.repeats)
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
