"""Real query/key pairs for the estimator zoo: trains one Performer-ViT on Fashion-MNIST and
saves the per-head queries and keys it attends with on test images.

Usage (minutes on 2 CPU cores; Fashion-MNIST as for ``configs/performer_vit.py``):
  python -m experiments.estimator_zoo.vit --output=results/estimator_zoo/vit_queries_keys.npz

The model is the ``performer_vit`` config's ``small`` model (2 layers, 2 heads of dimension 16,
FAVOR+ with m = 32 orthogonal features, one fixed projection, 1000 steps), trained with the
shared trainer (``experiments.core.train.trainer``: Flax, optax, Orbax checkpoints in
``--workdir``). The
output holds ``queries`` and ``keys`` of shape ``(images, layers, tokens, heads, head_dim)``
(``PerformerAttention``'s sown ``query_heads`` / ``key_heads``, before the 1/sqrt(H) of the
softmax), the test accuracy with the run's own projection, and the run's settings.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from configs import performer_vit as vit_config
from experiments import performer_vit
from experiments.core import records, sweep
from experiments.core.train import trainer as train

COUPLING = "orthogonal"


def train_and_extract(workdir: str, num_images: int, seed: int) -> dict[str, Any]:
    """Trains (or resumes) the run in ``workdir`` and returns the arrays to save."""
    config = vit_config.get_config("small")
    config.data_dir = os.environ.get("RFJAX_FASHION_MNIST_DIR") or config.data_dir
    arrays = performer_vit.load_arrays(config)
    model = performer_vit.make_model(config, COUPLING)
    task = performer_vit.make_task(model, arrays["train"], arrays["test"], config, seed, "fixed")
    # The run's folder is a cell with its identity: a run of another config is moved aside.
    sweep.start_cell(workdir, "vit", seed, records.settings(config))
    final, run_dir, seconds = train.train_seed(config.train, workdir, "vit", seed, task)
    params = train.final_params(run_dir)
    mean, std = performer_vit.pixel_stats(arrays["train"]["image"])
    images = (jnp.asarray(arrays["test"]["image"][:num_images], jnp.float32) / 255 - mean) / std
    layers = performer_vit.queries_and_keys(model, params, images)
    out: dict[str, Any] = {
        "queries": np.stack([np.asarray(q) for q, _ in layers], axis=1),
        "keys": np.stack([np.asarray(k) for _, k in layers], axis=1),
        "test_accuracy": np.float64(final["eval_accuracy"]),
        "train_seconds": np.float64(seconds),
        "num_features": np.int64(config.model.num_features),
        "seed": np.int64(seed),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="results/estimator_zoo/vit_queries_keys.npz")
    parser.add_argument("--workdir", default="workdirs/estimator_zoo_vit")
    parser.add_argument("--num_images", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.num_images < 1:
        raise ValueError(f"--num_images must be >= 1, got {args.num_images}")
    arrays = train_and_extract(args.workdir, args.num_images, args.seed)
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    np.savez_compressed(args.output, **arrays)
    print(
        f"test accuracy {float(arrays['test_accuracy']):.4f} after "
        f"{float(arrays['train_seconds']):.0f} s; queries {arrays['queries'].shape} -> "
        f"{args.output}"
    )


if __name__ == "__main__":
    main()
