"""The long-context causal LM experiment, ``experiments/performer_lm/`` (the model's own tests,
``rfjax.nn.PerformerLM``, are in tests/rfjax/nn/test_performer_lm.py).

One device here; the 4-device checks (the sequence split over a mesh axis against one device,
the experiment's quick variant on a 2 x 2 "data" x "seq" mesh, and its resume) run in a
subprocess with 4 forced CPU devices (``performer_lm_checks.py``), the multi-host recipe
(2 processes x 2 devices, a kill, a resume) in ``test_multihost_recipe_resumes_after_a_kill``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support import SUPPORT
from tests.support.multiprocess import (
    ROOT,
    cpu_environment,
    distributed_flags,
    free_port,
    run_on_forced_devices,
)


def test_experiment_rejects_a_context_the_sequence_devices_do_not_divide():
    from configs.performer_lm import get_config
    from experiments import performer_lm

    config = get_config("quick,context_length=255,train.sequence_parallelism=2")
    with pytest.raises(ValueError, match="context_length=255 must be divisible by"):
        performer_lm.validate_config(config)
    with pytest.raises(ValueError, match="attention_kinds: 'flash'"):
        performer_lm.validate_config(get_config("quick,attention_kinds=(flash,)"))
    with pytest.raises(ValueError, match="feature_map='derf_asymmetric' cannot be used here"):
        performer_lm.validate_config(get_config("quick,model.feature_map=derf_asymmetric"))
    # -1 passed and failed after the data loaded (ptb.load_windows), naming no config field
    with pytest.raises(ValueError, match=r"config\.num_train_tokens must be an int >= 0"):
        performer_lm.validate_config(get_config("quick,num_train_tokens=-1"))
    for name in ("positive", "trigonometric", "angular_hybrid"):  # any other map and coupling
        performer_lm.validate_config(
            get_config(f"quick,model.feature_map={name},model.coupling=simplex")
        )


def _four_devices(check: str, workdir) -> dict:
    return run_on_forced_devices([str(SUPPORT / "performer_lm_checks.py"), check, str(workdir)], 4)


@pytest.mark.integration
def test_sequence_split_over_four_devices_equals_one_device(tmp_path):
    # Each kind on a 2 x 2 "data" x "seq" mesh (windows over data, positions over seq) against
    # the unsplit model: per-token NLL and parameter gradients (float32, summation order only).
    errors = _four_devices("split", tmp_path)
    for kind in ("performer", "exact"):
        assert errors[kind]["nll"] <= 1e-5, errors
        assert errors[kind]["grad"] <= 1e-5, errors


@pytest.mark.integration
def test_quick_variant_trains_on_a_two_by_two_mesh_and_resumes(tmp_path):
    # configs/performer_lm.py:quick with train.sequence_parallelism=2 on 4 forced devices, then
    # the same command after the runs' records are lost: it resumes from the checkpoints of
    # step 6 (the same settings; other settings train from step 0: test_core_sweep) and
    # records the same numbers.
    found = _four_devices("experiment", tmp_path)
    assert found["first"]["kinds"] == ["performer", "exact"]
    assert all(np.isfinite(found["first"]["valid_perplexity"]))
    assert found["first"]["steps"] == [6, 6]
    assert "resuming from step 6" in found["second_stdout"]
    assert found["second"] == found["first"]


def _kill_after_checkpoint(processes, checkpoints: str, step: int, timeout_s: float) -> bool:
    """SIGKILLs process 1 once the checkpoint of ``step`` is complete; whether it was alive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.isdir(os.path.join(checkpoints, str(step))) and not any(
            name.endswith(".orbax-checkpoint-tmp") or "tmp" in name
            for name in os.listdir(checkpoints)
        ):
            alive = processes[1].poll() is None
            processes[1].send_signal(signal.SIGKILL)
            return alive
        if any(p.poll() not in (None, 0) for p in processes):
            return False
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_multihost_recipe_resumes_after_a_kill(tmp_path):
    """2 processes x 2 forced devices (a 2 x 2 "data" x "seq" mesh) train the quick LM; process
    1 is killed after the checkpoint of step 4; the job (both processes) starts again with the
    same command and resumes from that checkpoint to the end. Its records equal those of an
    uninterrupted run on one process with 4 devices (the same mesh)."""
    config = (
        "configs/performer_lm.py:quick,attention_kinds=(performer,),train.sequence_parallelism=2,"
        "train.num_train_steps=40,train.checkpoint_every_steps=4,train.log_every_steps=1,"
        "train.keep_checkpoints=20"
    )
    command = [sys.executable, "-m", "experiments.main", f"--config={config}"]
    env = cpu_environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    workdir = tmp_path / "multi"

    def start():
        port = free_port()
        return [
            subprocess.Popen(
                [*command, f"--workdir={workdir}", *distributed_flags(port, 2, index)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for index in range(2)
        ]

    first = start()
    checkpoints = str(workdir / "runs" / "performer_seed0" / "checkpoints")
    killed = _kill_after_checkpoint(first, checkpoints, 4, timeout_s=600)
    time.sleep(2)
    for process in first:  # the survivor waits for its dead peer: the job is restarted
        process.kill()
        process.communicate()
    assert killed, "process 1 ended before the checkpoint of step 4"
    second = start()
    outputs = [process.communicate(timeout=900)[0] for process in second]
    for process, output in zip(second, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    resumed = [line for line in outputs[0].splitlines() if line.startswith("resuming from step")]
    assert resumed and int(resumed[0].split()[3]) >= 4, outputs[0][-2000:]

    reference = tmp_path / "reference"
    completed = subprocess.run(
        [*command, f"--workdir={reference}"],
        cwd=ROOT,
        env=cpu_environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]

    def records(root):
        path = root / "runs" / "performer_seed0" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    multi, one = records(workdir), records(reference)
    assert [r["step"] for r in multi] == [r["step"] for r in one]
    for a, b in zip(multi, one, strict=True):
        for name in a:
            if name not in ("step", "split"):
                assert a[name] == pytest.approx(b[name], rel=MULTIHOST_TOLERANCE), (a, b)


# The reference runs the same 2 x 2 mesh in one process: the same programs, but the gradient's
# sum over the four devices may be associated differently by the cross-process (gloo) reduction
# than by the in-process one; two orders of a 4-term float32 sum differ by at most 2 * 3 u of
# the sum of magnitudes (Higham 2002, Eq. 4.4), and over 40 steps of Adam such differences add
# up to at most 40 * 6 u = 1.4e-5 relative (u = 2^-24) in the logged losses.
MULTIHOST_TOLERANCE = 40 * 6 * 2.0**-24


def test_perplexity_is_exp_mean_token_nll_over_every_window():
    """``perplexity`` = exp(mean NLL per token) over every window of the split, the padding of
    the last batch (5 windows in batches of 2) left out, at the step's projection of the eval
    stream (FAVOR; the count and the mask are the same code for exact attention)."""
    import jax
    import jax.numpy as jnp

    from configs.performer_lm import get_config
    from experiments import performer_lm
    from experiments.core.train import trainer as train

    config = get_config("quick,context_length=16,eval_batch_size=2")
    vocab = 30
    rng = np.random.default_rng(0)
    windows = {
        name: rng.integers(0, vocab, (5, 16)).astype(np.int32)
        for name in performer_lm.SEQUENCE_KEYS
    }
    task = performer_lm.make_task(config, {"train": windows}, "performer", vocab, seed=0)
    params = task.init(jax.random.key(0), windows)
    got = performer_lm.perplexity(config, task, params, windows, step=3)
    nll = performer_lm.nll_function(config, "performer", vocab)(
        params, *windows.values(), train.run_keys(config.train.seed)[1], jnp.int32(3)
    )
    assert got == pytest.approx(np.exp(np.mean(np.asarray(nll, np.float64))), rel=1e-5)
