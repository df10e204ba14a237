"""Speed of ``rfjax.ops.fwht`` on a GPU against a device copy (``python -m benchmarks.fwht_gpu``).

For batches of 2^26 elements (rows x n) at every n = 2^4 ... 2^15, in float32 and bfloat16, timed
interleaved in one run (``benchmarks.timing.time_interleaved``, median over repeats) on the
default JAX device:

* ``mosaic_gpu``: the Pallas Mosaic GPU kernel (sm90+, 16 <= n <= 2^14; ``implementation=
  "mosaic_gpu"``);
* ``pallas_triton``: the Pallas Triton kernel (n <= 8192), on sm80-sm89 only unless
  ``--triton`` (JAX deprecated its Triton backend; rfjax keeps this kernel for those GPUs);
* ``matmul``: ``implementation="matmul"`` (Kronecker factors of at most 128, plain XLA,
  ``Precision.HIGHEST`` for float32): what ``"auto"`` picks on GPUs today;
* ``xla_butterfly``: ``implementation="xla"``, the radix-2 butterfly in plain XLA;
* ``copy``: ``jit(x + 0)``, one read and one write of the array: the memory-bandwidth limit.

Every timed kernel is first checked against the XLA butterfly on the same input (max error over
the largest entry, reported; a kernel that disagrees beyond 2^-6 relative in bfloat16 or 1e-5 in
float32 is reported as failed and not timed). Ratios: each implementation over ``copy`` (target
from the issue: the best rfjax kernel <= 1.2 for n <= 8192 and <= 1.8 above, the best published
CUDA kernel's figures on an A100). GB/s counts one read and one write of the array. The JSON
goes to ``--json`` (``benchmarks.gpu_run`` puts it under ``benchmarks/gpu_runs/``).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import time_interleaved
from rfjax.ops import _fwht_mosaic_gpu, fwht

SIZES = tuple(1 << k for k in range(4, 16))
DTYPES = ("float32", "bfloat16")
TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-6}
TARGET_RATIO = {True: 1.2, False: 1.8}  # n <= 8192, n > 8192


def compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the default device if it is an NVIDIA GPU, else None."""
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or capability is None:
        return None
    major, minor = str(capability).split(".")[:2]
    return int(major), int(minor)


def implementations(n: int, capability, triton: bool) -> dict[str, str]:
    """Label -> ``implementation=`` of the kernels that take this case on this device."""
    chosen = {"matmul": "matmul", "xla_butterfly": "xla"}
    sm9x = capability is not None and capability >= (9, 0)
    if sm9x and _fwht_mosaic_gpu.MIN_N <= n <= _fwht_mosaic_gpu.MAX_N:
        chosen["mosaic_gpu"] = "mosaic_gpu"
    sm8x = capability is not None and (8, 0) <= capability < (9, 0)
    if (sm8x or triton) and n <= 8192:
        chosen["pallas_triton"] = "pallas"
    return chosen


def _check(fn, x, reference, dtype: str) -> float:
    y = np.asarray(jnp.asarray(fn(x), jnp.float32), np.float64)
    ref = np.asarray(jnp.asarray(reference, jnp.float32), np.float64)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def run(total: int, sizes, dtypes, repeats: int, triton: bool) -> dict:
    capability = compute_capability()
    rng = np.random.default_rng(0)
    base = rng.standard_normal(total, dtype=np.float32)
    results = {}
    for dtype in dtypes:
        for n in sizes:
            x = jnp.asarray(base.reshape(total // n, n), dtype=dtype)
            reference = jax.jit(lambda v: fwht(v, implementation="xla"))(x)
            functions, errors, failed = {}, {}, {}
            for label, implementation in implementations(n, capability, triton).items():
                fn = jax.jit(lambda v, i=implementation: fwht(v, implementation=i))
                try:
                    errors[label] = _check(fn, x, reference, dtype)
                except Exception as error:  # a kernel that does not compile: report, go on
                    failed[label] = f"{type(error).__name__}: {str(error)[:300]}"
                    continue
                if errors[label] > TOLERANCE[dtype]:
                    failed[label] = f"max relative error {errors[label]:.3g}"
                    continue
                functions[label] = lambda fn=fn, x=x: fn(x)
            copy = jax.jit(lambda v: v + jnp.zeros((), v.dtype))
            functions["copy"] = lambda copy=copy, x=x: copy(x)
            timings = time_interleaved(functions, repeats=repeats)
            nbytes = 2 * x.nbytes
            row = {
                name: {"median_ms": 1e3 * t["median_s"], "gb_per_s": nbytes / t["median_s"] / 1e9}
                for name, t in timings.items()
            }
            copy_ms = row["copy"]["median_ms"]
            ratios = {f"{name}/copy": t["median_ms"] / copy_ms for name, t in row.items()}
            kernels = [name for name in row if name not in ("copy", "xla_butterfly")]
            best = min(kernels, key=lambda name: row[name]["median_ms"]) if kernels else None
            results[f"{dtype} n={n}"] = {
                "rows": total // n,
                "timings": row,
                "ratios": ratios,
                "max_relative_error_vs_butterfly": errors,
                "failed": failed,
                "best": best,
                "target_ratio": TARGET_RATIO[n <= 8192],
                "target_met": None
                if best is None
                else ratios[f"{best}/copy"] <= TARGET_RATIO[n <= 8192],
            }
    device = jax.devices()[0]
    return {
        "device": str(device.device_kind),
        "compute_capability": None if capability is None else ".".join(map(str, capability)),
        "jax": jax.__version__,
        "total_elements": total,
        "results": results,
    }


def _print(report: dict) -> None:
    print(
        f"fwht on {report['device']} (sm {report['compute_capability']}), jax {report['jax']}, "
        f"{report['total_elements']} elements per batch; median ms (GB/s), ratio to a copy"
    )
    for case, res in report["results"].items():
        ratios = res["ratios"]
        cells = "  ".join(
            f"{name} {t['median_ms']:.3f} ({t['gb_per_s']:.0f}) x{ratios[name + '/copy']:.2f}"
            for name, t in res["timings"].items()
        )
        verdict = f"best {res['best']}, target <= {res['target_ratio']}: {res['target_met']}"
        print(f"{case:18s} {cells}\n{'':18s} {verdict}  failed: {res['failed'] or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--log2-total", type=int, default=26)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--triton", action="store_true", help="time Triton on sm90+ too")
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.fwht_gpu needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    report = run(
        1 << args.log2_total, tuple(args.sizes), tuple(args.dtypes), args.repeats, args.triton
    )
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
