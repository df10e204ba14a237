"""Speed of ``rfjax.ops.fwht`` on a GPU against a device copy (``python -m benchmarks.fwht_gpu``).

For batches of 2^24 elements (rows x n) at every n = 2^6 ... 2^15, in float32 and bfloat16, timed
interleaved in one run on the default JAX device. Each sample dispatches 50 calls back to back
and waits for the last (``benchmarks.timing.time_streamed``): a copy of 2^24 float32 entries
takes about 30 us on an H100/H200, the same order as a host's dispatch, so one blocked call per
sample would time the host. Every implementation that runs on the device: each compiled backend
of ``rfjax.ops.fwht_backends()`` that compiles for the device's compute capability and takes
the length and dtype (labelled by its name, ``"xla"`` as ``xla_butterfly``), today:

* ``mosaic_gpu``: the Pallas Mosaic GPU kernel (sm90+, 16 <= n <= 2^14);
* ``pallas_triton``: the Pallas Triton kernel (sm80+, n <= 8192; JAX deprecated its Triton
  backend, but it still compiles on sm90, where ``"auto"`` picks it for bfloat16 n <= 4096);
* ``matmul``: Kronecker factors of at most 128 as dense contractions (``Precision.HIGHEST`` for
  float32);
* ``xla_butterfly``: ``implementation="xla"``, the radix-2 butterfly in plain XLA;
* ``auto``: what ``implementation="auto"`` resolves to on this device for this case;
* ``copy``: ``jit(x + 0)``, one read and one write of the array: the memory-bandwidth floor.

Every timed kernel is first checked against the XLA butterfly on the same input (max error over
the largest entry, reported; a kernel that disagrees beyond 2^-6 relative in bfloat16 or 1e-5 in
float32 is reported as failed and not timed; one that does not compile is reported with its
error). The programs of one case are compiled in parallel threads. Ratios: each implementation
over ``copy``; target (issue 34): the best implementation <= 1.2x the copy for n <= 8192 (<= 1.8
above), and ``"auto"`` the fastest measured. GB/s counts one read and one write of the array.
The JSON goes to ``--json`` after every case (a run cut short keeps what it measured).

Issue 46, point 5 (float32 on an sm90+ GPU, ``mosaic_gpu`` <= 1.2x ``copy`` for n <= 8192), alone:

  python -m benchmarks.fwht_gpu --dtypes float32 --sizes 64 128 256 512 1024 2048 4096 8192 \
      --json benchmarks/gpu_runs/<date>-<device>/fwht_gpu.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import save_json, time_streamed
from rfjax.ops import fwht, fwht_backend, fwht_backends, resolve_fwht

SIZES = tuple(1 << k for k in range(6, 16))
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


# Labels of the JSON for backends whose label is not their name (the committed runs use them).
LABELS = {"xla": "xla_butterfly"}


def implementations(n: int, dtype: str, capability) -> dict[str, str]:
    """Label -> ``implementation=`` of every compiled backend that takes this case on this
    device (``rfjax.ops.fwht_backends``: the CUDA kernels that compile for its capability and
    take n and dtype, and those that run on every platform), and ``"auto"``."""
    chosen = {}
    for name in fwht_backends(platform="cuda"):
        backend = fwht_backend(name)
        compiles = backend.min_capability is None or (
            capability is not None and capability >= backend.min_capability
        )
        if backend.interprets is None and compiles and backend.supports(n, dtype):
            chosen[LABELS.get(name, name)] = name
    return chosen | {"auto": "auto"}


def _check(fn, x, reference) -> float:
    y = np.asarray(jnp.asarray(fn(x), jnp.float32), np.float64)
    ref = np.asarray(jnp.asarray(reference, jnp.float32), np.float64)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def _compile(implementation: str, x: jax.Array):
    """The compiled transform, or the error that stopped it (one per thread)."""
    try:
        return jax.jit(lambda v: fwht(v, implementation=implementation)).lower(x).compile()
    except Exception as error:  # a kernel that does not compile: report, go on
        return f"{type(error).__name__}: {str(error)[:400]}"


def measure_case(x: jax.Array, n: int, dtype: str, capability, calls: int, repeats: int) -> dict:
    """Checks and times every implementation on ``x`` (rows x n) against a copy."""
    reference = jax.jit(lambda v: fwht(v, implementation="xla"))(x)
    chosen = implementations(n, dtype, capability)
    with concurrent.futures.ThreadPoolExecutor(len(chosen)) as pool:
        compiled = dict(
            zip(chosen, pool.map(lambda i: _compile(i, x), chosen.values()), strict=True)
        )
    functions, errors, failed = {}, {}, {}
    for label, fn in compiled.items():
        if isinstance(fn, str):
            failed[label] = fn
            continue
        try:
            errors[label] = _check(fn, x, reference)
        except Exception as error:  # compiled but failed at run time
            failed[label] = f"{type(error).__name__}: {str(error)[:400]}"
            continue
        if errors[label] > TOLERANCE[dtype]:
            failed[label] = f"max relative error {errors[label]:.3g}"
            continue
        functions[label] = lambda fn=fn, x=x: fn(x)
    copy = jax.jit(lambda v: v + jnp.zeros((), v.dtype))
    functions["copy"] = lambda copy=copy, x=x: copy(x)
    timings = time_streamed(functions, calls=calls, repeats=repeats)
    nbytes = 2 * x.nbytes
    row = {
        name: {"median_ms": 1e3 * t["median_s"], "gb_per_s": nbytes / t["median_s"] / 1e9}
        | {key.replace("_s", "_ms"): 1e3 * t[key] for key in ("min_s", "q25_s", "q75_s")}
        for name, t in timings.items()
    }
    copy_ms = row["copy"]["median_ms"]
    ratios = {f"{name}/copy": t["median_ms"] / copy_ms for name, t in row.items()}
    kernels = [name for name in row if name not in ("copy", "auto")]
    best = min(kernels, key=lambda name: row[name]["median_ms"])
    target = TARGET_RATIO[n <= 8192]
    return {
        "rows": x.shape[0],
        "auto_resolves_to": resolve_fwht("auto", "cuda", n=n, dtype=x.dtype, capability=capability),
        "timings": row,
        "ratios": ratios,
        "max_relative_error_vs_butterfly": errors,
        "failed": failed,
        "best": best,
        "target_ratio": target,
        "target_met": ratios[f"{best}/copy"] <= target,
        "auto_target_met": "auto" in row and ratios["auto/copy"] <= target,
    }


def run(total: int, sizes, dtypes, calls: int, repeats: int, json_path=None, budget_s=None):
    started = time.monotonic()
    settings = {"total": total, "sizes": sizes, "dtypes": dtypes, "calls": calls}
    settings |= {"repeats": repeats, "budget_s": budget_s}
    capability = compute_capability()
    rng = np.random.default_rng(0)
    base = rng.standard_normal(total, dtype=np.float32)
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "device": str(device.device_kind),
        "compute_capability": None if capability is None else ".".join(map(str, capability)),
        "jax": jax.__version__,
        "total_elements": total,
        "timing": f"time_streamed: median over {repeats} samples of {calls} back-to-back calls",
        "results": {},
        "not_measured": [],
    }
    for dtype in dtypes:
        for n in sizes:
            case = f"{dtype} n={n}"
            if budget_s is not None and time.monotonic() - started > budget_s:
                report["not_measured"].append(case)
                continue
            x = jnp.asarray(base.reshape(total // n, n), dtype=dtype)
            report["results"][case] = measure_case(x, n, dtype, capability, calls, repeats)
            print(f"  {case} done ({time.monotonic() - started:.0f} s)", flush=True)
            _write(report, json_path, settings)
    _write(report, json_path, settings)  # with the cases the budget left out
    return report


def _write(report: dict, json_path: str | None, settings: dict) -> None:
    """The report so far to ``json_path`` (atomically: a step cut short by its time limit
    leaves the last whole one), with the run's ``settings`` and load (``save_json``)."""
    if json_path:
        save_json(json_path, report, settings=settings)


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
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=None, help="start no case after this")
    parser.add_argument("--log2-total", type=int, default=24)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.fwht_gpu needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    report = run(
        1 << args.log2_total,
        tuple(args.sizes),
        tuple(args.dtypes),
        args.calls,
        args.repeats,
        args.json,
        args.budget_s,
    )
    _print(report)


if __name__ == "__main__":
    main()
