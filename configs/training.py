"""The trainer's options (``experiments.core.train.trainer``), shared by the training
experiments' configs."""

from __future__ import annotations

import ml_collections


def train_config() -> ml_collections.ConfigDict:
    """Defaults for every option ``experiments.core.train.trainer.train_and_evaluate`` reads.

    An experiment config holds this as ``config.train`` and overrides fields; the trainer reads
    each field directly (no hidden defaults).
    """
    config = ml_collections.ConfigDict()
    config.seed = 0  # initialisation, dropout and data order are functions of it (and the step)
    config.num_train_steps = 1_000
    config.batch_size = 128  # global; divisible by the devices over sequence_parallelism
    # Devices that split each sequence (the mesh's "seq" axis;
    # experiments/core/train/distributed.py): 1 but for tasks whose examples are sequences split
    # over devices (Task.sequence_keys).
    config.sequence_parallelism = 1
    config.optimizer = "adamw"  # "adam" | "adamw" | "sgd" (momentum 0.9)
    config.learning_rate = 1e-3
    config.lr_schedule = "cosine"  # "cosine" (to 0 at num_train_steps) | "constant"
    config.warmup_steps = 100  # linear warm-up from 0
    config.weight_decay = 1e-4  # adamw only
    config.grad_clip_norm = 1.0  # global-norm clipping; 0 disables it
    config.log_every_steps = 50
    config.eval_every_steps = 250  # and at the end; 0: only at the end
    config.checkpoint_every_steps = 250  # and at the end
    config.keep_checkpoints = 2  # the newest ones; 2 or more leave a fallback if one is damaged
    config.progress_every_seconds = 30.0  # progress lines when stderr is not a terminal
    return config
