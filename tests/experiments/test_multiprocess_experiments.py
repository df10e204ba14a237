"""Every trainer-based experiment on two processes (jax.distributed over gloo on localhost).

The quick variant of each config runs on two processes of one CPU device each and, as the
reference, on one process with two forced CPU devices: the same "data" mesh of two devices, so
the same sharded computation; only where the two halves of a batch meet differs (a gloo
all-reduce between processes, an in-process one otherwise). Every number the experiment
records (``records.json``, and each run's per-step ``metrics.jsonl``) must be equal, except
the timings and the process count. Equal, not close: each reduction across the mesh adds two
partial results, and a + b == b + a holds exactly in floating point, so nothing in the
computation can differ.
(One device against two is a different computation: the batch's sums are blocked differently,
and a sampled softmax's negatives, discontinuous in the logits, can change; that is data
parallelism, not multi-process, and ``tests/experiments/core/test_training.py`` covers it on a
smooth task.)

Evaluation batches of any size work on any number of processes (``padded_batches`` pads them
with masked rows to a multiple of the device count); the LSTM's 25 windows per batch raised
before (issue 31). The LSTM config is the cheap case kept in the default suite; the others are
slow (``--runslow``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from rfjax import data
from tests.support.multiprocess import ROOT, cpu_environment, run_processes

pytestmark = pytest.mark.integration  # several processes, run end to end

requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(data.fashion_mnist_dir(), "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (.ci/run does)",
)
requires_fsdd = pytest.mark.skipif(
    not os.path.isdir(os.environ.get("RFJAX_FSDD_DIR", "")),
    reason="FSDD not found: set RFJAX_FSDD_DIR to its recordings/ folder",
)

# Unoptimised CPU code compiles several times faster; both runs use the same flags.
FLAGS = "--xla_backend_optimization_level=0"
# Records that measure or describe the machine, not the computation.
MACHINE_WORDS = ("seconds", "load_average", "tokens_per_second", "processes")

CONFIGS = [
    pytest.param("configs/lstm_lm.py:quick", id="lstm_lm"),
    pytest.param(
        "configs/performer_vit.py:quick,attentions=(simplex,),num_seeds.redraw=1",
        id="performer_vit",
        marks=[pytest.mark.slow, requires_fashion_mnist],
    ),
    pytest.param(
        "configs/conformer_ctc.py:quick",
        id="conformer_ctc",
        marks=[pytest.mark.slow, requires_fsdd],
    ),
    pytest.param("configs/performer_lm.py:quick", id="performer_lm", marks=pytest.mark.slow),
]


def numbers(tree, path: str = "") -> dict[str, float]:
    """Every number in a JSON tree by its path, but the machine's (``MACHINE_WORDS``)."""
    if isinstance(tree, dict):
        found = {}
        for key, value in tree.items():
            if not any(word in key for word in MACHINE_WORDS):
                found.update(numbers(value, f"{path}.{key}"))
        return found
    if isinstance(tree, list):
        found = {}
        for index, value in enumerate(tree):
            found.update(numbers(value, f"{path}[{index}]"))
        return found
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {path: tree}
    return {}


def recorded(workdir) -> dict[str, float]:
    """The numbers of ``records.json`` and of every run's ``metrics.jsonl``."""
    with open(os.path.join(workdir, "records.json")) as handle:
        found = numbers(json.load(handle), "records")
    runs = os.path.join(workdir, "runs")
    for run in sorted(os.listdir(runs)):
        with open(os.path.join(runs, run, "metrics.jsonl")) as handle:
            records = [json.loads(line) for line in handle]
        found.update(numbers(records, f"{run}/metrics"))
    return found


@pytest.mark.parametrize("config", CONFIGS)
def test_two_processes_record_what_one_process_on_two_devices_records(tmp_path, config):
    command = [sys.executable, "-m", "experiments.main", f"--config={config}"]
    environment = cpu_environment(
        {"XLA_FLAGS": f"{FLAGS} --xla_force_host_platform_device_count=2"}
    )
    single = subprocess.Popen(
        [*command, f"--workdir={tmp_path / 'single'}"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = run_processes(
        [*command, f"--workdir={tmp_path / 'multi'}"], 2, env={"XLA_FLAGS": FLAGS}
    )
    _, single_err = single.communicate(timeout=900)
    for result in results:
        assert result.returncode == 0, (result.process_id, result.stderr[-3000:])
        assert "trained to step" in result.stdout
    assert single.returncode == 0, single_err[-3000:]
    multi, one = recorded(tmp_path / "multi"), recorded(tmp_path / "single")
    assert multi.keys() == one.keys()
    assert len(multi) > 5
    different = {
        key: (multi[key], one[key])
        for key in multi
        if multi[key] != one[key] and not (math.isnan(multi[key]) and math.isnan(one[key]))
    }
    assert not different, different
    assert json.loads((tmp_path / "multi" / "status.json").read_text())["state"] == "done"
