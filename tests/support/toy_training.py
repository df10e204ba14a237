"""A toy training task for the trainer's tests (imported by test_training and by the
subprocesses it starts, so it imports neither pytest nor rfjax)."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs.training import train_config
from experiments.core.train import trainer as train


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


def leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def resume_config(num_train_steps: int = 30):
    """Checkpoints every 7 steps, records every 5: a resumed run must still log the records of
    an uninterrupted one (the unlogged steps' metrics travel in the checkpoint)."""
    config = toy_config(num_train_steps)
    config.checkpoint_every_steps = 7
    return config


def with_batches(task: train.Task, wrap) -> train.Task:
    """``task`` with its training batches passed through ``wrap(step, batch)`` before use."""

    def batches(start):
        for step, batch in enumerate(task.train_batches(start), start):
            wrap(step, batch)
            yield batch

    return dataclasses.replace(task, train_batches=batches)


def signal_at(task: train.Task, step: int, signum: int) -> train.Task:
    """``task`` sending ``signum`` to this process when the batch of ``step`` is drawn (a
    deterministic Ctrl-C or pre-emption in the middle of training)."""

    def wrap(current, batch):
        if current == step:
            os.kill(os.getpid(), signum)

    return with_batches(task, wrap)
