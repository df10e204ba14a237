"""What a GPU lease runs (``benchmarks.gpu_run``), run on CPU, so that a lease is not spent finding
that a step no longer starts: the tests step selects the GPU tests where they live now, and the
attention and fwht benchmarks run their JAX programs end to end at a small size (the GPU-only
methods recorded with the reason they did not run), and so does the long-context LM's training
step. The benchmarks refuse a CPU from their
command line; these tests call their functions."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import jax
import pytest

from benchmarks import attention_gpu, fwht_gpu, gpu_report, gpu_run, long_context
from configs.performer_lm import get_config
from tests.support import ROOT

pytestmark = pytest.mark.integration


def test_the_tests_step_selects_the_compiled_kernels_tests():
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", *gpu_run.GPU_TESTS]
    command += ["-k", gpu_run.GPU_TEST_SELECTION]
    listing = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    selected = [line for line in listing.splitlines() if "::" in line]
    # The fused attention kernels compiled by Triton, and fwht's Mosaic GPU and Triton kernels.
    assert any("test_pallas_triton_on_the_gpu_matches_the_xla_form" in t for t in selected)
    assert any("test_pallas_mosaic_gpu_on_the_gpu_matches_the_xla_form" in t for t in selected)
    assert any("test_fwht.py" in t and "mosaic_gpu" in t for t in selected)
    assert any("test_fwht.py" in t and "pallas_triton" in t for t in selected)
    assert not any("interpret" in t for t in selected)
    # Every test that runs on a GPU alone (named "..._on_the_gpu_...") is in the selection.
    on_the_gpu = {
        match
        for path in (ROOT / "tests").rglob("test_*.py")
        for match in re.findall(r"^def (test_\w*on_the_gpu\w*)\(", path.read_text(), re.M)
    }
    assert on_the_gpu and on_the_gpu <= {t.split("::")[-1].split("[")[0] for t in selected}


def test_the_attention_benchmark_runs_its_jax_programs():
    rows = attention_gpu.benchmark(1, 128, "float32", 2, xla_limit_bytes=1e12, check=False)
    cases = {(r["mode"], r["method"], r["pass"]) for r in rows if r["method"] != "fla"}
    expected = {
        (mode, method, name)
        for mode in attention_gpu.MODES
        for method in attention_gpu.METHODS
        for name in attention_gpu.PASSES
    }
    assert expected <= cases
    for row in rows:
        if row["method"] in ("favor", "xla"):  # the programs that run on every platform
            assert row["median_s"] > 0, row
        elif row["method"] in ("favor_pallas", "favor_mosaic", "cudnn"):  # for CUDA only
            assert row["median_s"] is None and row["skipped"], row
    peaks = {  # made-up rates: the arithmetic of the roofline, not its value
        "matmul_bfloat16_flop_per_s": 1e12,
        "matmul_float32_default_flop_per_s": 5e11,
        "copy_bytes_per_s": 1e11,
    }
    attention_gpu.add_roofline(rows, peaks)
    favor = [r for r in rows if r["method"] == "favor"]
    assert favor and all(r["roofline"]["share"] > 0 for r in favor)
    summary = attention_gpu.summarize(rows)["float32 B=1 causal forward_backward favor"]
    # Exact attention by XLA is the peer where cuDNN does not run: FAVOR's time over it at T.
    assert summary["ratios"]["favor/xla"][128] > 0, summary


def test_a_program_that_fails_at_run_time_leaves_the_others_timed(monkeypatch):
    # Exact causal attention made to compile and then fail when called, as a kernel can fail at
    # its launch on a GPU (shared memory, resources): the case's other programs are still timed.
    forward = attention_gpu._forward

    def fail(x):
        raise RuntimeError("the launch failed")

    def failing_forward(method, causal):
        function = forward(method, causal)
        if method != "xla" or not causal:
            return function
        return lambda *args: jax.pure_callback(fail, jax.eval_shape(function, *args), args[0])

    monkeypatch.setattr(attention_gpu, "_forward", failing_forward)
    rows = attention_gpu.benchmark(1, 128, "float32", 2, xla_limit_bytes=1e12, check=False)
    found = {(r["mode"], r["method"], r["pass"]): r for r in rows if "pass" in r}
    failed = found[("causal", "xla", "forward")]
    assert failed["median_s"] is None, failed
    assert failed["skipped"].startswith("fails at run time: "), failed
    for key in [("causal", "favor", "forward"), ("bidirectional", "xla", "forward")]:
        assert found[key]["median_s"] > 0, found[key]


def test_a_profile_that_fails_leaves_the_cases_and_the_report(monkeypatch, tmp_path):
    # On a CPU the fused kernels do not compile, as a kernel under new settings might not on a
    # GPU: the profile says so, the run goes on to the cases and the report still reads it.
    monkeypatch.setattr(attention_gpu, "measure_peaks", lambda: {})
    args = argparse.Namespace(
        profile=[1, 128],
        dtypes=["float32"],
        batches=[1],
        lengths=[],  # no case: the profiles alone
        budget_s=None,
        repeats=1,
        xla_limit_gb=1.0,
        json=str(tmp_path / "attention_gpu.json"),
    )
    report = attention_gpu.run(args, {})
    failed, profiled = report["profiles"]
    assert failed["method"] == "favor_pallas" and "pallas_triton" in failed["error"], failed
    assert profiled["method"] == "favor" and "lines" in profiled, profiled
    written = json.loads((tmp_path / "attention_gpu.json").read_text())
    assert written["profiles"] == [failed, profiled]
    # Issue 42: every figure with the device, JAX's version and the load (and the arguments).
    assert len(written["written_with"]["load_average"]) == 3
    assert written["written_with"]["settings"]["profile"] == [1, 128]
    lines = "\n".join(gpu_report.profile_section(failed))
    assert "Not profiled: ValueError" in lines, lines


def test_the_fwht_benchmark_checks_and_times_against_a_copy(tmp_path):
    path = tmp_path / "fwht_gpu.json"
    report = fwht_gpu.run(
        total=1 << 12, sizes=[64], dtypes=["float32"], calls=2, repeats=2, json_path=path
    )
    written = json.loads(path.read_text())
    assert written["results"].keys() == report["results"].keys()
    assert len(written["written_with"]["load_average"]) == 3
    assert written["written_with"]["settings"]["sizes"] == [64]
    case = report["results"]["float32 n=64"]
    assert case["failed"] == {}, case["failed"]
    assert {"copy", "auto"} <= set(case["timings"])
    errors = case["max_relative_error_vs_butterfly"]
    assert "auto" in errors and max(errors.values()) <= fwht_gpu.TOLERANCE["float32"], errors
    assert case["ratios"]["copy/copy"] == 1.0


def test_the_long_context_training_step_compiles_and_runs_for_both_kinds():
    # The step runs the LM inside shard_map (the rows over "seq", one device here): until
    # 2026-11-28 FAVOR's gradients raised there and the step read "does not compile".
    config = get_config(None)
    with config.unlocked():
        config.model.implementation = "xla"
    cells = list(long_context.step_rows(config, 100, [256], [1], repeats=2, budget=1e12))
    assert len(cells) == 1  # one (T, D): one list of rows, written as it comes
    rows = cells[0]
    assert {row["kind"] for row in rows} == set(long_context.KINDS)
    for row in rows:
        assert row["status"] == "timed" and row["tokens_per_second"] > 0, row


def test_the_lease_script_returns_every_file_or_names_it(tmp_path):
    # lease.sh run with a stand-in python3 (no pip, no GPU): the run directory's files below
    # 4 MiB come back in the archive, the others are named in the log; none goes unmentioned.
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "stand_in-0-py3-none-any.whl").write_bytes(b"")
    bin_dir.mkdir()
    out.mkdir()
    sizes = {"small.json": 1_000, "three_and_a_half_mb.log": 3_500_000, "five_mb.ckpt": 5 << 20}
    stand_in = ["#!/usr/bin/env bash", 'if [ "$2" = benchmarks.gpu_run ]; then']
    stand_in += ["  mkdir -p run"]
    stand_in += [f"  head -c {size} /dev/zero > run/{name}" for name, size in sizes.items()]
    stand_in += ['  echo "done: $PWD/run"', "fi"]
    (bin_dir / "python3").write_text("\n".join(stand_in) + "\n")
    (bin_dir / "python3").chmod(0o755)
    script = ROOT / "benchmarks" / "gpu_runs" / "lease.sh"
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script), "1"], cwd=tmp_path, env=environment, check=True)
    listing = subprocess.run(
        ["tar", "tzf", str(out / "run.tar.gz")], capture_output=True, text=True, check=True
    ).stdout.split()
    log = (out / "gpu_run.log").read_text()
    assert sorted(listing) == ["run/small.json", "run/three_and_a_half_mb.log"], listing
    assert "left behind: run/five_mb.ckpt" in log, log


def test_a_training_step_that_fails_at_run_time_leaves_the_other_kind_timed(monkeypatch):
    # Exact attention's step made to fail when called (as a step can run out of memory on a
    # GPU though its compiled analysis fit): FAVOR's is still timed, and the rows still come.
    program = long_context.train_step_program

    def failing(config, kind, *args):
        compiled, arguments, memory = program(config, kind, *args)
        if kind != "exact":
            return compiled, arguments, memory

        def fail(*_):
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

        return fail, arguments, memory

    monkeypatch.setattr(long_context, "train_step_program", failing)
    config = get_config(None)
    with config.unlocked():
        config.model.implementation = "xla"
    (rows,) = long_context.step_rows(config, 100, [256], [1], repeats=2, budget=1e12)
    found = {row["kind"]: row for row in rows}
    assert found["exact"]["status"].startswith("fails at run time: RuntimeError"), found
    assert "tokens_per_second" not in found["exact"], found
    assert found["performer"]["status"] == "timed" and found["performer"]["tokens_per_second"] > 0


def test_the_long_context_step_trains_only_for_the_perplexity_rows(monkeypatch, tmp_path):
    # Issue 42's decoding rows (4k, 64k) and training step at 16k need no trained model: a
    # lease that skips perplexity gives the benchmark the whole share, where training took 45%.
    ran = []
    monkeypatch.setattr(gpu_run, "_step", lambda name, command, log, s: ran.append((command, s)))

    def step(lm_args: str) -> list:
        ran.clear()
        args = argparse.Namespace(lm_implementation="pallas_triton", lm_args=lm_args)
        gpu_run._long_context("python", tmp_path, 100.0, args)
        return ran[:]

    train, bench = step("")
    assert "experiments.main" in train[0] and (train[1], bench[1]) == pytest.approx((45, 55))
    ((command, seconds),) = step("--skip perplexity --lengths 4096 65536 --crossover-lengths")
    assert seconds == 100.0
    parsed = long_context.parser().parse_args(command[3:])  # what the subprocess reads
    assert parsed.lengths == [4096, 65536] and parsed.crossover_lengths == []
    assert parsed.skip == ["perplexity"] and parsed.implementation == "pallas_triton"
    # A misspelt argument stops gpu_run before its first step, not the lease's later steps.
    monkeypatch.setattr(sys, "argv", ["gpu_run", "--lm-args", "--skip perplexty"])
    ran.clear()
    with pytest.raises(SystemExit) as stopped:
        gpu_run.main()
    assert stopped.value.code == 2 and ran == []
