"""Everything a GPU session should run, in one command (``python -m benchmarks.gpu_run``).

  python -m benchmarks.gpu_run [--out DIR] [--skip-tests] [--quick] [--minutes M]

Writes into ``DIR`` (default ``benchmarks/gpu_runs/<date>-<device>``), at most seven files:

* ``environment.json``: JAX version, device kind and compute capability, ``nvidia-smi`` output;
* ``pytest.log``: the GPU-marked tests (``tests/test_ops.py`` with ``-k`` on the compiled
  kernels: ``mosaic_gpu``, ``pallas`` (Triton), ``matmul``, ``auto``, ``hd_chain``), which run on
  the device instead of being skipped (``tests/test_pallas_kernels.py`` is the CPU simulators');
* ``fwht_gpu.json``: ``benchmarks.fwht_gpu`` (n = 2^6 ... 2^15, float32 and bfloat16, every
  implementation as a ratio to a device copy);
* ``attention_gpu.json``: ``benchmarks.attention_gpu`` (FAVOR against cuDNN flash attention, XLA
  exact attention and flash-linear-attention, T = 1k ... 64k, B = 1 and 8, with the roofline and a
  profile of causal FAVOR);
* ``run.log``: the benchmarks' printed tables; ``steps.json``: each step's exit status and time.

Each step runs in its own process under a time limit (``--minutes`` in all, shared in fixed
proportions; a benchmark starts no new case past its share and writes its JSON after every case,
so a step cut short keeps what it measured); a failing step is recorded and the others still run.
``--quick`` shortens the benchmarks for a first look. Commit the directory with a README, as
``benchmarks/gpu_runs/2026-11-22-h100``. With a device lent for a few minutes, carry
flash-linear-attention's ``fla-core`` wheel (pure Python) and set
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (JAX and PyTorch share the device).
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


def _step(name: str, command: list[str], log: pathlib.Path, timeout_s: float) -> dict:
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = datetime.datetime.now()
    with open(log, "a") as out:
        try:
            result = subprocess.run(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
            )
            code: int | str = result.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout_s:.0f} s"
    seconds = (datetime.datetime.now() - started).total_seconds()
    print(f"   exit {code} after {seconds:.0f} s -> {log}", flush=True)
    return {"command": command, "returncode": code, "seconds": seconds}


GPU_TESTS = ["tests/test_ops.py"]
GPU_TEST_SELECTION = "(mosaic_gpu or pallas or matmul or auto or hd_chain) and not interpret"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=str, default=None)
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--minutes", type=float, default=30.0, help="time for all the steps")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.gpu_run needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "gpu_runs" / f"{today}-{_device_slug()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "environment.json").write_text(json.dumps(_environment(), indent=2))
    python, seconds = sys.executable, 60 * args.minutes
    steps = {}
    if not args.skip_tests:
        command = [python, "-m", "pytest", "-v", "-ra", "-n", "12", *GPU_TESTS]
        command += ["-k", GPU_TEST_SELECTION]
        steps["pytest"] = _step("GPU tests", command, out / "pytest.log", 0.25 * seconds)
    fwht = [python, "-m", "benchmarks.fwht_gpu", "--json", str(out / "fwht_gpu.json")]
    fwht += ["--budget-s", f"{0.15 * seconds:.0f}"] + (["--repeats", "3"] if args.quick else [])
    steps["fwht_gpu"] = _step("fwht benchmark", fwht, out / "run.log", 0.25 * seconds)
    attention = [
        python,
        "-m",
        "benchmarks.attention_gpu",
        "--json",
        str(out / "attention_gpu.json"),
    ]
    attention += ["--budget-s", f"{0.3 * seconds:.0f}", "--profile", "8", "16384"]
    attention += ["--lengths", "1024", "4096", "16384"] if args.quick else []
    steps["attention_gpu"] = _step(
        "attention benchmark", attention, out / "run.log", 0.45 * seconds
    )
    (out / "steps.json").write_text(json.dumps(steps, indent=2))
    print(f"done: {out}")


if __name__ == "__main__":
    main()
