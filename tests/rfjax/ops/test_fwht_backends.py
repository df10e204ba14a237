"""Tests of ``rfjax.ops._fwht_backends``: the table of ``fwht``'s backends and ``"auto"``.

The backends' numerics are checked by the generic tests of ``tests/rfjax/ops/test_fwht.py``
(parametrised from this table); here: that every entry names kernels that exist and limits its
check enforces, and that ``"auto"`` picks what the committed GPU runs measured fastest.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.fwht_gpu import LABELS
from rfjax.ops import _fwht_cpu, fwht_backend, fwht_backends, resolve_fwht
from rfjax.ops._fwht_backends import GPU_AUTO_SM90
from tests.support import ROOT

GPU_RUNS = [
    ROOT / "benchmarks/gpu_runs" / name
    for name in (
        "2026-11-26-h200/run1_fwht_gpu.json",
        "2026-11-27-h200/fwht_gpu.json",
        "2026-11-30-h200/run1/fwht/fwht_gpu.json",
    )
]
# The benchmark's label of every backend (the JSON keys of its timings) -> its name.
AUTO_CANDIDATES = {LABELS.get(name, name): name for name in fwht_backends()}


def test_gpu_auto_choice_is_the_fastest_measured():
    """``"auto"`` on sm90+ picks, per measured case, the fastest implementation measured (the
    committed H200 runs; the first run's Triton kernel failed tests, so it does not count
    there), and ``"matmul"`` where nothing was measured."""
    measured = set()
    for run in GPU_RUNS:
        report = json.loads(run.read_text())
        broken = {"pallas_triton"} if "2026-11-26" in str(run) else set()
        for case, result in report["results"].items():
            dtype, n = case.split()[0], int(case.split("=")[1])
            timed = {
                implementation: result["timings"][label]["median_ms"]
                for label, implementation in AUTO_CANDIDATES.items()
                if label in result["timings"] and label not in {*result["failed"], *broken}
            }
            fastest = min(timed, key=timed.__getitem__)
            assert resolve_fwht("auto", "cuda", n=n, dtype=dtype, capability=(9, 0)) == fastest, (
                case
            )
            measured.add((dtype, n))
    assert set(GPU_AUTO_SM90) <= measured
    assert resolve_fwht("auto", "cuda", n=1 << 15, dtype="float32", capability=(9, 0)) == "matmul"
    assert resolve_fwht("auto", "cuda", n=1 << 15, dtype="bfloat16", capability=(9, 0)) == "matmul"
    assert resolve_fwht("auto", "cuda", n=1024, dtype="float32", capability=(8, 0)) == "matmul"


def test_auto_choice_per_platform():
    assert resolve_fwht("auto", "cpu") == ("cpu" if _fwht_cpu.is_available() else "matmul")
    assert resolve_fwht("auto", "tpu") == resolve_fwht("auto", "cuda") == "matmul"
    assert resolve_fwht("auto", "rocm") == "matmul" and resolve_fwht("auto", "METAL") == "xla"
    assert resolve_fwht("mosaic_gpu_interpret", "cpu") == "mosaic_gpu_interpret"
    for implementation, platform in [("pallas_tpu", "cpu"), ("mosaic_gpu", "tpu"), ("cpu", "cuda")]:
        with pytest.raises(ValueError, match=f"implementation='{implementation}' runs on"):
            resolve_fwht(implementation, platform)


def test_backends_per_platform():
    """``fwht_backends(platform=...)``: "gpu" (``jax.default_backend()``'s name) lists what
    compiles for CUDA or ROCm, and no CPU or TPU kernel; the interpret twins run everywhere."""
    gpu = set(fwht_backends(platform="gpu"))
    assert gpu == set(fwht_backends(platform="cuda")) | set(fwht_backends(platform="rocm"))
    assert {"pallas_triton", "mosaic_gpu", "pallas_tpu_interpret"} <= gpu
    assert not {"cpu", "pallas_tpu"} & gpu
    assert "pallas_triton" not in fwht_backends(platform="tpu")


@pytest.mark.parametrize("name", fwht_backends())
def test_every_backend_entry_names_its_kernels(name):
    """Each entry's kernel (and fused chain kernel) exists in its module; an interpret twin runs
    on every platform and takes what its compiled backend takes; the length and dtype check
    raises the errors ``fwht`` documents."""
    backend = fwht_backend(name)
    assert backend.name == name and callable(backend.kernel())
    if backend.chain is not None:
        assert callable(backend.chain_kernel())
    if backend.interprets is not None:
        compiled = fwht_backend(backend.interprets)
        assert backend.platforms == () and name == f"{compiled.name}_interpret"
        assert (backend.dtypes, backend.min_n, backend.max_n) == (
            compiled.dtypes,
            compiled.min_n,
            compiled.max_n,
        )
    assert name in fwht_backends(platform=backend.platforms[0] if backend.platforms else "tpu")
    if backend.max_n is not None:
        with pytest.raises(ValueError, match=f"{name}.*lengths .*{backend.max_n}"):
            backend.check(2 * backend.max_n, backend.dtypes[0])
    # A length that is not a power of two is refused as such, whatever the backend (it read
    # "takes power-of-two lengths up to None, got 12; use implementation='auto', 'matmul' or
    # 'xla'" for 'matmul' itself).
    with pytest.raises(ValueError, match=f"{name}.*power-of-two lengths, got 12; pad with"):
        backend.check(12, backend.dtypes[0])
    with pytest.raises(ValueError, match=f"{name}.*power-of-two lengths, got 0; pad with"):
        backend.check(0, backend.dtypes[0])
    if "float64" not in backend.dtypes:
        with pytest.raises(TypeError, match=f"{name}.*float32, got float64"):
            backend.check(backend.min_n, "float64")
    assert backend.supports(backend.min_n, backend.dtypes[-1])
