"""Speed and memory of ``rfjax.ops.fwht`` on CPU against its peers (``python -m benchmarks.fwht``).

  python -m benchmarks.fwht [--dtype float32|float64|bfloat16] [--sizes 64 1024 65536]
      [--repeats 30] [--baseline-lib PATH] [--json PATH]

For batches of 2^22 elements (rows x n, n = 2^4 ... 2^16 by default; float32, float64 or
bfloat16), timed interleaved in one run (``benchmarks.timing.time_interleaved``: the contenders
take turns, repeat by repeat):

* ``rfjax``: ``jit(fwht(x, implementation="cpu"))`` on an argument that is not donated: the
  C++ FFI kernel, using the XLA intra-op thread pool, out of place (its first pass reads the
  argument and writes the fresh output; no copy of the argument first);
* ``rfjax_inplace``: the same with the argument donated (``donate_argnums=0``), so the kernel
  works in place; the argument is rebuilt from the host array outside the timed region, as the
  in-place peers' buffers are;
* ``rfjax_1thread``: the kernel on the calling thread only, out of place;
* ``baseline`` / ``baseline_inplace`` (``--baseline-lib PATH``): the same two calls through the
  handlers of another build of the library (e.g. the commit before a kernel change, built with
  ``python setup.py build_ext --inplace`` in a checkout of it), registered under other FFI names
  and called as that build called them (output aliased to the argument), so a kernel change is
  measured before and after in one run;
* ``fht_cpu_t1`` / ``fht_cpu_tN``: the PyPI package ``fht-cpu`` (``fht_2d_f32_rows`` /
  ``fht_2d_f64_rows(x, t)``, in place, ``t`` threads: 1, and all cores). Its buffer is restored
  from the input by a copy before each call, outside the timed region (so it starts cache-warm,
  and in place its working set is half of an out-of-place transform's);
* ``fht_cpu_out_t1`` / ``fht_cpu_out_tN``: its out-of-place call, ``fht_cpu.fht(x,
  inplace=False, num_threads=t)`` (a NumPy copy of x, transformed in place);
* ``ffht``: the PyPI package ``ffht-unofficial`` (``ffht.fht_(x)``, float32, in place, 1 thread,
  restored the same way) when it is installed (its build needs numpy, pybind11 and setuptools
  present and ``pip install --no-build-isolation ffht-unofficial``);
* ``matmul``: ``jit(fwht(x, implementation="matmul"))``, Kronecker factors of at most 128 as
  small dense contractions at ``Precision.HIGHEST``;
* ``xla_butterfly``: ``jit(fwht(x, implementation="xla"))``, the pure-XLA radix-2 butterfly;
* ``copy_numpy`` / ``copy_xla``: ``np.copyto`` into a preallocated array and ``jit(x + 0)``
  (a fresh output, as ``rfjax``'s), one read and one write of the array.

GB/s counts one read and one write of the array. Ratios are paired: repeat i of one contender
over repeat i of the other (taken back to back), median over the repeats
(``benchmarks.timing.paired_ratio``): every implementation over ``copy_xla``; ``rfjax /
fht_cpu_t*`` (out of place against in place), ``rfjax / fht_cpu_out_*`` (out of place against
out of place) and ``rfjax_inplace / fht_cpu_t*`` (in place against in place; targets of issue
46: out of place <= 1.2, in place <= 1.0); ``rfjax* / baseline*`` (a kernel change, before and
after); ``xla_butterfly / rfjax`` and ``matmul / rfjax`` (the choice of
``implementation="auto"`` on CPU). The machine's load
average is printed and stored before and after each n. Memory: XLA's compiled memory analysis
of the jitted op (temporaries beyond the output should be ~0). The JSON (``--json``; default
``benchmarks/results/fwht/<dtype>.json``) holds every sample.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import platform
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import load_average, paired_ratio, save_json, time_interleaved
from rfjax.ops import fwht, fwht_backend

SIZES = tuple(1 << k for k in range(4, 17))
TOTAL = 1 << 22
RESULTS = pathlib.Path("benchmarks/results/fwht")
DTYPES = ("float32", "float64", "bfloat16")


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


def register_baseline(path: str) -> dict[jnp.dtype, str]:
    """Registers the float32/float64 handlers of the library at ``path`` as FFI targets named
    ``rfjax_fwht_{f32,f64}_baseline``; returns dtype -> target name."""
    library = ctypes.CDLL(str(pathlib.Path(path).resolve()))
    targets = {}
    for dtype, symbol in ((jnp.float32, "RfjaxFwhtF32"), (jnp.float64, "RfjaxFwhtF64")):
        name = f"rfjax_fwht_{symbol[-3:].lower()}_baseline"
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), "cpu")
        targets[jnp.dtype(dtype)] = name
    return targets


def _baseline_call(target: str, x: jax.Array) -> jax.Array:
    """The transform through a baseline build's handler, called as the old code called it."""
    return jax.ffi.ffi_call(
        target, jax.ShapeDtypeStruct(x.shape, x.dtype), input_output_aliases={0: 0}
    )(x, normalize=np.bool_(False), max_threads=np.int64(-1))


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
    holder[0] = jax.block_until_ready(jnp.array(host, copy=True))


def _contenders(host: np.ndarray, threads: int, baseline: dict | None):
    """(functions, setups) of every contender for one batch ``host`` (rows x n)."""
    fht_cpu, ffht = _optional_peers()
    x = jnp.asarray(host)
    dtype = np.dtype(host.dtype).name
    ours = jax.jit(lambda v: fwht(v, implementation="cpu"))
    rows = fwht_backend("cpu").kernel()
    # Out of place, as fwht lowers an argument the caller keeps (in place, XLA copied it first).
    ours_1t = jax.jit(lambda v: rows(v, False, max_threads=0, in_place=False))
    naive = jax.jit(lambda v: fwht(v, implementation="xla"))
    matmul = jax.jit(lambda v: fwht(v, implementation="matmul"))
    xla_copy = jax.jit(lambda v: v + 0)
    dst = np.empty_like(host)
    functions: dict[str, Callable[[], Any]] = {
        "rfjax": partial(ours, x),
        "rfjax_1thread": partial(ours_1t, x),
        "xla_butterfly": partial(naive, x),
        "matmul": partial(matmul, x),
        "copy_numpy": partial(np.copyto, dst, host),
        "copy_xla": partial(xla_copy, x),
    }
    setups: dict[str, Callable[[], Any]] = {}

    def in_place(name: str, fn: Callable[[Any], Any]) -> None:
        # a donated argument, rebuilt outside the timed region
        holder = [jnp.array(host, copy=True)]
        functions[name] = partial(_call_held, jax.jit(fn, donate_argnums=0), holder)
        setups[name] = partial(_refill_held, holder, host)

    in_place("rfjax_inplace", lambda v: fwht(v, implementation="cpu"))
    if baseline is not None and jnp.dtype(host.dtype) in baseline:
        call = partial(_baseline_call, baseline[jnp.dtype(host.dtype)])
        functions["baseline"] = partial(jax.jit(call), x)
        in_place("baseline_inplace", call)
    peer = {"float32": "fht_2d_f32_rows", "float64": "fht_2d_f64_rows"}.get(dtype)
    if fht_cpu is not None and peer is not None:
        for count in sorted({1, threads}):
            buffer = host.copy()
            functions[f"fht_cpu_t{count}"] = partial(getattr(fht_cpu, peer), buffer, count)
            setups[f"fht_cpu_t{count}"] = partial(np.copyto, buffer, host)
            functions[f"fht_cpu_out_t{count}"] = partial(
                fht_cpu.fht, host, inplace=False, num_threads=count
            )
    if ffht is not None and dtype == "float32":
        buffer = host.copy()
        functions["ffht"] = partial(ffht.fht_, buffer)
        setups["ffht"] = partial(np.copyto, buffer, host)
    return functions, setups


# (numerator, denominator) pairs reported as paired ratios, when both were timed.
def _ratio_pairs(names: list[str]) -> list[tuple[str, str]]:
    peers = [n for n in names if n.startswith(("fht_cpu_t", "ffht"))]
    out_of_place_peers = [n for n in names if n.startswith("fht_cpu_out")]
    pairs = [(name, "copy_xla") for name in names if name != "copy_xla"]
    ours = ("rfjax", "rfjax_inplace", "rfjax_1thread")
    pairs += [(name, peer) for name in ours for peer in peers]
    pairs += [("rfjax", peer) for peer in out_of_place_peers]
    pairs += [("rfjax", "baseline"), ("rfjax_inplace", "baseline_inplace")]
    pairs += [("xla_butterfly", "rfjax"), ("matmul", "rfjax")]
    return [(a, b) for a, b in pairs if a in names and b in names]


def run(
    total: int = TOTAL,
    sizes=SIZES,
    repeats: int = 30,
    threads: int | None = None,
    dtype: str = "float32",
    baseline_lib: str | None = None,
) -> dict:
    threads = threads or os.cpu_count() or 1
    if not fwht_backend("cpu").available():
        raise SystemExit("the C++ kernel is not built: pip install -e . with a C++17 compiler")
    baseline = register_baseline(baseline_lib) if baseline_lib else None
    rng = np.random.default_rng(0)
    base = np.asarray(jnp.asarray(rng.standard_normal(total), dtype))
    nbytes = 2 * base.nbytes
    results = {}
    for n in sizes:
        host = base.reshape(total // n, n)
        load_before = load_average()
        functions, setups = _contenders(host, threads, baseline)
        timings = time_interleaved(functions, repeats=repeats, setups=setups)
        row = {
            name: {
                "median_ms": 1e3 * t["median_s"],
                "min_ms": 1e3 * t["min_s"],
                "gb_per_s": nbytes / t["median_s"] / 1e9,
                "samples_ms": [1e3 * s for s in t["samples_s"]],
            }
            for name, t in timings.items()
        }
        ratios = {
            f"{a}/{b}": paired_ratio(timings[a]["samples_s"], timings[b]["samples_s"])
            for a, b in _ratio_pairs(list(timings))
        }
        x = jnp.asarray(host)
        results[n] = {
            "rows": total // n,
            "timings": row,
            "ratios": ratios,
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "memory_rfjax": _memory(lambda v: fwht(v, implementation="cpu"), x),
            "memory_xla_butterfly": _memory(lambda v: fwht(v, implementation="xla"), x),
        }
    return {
        "total_elements": total,
        "dtype": dtype,
        "threads": threads,
        "repeats": repeats,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "kernel": fwht_backend("cpu").details()["library"],
        "kernel_isa": fwht_backend("cpu").details()["isa"],
        "baseline_lib": baseline_lib,
        "results": results,
    }


def _print(report: dict) -> None:
    total = report["total_elements"]
    print(
        f"fwht {report['dtype']}, {total} elements per batch (2^{total.bit_length() - 1}), "
        f"{report['cpu_count']} CPUs, jax {report['jax']}, kernel ISA {report['kernel_isa']}; "
        f"median ms (GB/s, read + write) over {report['repeats']} interleaved repeats"
    )
    for n, res in report["results"].items():
        print(
            f"\nn = {n} ({res['rows']} rows); load average {res['load_average_before']} before, "
            f"{res['load_average_after']} after"
        )
        for name, t in res["timings"].items():
            print(
                f"  {name:16s} {t['median_ms']:9.3f} ms  {t['gb_per_s']:7.1f} GB/s"
                f"   (min {t['min_ms']:.3f} ms)"
            )
        print("  paired ratios: median [quartiles]")
        for name, ratio in res["ratios"].items():
            print(f"  {name:32s} {ratio['median']:6.2f} [{ratio['q25']:.2f}, {ratio['q75']:.2f}]")
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
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument(
        "--baseline-lib", default=None, help="another build of the kernel library, timed beside"
    )
    parser.add_argument("--json", type=str, default=None, help="default: benchmarks/results/fwht")
    args = parser.parse_args()
    total = 1 << args.log2_total
    wrong = [n for n in args.sizes if n < 1 or n & (n - 1) or n > total]
    if wrong:  # a batch is rows x n of 2^log2-total elements (numpy's reshape error otherwise)
        parser.error(f"--sizes must be powers of two <= 2^--log2-total = {total}, got {wrong}")
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    report = run(
        total,
        tuple(args.sizes),
        args.repeats,
        dtype=args.dtype,
        baseline_lib=args.baseline_lib,
    )
    _print(report)
    path = pathlib.Path(args.json) if args.json else RESULTS / f"{args.dtype}.json"
    save_json(path, report, settings=vars(args))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
