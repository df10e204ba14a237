"""Performer-ViT's arms, model and training task: the runs' names and seeds, the projection
protocols, the ViT and its Fashion-MNIST data.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments.core.train import trainer as train
from rfjax.data import load_fashion_mnist
from rfjax.nn import PerformerViT

PROTOCOLS = ("fixed", "redraw")
METRICS = {"accuracy_own": "own projection", "accuracy_fresh": "fresh draws"}
LABELS = {
    "exact": "exact",
    "gaussian": "IID",
    "orthogonal": "ORF",
    "simplex": "SimRF",
    "simplex_plus": "SimRF+",
}
# (better, worse) pairs whose paired differences are reported, when both were trained.
COMPARISONS = (("simplex", "orthogonal"), ("orthogonal", "gaussian"), ("simplex", "gaussian"))


def _label(attention: str) -> str:
    return LABELS.get(attention, attention)


def run_name(attention: str, protocol: str | None) -> str:
    """``"exact"`` or ``"<protocol>_<coupling>"``: the run directory's prefix."""
    return attention if attention == "exact" else f"{protocol}_{attention}"


def run_names(config: ml_collections.ConfigDict) -> list[tuple[str, str, str | None]]:
    """(run name, attention, protocol) of every trained variant: exact once, then each
    (protocol, coupling)."""
    names: list[tuple[str, str, str | None]] = []
    if "exact" in config.attentions:
        names.append(("exact", "exact", None))
    for protocol in config.protocols:
        names += [(run_name(a, protocol), a, protocol) for a in config.attentions if a != "exact"]
    return names


def num_seeds(config: ml_collections.ConfigDict, attention: str, protocol: str | None) -> int:
    """Seeds 0..n-1 of a variant: ``num_reference_seeds`` for the reference attentions (exact,
    IID), else ``num_seeds[protocol]`` (sized by the power estimate)."""
    if attention in config.reference_attentions:
        return config.num_reference_seeds
    return config.num_seeds[protocol]


def is_redrawn_throughout(config: ml_collections.ConfigDict, protocol: str | None) -> bool:
    """Whether ``protocol`` draws a new projection at every training step to the last."""
    return (
        protocol == "redraw"
        and config.model.redraw_interval == 1
        and config.redraw_until_step == config.train.num_train_steps - 1
    )


def primary_metric(config: ml_collections.ConfigDict, protocol: str | None) -> str:
    """The accuracy a protocol's Performers are judged by: the mean over fresh draws for a
    model redrawn throughout (a random-feature model: its accuracy is an expectation over
    draws), the accuracy with its own projection for one that co-adapts to the projection it
    ends with (the model as trained)."""
    return "accuracy_fresh" if is_redrawn_throughout(config, protocol) else "accuracy_own"


def projection_step(step: jax.Array, protocol: str | None, redraw_until_step: int) -> jax.Array:
    """The step that selects the projection used at training step ``step``."""
    if protocol == "redraw":
        return jnp.minimum(step, redraw_until_step)
    return jnp.zeros_like(step)  # "fixed" (and exact attention, which draws nothing)


def make_model(config: ml_collections.ConfigDict, attention: str) -> PerformerViT:
    """The ViT of ``config.model`` with exact attention or a Performer with that coupling."""
    kind = {"attention_kind": "exact"} if attention == "exact" else {"coupling": attention}
    options: dict[str, Any] = {**config.model.to_dict(), **kind}
    return PerformerViT(num_classes=10, **options)


def pixel_stats(train_images: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels / 255."""
    return float(np.mean(train_images) / 255), float(np.std(train_images) / 255)


def _normaliser(train_images: np.ndarray):
    mean, std = pixel_stats(train_images)

    def normalise(images):
        return (images.astype(jnp.float32) / 255 - mean) / std

    return normalise


def make_task(
    model: PerformerViT,
    train_arrays: dict,
    test_arrays: dict,
    config: ml_collections.ConfigDict,
    seed: int,
    protocol: str | None,
) -> train.Task:
    """Cross-entropy on normalised images; eval: accuracy and loss sums over the test set, with
    the projection of the last update."""
    normalise = _normaliser(train_arrays["image"])

    def loss(params, batch, rng, step):
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=True,
            projection_step=projection_step(step, protocol, config.redraw_until_step),
            rngs=train.step_rngs(rng, step),
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
        return jnp.mean(losses), {"accuracy": accuracy}

    def eval_metrics(params, batch, rng, step):
        # The projection of the last update (step - 1): the one the parameters were trained with.
        last = projection_step(jnp.maximum(step - 1, 0), protocol, config.redraw_until_step)
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=False,
            projection_step=last,
            rngs=train.step_rngs(rng, step, per_step=()),
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        correct = jnp.argmax(logits, -1) == batch["label"]
        weights = batch["mask"]
        return {
            "accuracy": jnp.sum(correct & weights),
            "loss": jnp.sum(jnp.where(weights, losses, 0)),
            "count": jnp.sum(weights),
        }

    def init(rng, batch):
        params_rng, projection_rng = jax.random.split(rng)
        return model.init(
            {"params": params_rng, "projection": projection_rng},
            normalise(batch["image"]),
            train=False,
        )

    return train.array_task(
        init,
        loss,
        eval_metrics,
        train_arrays,
        test_arrays,
        batch_size=config.train.batch_size,
        eval_batch_size=config.eval_batch_size,
        seed=seed,
    )


def _load(split: Literal["train", "test"], data_dir: str, limit: int) -> dict[str, np.ndarray]:
    images, labels = load_fashion_mnist(split, data_dir=data_dir)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return {"image": images, "label": labels}


def load_arrays(config: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
    """The train and test splits of ``config`` (limited to its example counts)."""
    return {
        "train": _load("train", config.data_dir, config.num_train_examples),
        "test": _load("test", config.data_dir, config.num_test_examples),
    }
