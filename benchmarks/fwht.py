"""Speed and memory of ``rfjax.ops.fwht`` on CPU against its peers (``python -m benchmarks.fwht``).

For batches of 2^22 elements (rows x n, n = 2^4 ... 2^15; float32, or ``--dtype bfloat16``), timed
interleaved in one run (``benchmarks.timing.time_interleaved``, median over repeats):

* ``rfjax``: ``jit(fwht(x, implementation="cpu"))``, the C++ FFI kernel, using the XLA intra-op
  thread pool. Its output aliases its input, so with a non-donated argument XLA first copies the
  argument and the kernel then works in place on the copy; ``rfjax_inplace``: the same with the
  argument donated (``donate_argnums=0``), rebuilt from the host array outside the timed region,
  as the in-place peers are; ``rfjax_1thread``: the kernel on the calling thread only;
* ``fht_cpu_t1`` / ``fht_cpu_tN``: the PyPI package ``fht-cpu`` (``fht_2d_f32_rows(x, t)``,
  in place, ``t`` threads: 1 as in the issue, and all cores). Its buffer is restored from the
  input by a copy before each call, outside the timed region (so it starts cache-warm, and in
  place its working set is half of an out-of-place transform's);
* ``ffht``: the PyPI package ``ffht-unofficial`` (``ffht.fht_(x)``, in place, 1 thread, restored
  the same way) when it is installed (its build needs numpy, pybind11 and setuptools present and
  ``pip install --no-build-isolation ffht-unofficial``);
* ``matmul``: ``jit(fwht(x, implementation="matmul"))``, Kronecker factors of at most 128 as
  small dense contractions at ``Precision.HIGHEST``;
* ``xla_butterfly``: ``jit(fwht(x, implementation="xla"))``, the pure-XLA radix-2 butterfly;
* ``copy_numpy`` / ``copy_xla``: ``np.copyto`` into a preallocated array and ``jit(x + 0)``
  (forced copy), the memory-bandwidth limit for a read + write of the array.

GB/s counts one read and one write of the array. Ratios: every implementation over ``copy_xla``
(1.0 is the bandwidth limit), ``xla_butterfly / rfjax`` and ``matmul / rfjax`` (how much the C++
kernel saves; the choice of ``implementation="auto"`` on CPU), ``rfjax / fht_cpu`` and
``rfjax_inplace / fht_cpu`` (in place against in place; target <= 1.25 for n >= 256). Memory:
XLA's compiled memory analysis of the jitted op (temporaries beyond the output should be ~0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import time_interleaved
from rfjax.ops import _fwht_cpu, fwht

SIZES = tuple(1 << k for k in range(4, 16))
TOTAL = 1 << 22


def _optional_peers():
    try:
        import fht_cpu
    except ImportError:
        fht_cpu = None
    try:
        import ffht
    except ImportError:
        ffht = None
    return fht_cpu, ffht


def _time_with_setup(functions, setups, *, repeats: int, warmup: int = 3):
    """``time_interleaved``, except that ``setups[name]()`` runs untimed before each call.

    The in-place peers get their input restored this way (outside the timed region); the others
    go straight to ``benchmarks.timing.time_interleaved``.
    """
    if not setups:
        return time_interleaved(functions, repeats=repeats, warmup=warmup)
    for name, fn in functions.items():
        for _ in range(warmup):
            setups.get(name, lambda: None)()
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            setups.get(name, lambda: None)()
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts)} for name, ts in samples.items()
    }


def _memory(fn, x) -> dict[str, int]:
    analysis = jax.jit(fn).lower(x).compile().memory_analysis()
    if analysis is None:
        return {}
    return {
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
    }


def _call_held(fn: Callable[[Any], Any], holder: list) -> Any:
    return fn(holder[0])


def _refill_held(holder: list, host: np.ndarray) -> None:
    holder[0] = jax.block_until_ready(jnp.asarray(host))


def run(
    total: int = TOTAL,
    sizes=SIZES,
    repeats: int = 30,
    threads: int | None = None,
    dtype: str = "float32",
) -> dict:
    fht_cpu, ffht = _optional_peers()
    threads = threads or os.cpu_count() or 1
    if not _fwht_cpu.is_available():
        raise SystemExit("the C++ kernel is not built: pip install -e . with a C++17 compiler")
    rng = np.random.default_rng(0)
    base = np.asarray(jnp.asarray(rng.standard_normal(total, dtype=np.float32), dtype))
    nbytes = 2 * base.nbytes
    results = {}
    for n in sizes:
        rows = total // n
        host = base.reshape(rows, n)
        x = jnp.asarray(host)

        ours = jax.jit(lambda v: fwht(v, implementation="cpu"))
        ours_1t = jax.jit(lambda v: _fwht_cpu.fwht_rows(v, False, max_threads=0))
        naive = jax.jit(lambda v: fwht(v, implementation="xla"))
        matmul = jax.jit(lambda v: fwht(v, implementation="matmul"))
        xla_copy = jax.jit(lambda v: v + 0.0)
        dst = np.empty_like(host)
        functions: dict[str, Callable[[], Any]] = {
            "rfjax": partial(ours, x),
            "rfjax_1thread": partial(ours_1t, x),
            "xla_butterfly": partial(naive, x),
            "matmul": partial(matmul, x),
            "copy_numpy": partial(np.copyto, dst, host),
            "copy_xla": partial(xla_copy, x),
        }
        # In place, like the in-place peers: a donated argument, rebuilt outside the timed region.
        donated = jax.jit(lambda v: fwht(v, implementation="cpu"), donate_argnums=0)
        holder = [jnp.asarray(host)]
        functions["rfjax_inplace"] = partial(_call_held, donated, holder)
        setups: dict[str, Callable[[], Any]] = {
            "rfjax_inplace": partial(_refill_held, holder, host)
        }
        if fht_cpu is not None and dtype == "float32":
            buf1, bufn = host.copy(), host.copy()
            functions["fht_cpu_t1"] = partial(fht_cpu.fht_2d_f32_rows, buf1, 1)
            setups["fht_cpu_t1"] = partial(np.copyto, buf1, host)
            if threads > 1:
                name = f"fht_cpu_t{threads}"
                functions[name] = partial(fht_cpu.fht_2d_f32_rows, bufn, threads)
                setups[name] = partial(np.copyto, bufn, host)
        if ffht is not None and dtype == "float32":
            bufx = host.copy()
            functions["ffht"] = partial(ffht.fht_, bufx)
            setups["ffht"] = partial(np.copyto, bufx, host)
        timings = _time_with_setup(functions, setups, repeats=repeats)
        row = {}
        for name, t in timings.items():
            row[name] = {
                "median_ms": 1e3 * t["median_s"],
                "min_ms": 1e3 * t["min_s"],
                "gb_per_s": nbytes / t["median_s"] / 1e9,
            }
        ours_ms = row["rfjax"]["median_ms"]
        copy_ms = row["copy_xla"]["median_ms"]
        ratios = {f"{name}/copy_xla": t["median_ms"] / copy_ms for name, t in row.items()}
        ratios["xla_butterfly/rfjax"] = row["xla_butterfly"]["median_ms"] / ours_ms
        ratios["matmul/rfjax"] = row["matmul"]["median_ms"] / ours_ms
        ratios["matmul/xla_butterfly"] = (
            row["matmul"]["median_ms"] / row["xla_butterfly"]["median_ms"]
        )
        for name in row:
            if name.startswith(("fht_cpu", "ffht")):
                ratios[f"rfjax/{name}"] = ours_ms / row[name]["median_ms"]
        # the same ratios on the fastest repeat (less sensitive to other load on the machine)
        best = row["rfjax"]["min_ms"]
        ratios["xla_butterfly/rfjax (min)"] = row["xla_butterfly"]["min_ms"] / best
        for name in row:
            if name.startswith("fht_cpu"):
                ratios[f"rfjax/{name} (min)"] = best / row[name]["min_ms"]
        for name in row:
            if name.startswith("fht_cpu"):
                ratios[f"rfjax_inplace/{name}"] = (
                    row["rfjax_inplace"]["median_ms"] / row[name]["median_ms"]
                )
        ratios["rfjax_1thread/fht_cpu_t1"] = (
            row["rfjax_1thread"]["median_ms"] / row["fht_cpu_t1"]["median_ms"]
            if "fht_cpu_t1" in row
            else float("nan")
        )
        results[n] = {
            "rows": rows,
            "timings": row,
            "ratios": ratios,
            "memory_rfjax": _memory(lambda v: fwht(v, implementation="cpu"), x),
            "memory_xla_butterfly": _memory(lambda v: fwht(v, implementation="xla"), x),
        }
    return {
        "total_elements": total,
        "dtype": dtype,
        "threads": threads,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "kernel": _fwht_cpu.library_path(),
        "kernel_isa": _fwht_cpu.isa(),
        "results": results,
    }


def _print(report: dict) -> None:
    total = report["total_elements"]
    print(
        f"fwht {report['dtype']}, {total} elements per batch (2^{total.bit_length() - 1}), "
        f"{report['cpu_count']} CPUs, jax {report['jax']}, kernel ISA {report['kernel_isa']}; "
        "median ms (GB/s, read + write)"
    )
    for n, res in report["results"].items():
        print(f"\nn = {n} ({res['rows']} rows)")
        for name, t in res["timings"].items():
            print(
                f"  {name:16s} {t['median_ms']:9.3f} ms  {t['gb_per_s']:7.1f} GB/s"
                f"   (min {t['min_ms']:.3f} ms)"
            )
        for name, ratio in res["ratios"].items():
            print(f"  {name:28s} {ratio:7.2f}")
        mem = res["memory_rfjax"]
        if mem:
            print(
                f"  memory (rfjax): temp {mem['temp_bytes']} B, output {mem['output_bytes']} B; "
                f"xla_butterfly temp {res['memory_xla_butterfly'].get('temp_bytes')} B"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--log2-total", type=int, default=22)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args()
    report = run(1 << args.log2_total, tuple(args.sizes), args.repeats, dtype=args.dtype)
    _print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
