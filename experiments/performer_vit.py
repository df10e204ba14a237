"""Performer-ViT on Fashion-MNIST: test accuracy of exact, IID, ORF and SimRF attention.

For every attention variant (``"exact"`` softmax, or a coupling name for a Performer with that
coupling) and seed, a ``rfjax.nn.PerformerViT`` is trained with ``experiments.train`` in
``workdir/runs/<variant>_seed<k>`` (resumable: an interrupted experiment started again skips
finished runs and continues the others from their checkpoints). The test set is evaluated every
``eval_every_steps`` (learning curves) and at the end (final accuracy), Performers with the
projection of the last update (``projection_step = step - 1``). Writes ``results.json``
and ``results.csv`` (one row per run), ``summary.md`` (mean ± std per variant),
``learning_curves.png`` and ``config.json``.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
import optax

from configs.common import require_names, require_positive
from experiments import outputs, train
from rfjax import features, projections
from rfjax.data import load_fashion_mnist
from rfjax.nn import PerformerViT

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {
    "exact": "exact softmax",
    "gaussian": "Performer IID",
    "orthogonal": "Performer ORF",
    "simplex": "Performer SimRF",
    "simplex_plus": "Performer SimRF+",
}


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the attention names, seeds and sizes before anything runs (the trainer options
    are checked by ``train.validate_train_config``).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_names(config, "attentions", ("exact", *projections.available()))
    require_names(config.model, "feature_map", features.available(), prefix="config.model")
    if not config.seeds:
        raise ValueError("config.seeds must hold at least one seed")
    require_positive(config, "eval_batch_size")


def _label(attention: str) -> str:
    return LABELS.get(attention, f"Performer {attention}")


def make_model(config: ml_collections.ConfigDict, attention: str) -> PerformerViT:
    """The ViT of ``config.model`` with exact attention or a Performer with that coupling."""
    kind = {"attention_kind": "exact"} if attention == "exact" else {"coupling": attention}
    return PerformerViT(num_classes=10, **config.model.to_dict(), **kind)


def make_task(
    model: PerformerViT,
    train_arrays: dict,
    test_arrays: dict,
    config: ml_collections.ConfigDict,
    seed: int,
) -> train.Task:
    """Cross-entropy on normalised images; eval: accuracy and loss sums over the test set."""
    mean = float(np.mean(train_arrays["image"]) / 255)
    std = float(np.std(train_arrays["image"]) / 255)

    def normalise(images):
        return (images.astype(jnp.float32) / 255 - mean) / std

    def loss(params, batch, rng, step):
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=True,
            projection_step=step,
            rngs=train.step_rngs(rng, step),
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
        return jnp.mean(losses), {"accuracy": accuracy}

    def eval_metrics(params, batch, rng, step):
        # Evaluate with the projection of the last update (step - 1), the one the parameters were
        # trained with, not the next interval's fresh draw.
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=False,
            projection_step=jnp.maximum(step - 1, 0),
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


def _load(split: str, data_dir: str, limit: int) -> dict[str, np.ndarray]:
    images, labels = load_fashion_mnist(split, data_dir=data_dir)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return {"image": images, "label": labels}


def _plot(curves: dict, path: str) -> None:
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for attention, per_seed in curves.items():
        for axis, (split, name) in zip(
            axes, (("train", "loss"), ("eval", "accuracy")), strict=True
        ):
            series = [
                [(r["step"], r[name]) for r in records if r["split"] == split]
                for records in per_seed
            ]
            steps = np.array([s for s, _ in series[0]])
            values = np.array([[v for _, v in run] for run in series])
            mean, std = values.mean(0), values.std(0)
            axis.plot(steps, mean, label=_label(attention))
            axis.fill_between(steps, mean - std, mean + std, alpha=0.2)
    axes[0].set(xlabel="step", ylabel="train loss", yscale="log", title="training loss")
    axes[1].set(xlabel="step", ylabel="test accuracy", title="test accuracy")
    axes[1].legend()
    outputs.save_figure(figure, path)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains every (attention, seed) and writes the table and curves into ``workdir``."""
    # Written now as well as with the results: a long run that stops early keeps its config.
    outputs.save_config(workdir, config)
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    train_arrays = _load("train", config.data_dir, config.num_train_examples)
    test_arrays = _load("test", config.data_dir, config.num_test_examples)
    runs, curves = [], {}
    for attention in config.attentions:
        model = make_model(config, attention)
        for seed in config.seeds:
            task = make_task(model, train_arrays, test_arrays, config, seed)
            final, run_dir, seconds = train.train_seed(config.train, workdir, attention, seed, task)
            print(
                f"{_label(attention):>18} seed {seed}: test accuracy "
                f"{final['eval_accuracy']:.4f} ({seconds:.0f} s)"
            )
            runs.append(
                {
                    "attention": attention,
                    "seed": seed,
                    "test_accuracy": final["eval_accuracy"],
                    "test_loss": final["eval_loss"],
                    "seconds_this_session": seconds,
                }
            )
            curves.setdefault(attention, []).append(train.read_metrics(run_dir))
    summary = []
    for attention in config.attentions:
        accuracies = np.array([r["test_accuracy"] for r in runs if r["attention"] == attention])
        summary.append(
            {
                "attention": _label(attention),
                "coupling": attention,
                "seeds": len(accuracies),
                "test accuracy (mean ± std)": f"{accuracies.mean():.4f} ± {accuracies.std():.4f}",
                "mean": float(accuracies.mean()),
                "std": float(accuracies.std()),
            }
        )
    outputs.write_json(
        os.path.join(workdir, "results.json"), {"runs": runs, "summary": summary}, indent=2
    )
    table = outputs.markdown_table(
        [{k: v for k, v in row.items() if k not in ("mean", "std")} for row in summary]
    )
    model = config.model
    text = (
        "# Performer-ViT on Fashion-MNIST\n\n"
        f"ViT: {model.num_layers} layers, {model.num_heads} heads, width {model.hidden_size}, "
        f"MLP {model.mlp_dim}, patch {model.patch_size}, m = {model.num_features} random "
        f"features per head (redrawn every {model.redraw_interval} steps); "
        f"{config.train.num_train_steps} steps of batch {config.train.batch_size}; "
        f"{len(train_arrays['label'])} training and {len(test_arrays['label'])} test images; "
        "Performers are evaluated with the projection of their last update; "
        f"std over seeds (population).\n\n{table}\n\n![learning curves](learning_curves.png)\n"
    )
    outputs.save_run(workdir, rows=runs, summary=text, config=config)
    _plot(curves, os.path.join(workdir, "learning_curves.png"))
    print(table)
    return {"runs": runs, "summary": summary}
