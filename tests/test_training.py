"""The trainer (experiments.train): a quick run, resume equivalence, data parallelism, data."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import performer_vit as performer_vit_config
from configs.training import train_config
from experiments import train
from rfjax import data

requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(data.DEFAULT_FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (.ci/run does)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x, *, train: bool):
        x = nn.relu(nn.Dense(32)(x))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(3)(x)


def toy_task(seed: int = 0, batch_size: int = 16) -> train.Task:
    """Three Gaussian blobs in 8-d: a model-agnostic task with dropout and shuffling."""
    generator = np.random.default_rng(1234)
    labels = generator.integers(0, 3, 200).astype(np.int32)
    centres = generator.normal(size=(3, 8)).astype(np.float32)
    inputs = centres[labels] + 0.5 * generator.normal(size=(200, 8)).astype(np.float32)
    model = _MLP()

    def loss(params, batch, rng, step):
        rngs = train.step_rngs(rng, step, fixed=())
        logits = model.apply(params, batch["x"], train=True, rngs=rngs)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["y"])}

    def eval_metrics(params, batch, rng, step):
        logits = model.apply(params, batch["x"], train=False)
        correct = (jnp.argmax(logits, -1) == batch["y"]) & batch["mask"]
        return {"accuracy": jnp.sum(correct), "count": jnp.sum(batch["mask"])}

    arrays = {"x": inputs, "y": labels}
    return train.Task(
        init=lambda rng, batch: model.init(rng, batch["x"], train=False),
        loss=loss,
        train_batches=lambda start: train.epoch_batches(arrays, batch_size, seed, start),
        eval_metrics=eval_metrics,
        eval_batches=lambda: train.padded_batches(arrays, 60),
    )


def toy_config(num_train_steps: int = 30):
    config = train_config()
    config.num_train_steps = num_train_steps
    config.batch_size = 16
    config.learning_rate = 1e-2
    config.warmup_steps = 5
    config.log_every_steps = 5
    config.eval_every_steps = 10
    config.checkpoint_every_steps = 10
    return config


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_quick_run_learns_and_writes_metrics(tmp_path):
    final = train.train_and_evaluate(toy_config(), str(tmp_path), toy_task())
    assert final["step"] == 30
    assert final["eval_accuracy"] > 0.9
    records = train.read_metrics(str(tmp_path))
    assert [r["step"] for r in records if r["split"] == "train"] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in records if r["split"] == "eval"] == [10, 20, 30]
    assert records[0]["loss"] > records[-2]["loss"]


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path):
    straight = train.train_and_evaluate(toy_config(), str(tmp_path / "straight"), toy_task())
    interrupted = str(tmp_path / "interrupted")
    partial = train.train_and_evaluate(toy_config(), interrupted, toy_task(), stop_at_step=17)
    assert partial["step"] == 17 and "eval_accuracy" not in partial
    resumed = train.train_and_evaluate(toy_config(), interrupted, toy_task())
    assert resumed["eval_accuracy"] == straight["eval_accuracy"]
    for a, b in zip(
        _leaves(train.final_params(str(tmp_path / "straight"))),
        _leaves(train.final_params(interrupted)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    records = train.read_metrics(interrupted)
    assert [(r["split"], r["step"]) for r in records].count(("eval", 30)) == 1
    # A finished run started again does nothing and reports the same result.
    again = train.train_and_evaluate(toy_config(), interrupted, toy_task())
    assert again["eval_accuracy"] == straight["eval_accuracy"]


def test_epoch_batches_are_a_function_of_seed_and_step():
    arrays = {"i": np.arange(50)}
    run = train.epoch_batches(arrays, 8, seed=3)
    first = [next(run)["i"] for _ in range(14)]  # 6 steps per epoch: crosses two epochs
    restarted = train.epoch_batches(arrays, 8, seed=3, start_step=9)
    for step in range(9, 14):
        np.testing.assert_array_equal(next(restarted)["i"], first[step])
    assert len(np.unique(np.concatenate(first[:6]))) == 48  # no repeats within an epoch
    assert not np.array_equal(first[0], first[6])


_DATA_PARALLEL_SCRIPT = """
import sys, json, numpy as np, jax
sys.path.insert(0, {tests!r})
from test_training import toy_task, toy_config, _leaves
from experiments import train
assert jax.device_count() == 4, jax.devices()
final = train.train_and_evaluate(toy_config(20), {workdir!r}, toy_task())
np.savez({out!r}, *_leaves(train.final_params({workdir!r})))
print(json.dumps(final))
"""


def test_four_device_data_parallel_run_matches_one_device(tmp_path):
    script = _DATA_PARALLEL_SCRIPT.format(
        tests=os.path.join(ROOT, "tests"),
        workdir=str(tmp_path / "four"),
        out=str(tmp_path / "four.npz"),
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    four = json.loads(completed.stdout.strip().splitlines()[-1])
    one = train.train_and_evaluate(toy_config(20), str(tmp_path / "one"), toy_task())
    assert four["eval_accuracy"] == pytest.approx(one["eval_accuracy"], abs=1 / 200)
    assert four["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
    with np.load(tmp_path / "four.npz") as saved:
        four_params = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    for a, b in zip(four_params, _leaves(train.final_params(str(tmp_path / "one"))), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_batch_size_must_divide_over_devices(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 3)
    with pytest.raises(ValueError, match="divisible by the device count"):
        train.train_and_evaluate(toy_config(), str(tmp_path), toy_task())


@requires_fashion_mnist
def test_fashion_mnist_loads_and_missing_data_explains_how_to_get_it(tmp_path):
    images, labels = data.load_fashion_mnist("test")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert np.array_equal(np.bincount(labels), np.full(10, 1000))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as info:
        data.load_fashion_mnist("train", data_dir=str(tmp_path))
    assert "github.com/zalandoresearch/fashion-mnist" in str(info.value)
    with pytest.raises(ValueError, match="split"):
        data.load_fashion_mnist("validation")


@requires_fashion_mnist
def test_performer_vit_quick_experiment(tmp_path):
    workdir = tmp_path / "performer_vit"
    command = [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=configs/performer_vit.py:quick",
        f"--workdir={workdir}",
    ]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    config = performer_vit_config.get_config("quick")
    with open(workdir / "results.json") as handle:
        runs = json.load(handle)["runs"]
    assert len(runs) == len(config.attentions) * len(config.seeds)
    for run in runs:
        assert 0.0 <= run["test_accuracy"] <= 1.0
    for name in ("summary.md", "learning_curves.png", "results.csv", "config.json"):
        assert (workdir / name).stat().st_size > 0, name


def test_performer_vit_config_variants():
    default = performer_vit_config.get_config()
    paper = performer_vit_config.get_config("paper")
    assert (paper.model.num_layers, paper.model.num_heads) == (12, 12)
    assert (paper.model.mlp_dim, paper.model.num_features) == (3072, 130)
    assert paper.model.hidden_size % paper.model.num_heads == 0
    assert {"exact", "orthogonal", "simplex", "gaussian"} <= set(default.attentions)
    assert performer_vit_config.get_config("quick").train.num_train_steps < 100
    with pytest.raises(ValueError, match="config variant"):
        performer_vit_config.get_config("huge")
