"""Everything a GPU session should run, in one command (``python -m benchmarks.gpu_run``).

  python -m benchmarks.gpu_run [--out DIR] [--skip-tests] [--quick]

Writes into ``DIR`` (default ``benchmarks/gpu_runs/<date>-<device>``):

* ``environment.json``: JAX version, device kind and compute capability, ``nvidia-smi`` output;
* ``pytest.log``: the whole test suite on the GPU (the compiled ``pallas``/``mosaic_gpu``
  parameters run there instead of being skipped);
* ``fwht_gpu.json``/``.txt``: ``benchmarks.fwht_gpu`` (every n = 2^4 ... 2^15, float32 and
  bfloat16, ratios to a device copy, the matmul path beside the kernels);
* ``attention_gpu.json``/``.txt``: ``benchmarks.attention_gpu`` (FAVOR against cuDNN flash
  attention, T = 1k ... 64k, bfloat16 and float32, forward and forward + backward).

Each step runs in its own process; a failing step is recorded (``steps.json``) and the others
still run. ``--quick`` shortens the benchmarks (fewer repeats, T <= 8k) for a first look. Commit
the directory and summarise it in a README there, as ``benchmarks/gpu_runs/2026-11-22-h100``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import shutil
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _device_slug() -> str:
    kind = jax.devices()[0].device_kind
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def _environment() -> dict:
    device = jax.devices()[0]
    info = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "compute_capability": getattr(device, "compute_capability", None),
        "device_count": jax.device_count(),
    }
    if shutil.which("nvidia-smi"):
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi"], capture_output=True, text=True, check=False
        ).stdout
    return info


def _step(name: str, command: list[str], log: pathlib.Path) -> dict:
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = datetime.datetime.now()
    with open(log, "w") as out:
        result = subprocess.run(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    seconds = (datetime.datetime.now() - started).total_seconds()
    print(f"   exit {result.returncode} after {seconds:.0f} s -> {log}", flush=True)
    return {"command": command, "returncode": result.returncode, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=str, default=None)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.gpu_run needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "gpu_runs" / f"{today}-{_device_slug()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "environment.json").write_text(json.dumps(_environment(), indent=2))
    python = sys.executable
    quick_fwht = ["--repeats", "10"] if args.quick else []
    quick_attention = ["--repeats", "5", "--lengths", "1024", "2048", "4096", "8192"]
    steps = {}
    if not args.skip_tests:
        steps["pytest"] = _step(
            "test suite", [python, "-m", "pytest", "-q", "-ra"], out / "pytest.log"
        )
    steps["fwht_gpu"] = _step(
        "fwht benchmark",
        [python, "-m", "benchmarks.fwht_gpu", "--json", str(out / "fwht_gpu.json"), *quick_fwht],
        out / "fwht_gpu.txt",
    )
    steps["attention_gpu"] = _step(
        "attention benchmark",
        [python, "-m", "benchmarks.attention_gpu", "--json", str(out / "attention_gpu.json")]
        + (quick_attention if args.quick else []),
        out / "attention_gpu.txt",
    )
    (out / "steps.json").write_text(json.dumps(steps, indent=2))
    print(f"done: {out}")


if __name__ == "__main__":
    main()
