"""4-device checks of the long-context LM for ``experiments/performer_lm/test_performer_lm.py``,
run as a script with 4 forced CPU devices (XLA_FLAGS must set the count before jax is imported):

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/support/performer_lm_checks.py \\
      split|experiment WORKDIR

Prints one JSON object on its last line.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from rfjax.nn import PerformerLM  # noqa: E402

SIZES = dict(
    vocab_size=37, num_layers=2, embed_dim=16, num_heads=2, mlp_dim=24, num_features=8,
    chunk_size=8, loss_chunk=16,
)  # fmt: skip


def split_errors() -> dict:
    """Per kind, the largest relative differences of the NLL and of the parameter gradients
    between the model on a 2 x 2 "data" x "seq" mesh and the unsplit model."""
    mesh = jax.make_mesh((2, 2), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)
    tokens = jax.random.randint(jax.random.key(0), (2, 64), 0, SIZES["vocab_size"])
    targets = jnp.roll(tokens, -1, axis=1)
    rngs = {"projection": jax.random.key(3)}
    windows = P("data", "seq")
    errors = {}
    for kind in ("performer", "exact"):
        model = PerformerLM(**SIZES, attention_kind=kind)
        split = PerformerLM(**SIZES, attention_kind=kind, sequence_axis="seq")
        params = model.init(jax.random.key(1), tokens)

        def one(params, model=model):
            return model.apply(params, tokens, targets, rngs=rngs, projection_step=7)

        def local(params, inputs, outputs, split=split):
            return split.apply(params, inputs, outputs, rngs=rngs, projection_step=7)

        sharded = jax.shard_map(
            local, mesh=mesh, in_specs=(P(), windows, windows), out_specs=windows
        )

        def many(params, sharded=sharded):
            return sharded(params, tokens, targets)

        def relative(a, b):
            return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

        grad_one = jax.jit(jax.grad(lambda p, f=one: f(p).mean()))(params)
        grad_many = jax.jit(jax.grad(lambda p, f=many: f(p).mean()))(params)
        # Gradients relative to the largest entry of the whole gradient: some leaves are 0 in
        # exact arithmetic (exact attention's key bias: softmax ignores a score shift common
        # to all keys), where any rounding is an infinite relative error.
        flat_many = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grad_many)])
        flat_one = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grad_one)])
        errors[kind] = {
            "nll": relative(jax.jit(many)(params), jax.jit(one)(params)),
            "grad": relative(flat_many, flat_one),
        }
    return errors


def run_quick(workdir: str, steps: int) -> tuple[dict, str]:
    config = (
        f"configs/performer_lm.py:quick,train.sequence_parallelism=2,train.num_train_steps={steps}"
    )
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.main", f"--config={config}", f"--workdir={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if completed.returncode:
        raise RuntimeError(completed.stderr[-3000:])
    with open(os.path.join(workdir, "records.json")) as handle:
        runs = json.load(handle)["runs"]
    found = {
        "kinds": [run["kind"] for run in runs],
        "steps": [run["steps"] for run in runs],
        "valid_perplexity": [run["valid_perplexity"] for run in runs],
    }
    return found, completed.stdout


def main() -> None:
    check, workdir = sys.argv[1], sys.argv[2]
    assert jax.device_count() == 4, jax.devices()
    if check == "split":
        report = split_errors()
    else:
        first, _ = run_quick(workdir, 6)
        # As if killed after each run's last checkpoint, before its record: the same command
        # resumes the checkpoints (a run under other settings would start from step 0).
        for record in glob.glob(os.path.join(workdir, "runs", "*", "result.json")):
            os.remove(record)
        second, stdout = run_quick(workdir, 6)
        report = {"first": first, "second": second, "second_stdout": stdout}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
