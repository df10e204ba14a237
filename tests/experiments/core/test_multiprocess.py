"""Several processes for real: jax.distributed on localhost (CPU collectives over gloo).

The trainer's quick Performer-ViT config runs on two processes (one CPU device each; every
process loads its half of each global batch through ``jax.make_array_from_process_local_data``,
Orbax writes the checkpoints cooperatively, process 0 writes the results) and, beside it, on one
process; the per-step training losses must agree to float32 reduction order (tolerance derived
below). The harness (``tests/support/multiprocess.py``) takes any command that accepts the
``--coordinator_address/--num_processes/--process_id`` flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rfjax import data
from tests.support.multiprocess import ROOT, cpu_environment, run_processes

pytestmark = pytest.mark.integration  # several processes, run end to end

requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(data.fashion_mnist_dir(), "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (.ci/run does)",
)

NUM_STEPS = 8
BATCH = 32  # the quick config's global batch
# The quick Performer config, one attention, a record every step and checkpoints mid-run (so
# that the cooperative Orbax save runs too).
CONFIG = (
    "configs/performer_vit.py:quick,attentions=(simplex,),num_seeds.redraw=1,"
    f"train.num_train_steps={NUM_STEPS},redraw_until_step={NUM_STEPS - 1},"
    "train.log_every_steps=1,train.eval_every_steps=0,"
    "train.checkpoint_every_steps=4"
)
# Unoptimised CPU code compiles several times faster; every run below uses the same flags.
ENV = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}

# Tolerance. The two runs compute the same per-example values; only the order of float32
# additions can differ: the batch mean of the loss (and each gradient) sums B = 32 terms in one
# pass on one device, but as two partial sums of 16 added by the all-reduce on two processes.
# Recursive summation of n terms in any order is within (n - 1) u sum|x_i| of the exact sum
# (u = 2^-24; Higham, Accuracy and Stability of Numerical Algorithms, 2002, Eq. 4.4), so two
# orders differ by at most 2 (n - 1) u sum|x_i|: relative 2 (B - 1) u = 3.7e-6 for the
# non-negative per-example cross-entropies of step 1 (identical parameters). Every later step
# starts from parameters that differ by such rounding in the gradient; allowing the per-step
# bound to add up over the steps gives the relative tolerance S * 2 (B - 1) u = 3.0e-5 at S = 8.
UNIT_ROUNDOFF = 2.0**-24
STEP_TOLERANCE = 2 * (BATCH - 1) * UNIT_ROUNDOFF


def _losses(workdir) -> list[tuple[int, float]]:
    path = os.path.join(workdir, "runs", "redraw_simplex_seed0", "metrics.jsonl")
    with open(path) as handle:
        records = [json.loads(line) for line in handle]
    return [(r["step"], r["loss"]) for r in records if r["split"] == "train"]


@requires_fashion_mnist
def test_two_processes_train_the_quick_performer_as_one_process_does(tmp_path):
    command = [sys.executable, "-m", "experiments.main", f"--config={CONFIG}"]
    single = subprocess.Popen(
        [*command, f"--workdir={tmp_path / 'single'}"],
        cwd=ROOT,
        env=cpu_environment(ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = run_processes([*command, f"--workdir={tmp_path / 'multi'}"], 2, env=ENV)
    _, single_err = single.communicate(timeout=600)
    for result in results:
        assert result.returncode == 0, (result.process_id, result.stderr[-3000:])
    assert single.returncode == 0, single_err[-3000:]

    multi, one = _losses(tmp_path / "multi"), _losses(tmp_path / "single")
    assert [step for step, _ in multi] == [step for step, _ in one] == list(range(1, 9))
    for (step, loss_multi), (_, loss_one) in zip(multi, one, strict=True):
        tolerance = step * STEP_TOLERANCE
        assert abs(loss_multi - loss_one) <= tolerance * abs(loss_one), (step, loss_multi, loss_one)
    with open(tmp_path / "multi" / "records.json") as handle:
        multi_runs = json.load(handle)["runs"]
    with open(tmp_path / "single" / "records.json") as handle:
        one_runs = json.load(handle)["runs"]
    # atol 1/256 is below one of the quick config's 128 test images: the accuracies must be equal.
    assert np.isclose(multi_runs[0]["accuracy_own"], one_runs[0]["accuracy_own"], atol=1 / 256)
    # Process 0 wrote the results; both processes trained and said so.
    assert json.loads((tmp_path / "multi" / "status.json").read_text())["state"] == "done"
    for result in results:
        assert f"trained to step {NUM_STEPS}" in result.stdout
