"""A toy study for tests of shared ablations: one worker process of
``experiments.main``'s ablation runner over the toy training task of ``toy_training``.

Usage: python tests/support/toy_study.py WORKDIR --worker=I/N --worker_wait=S [--steps=N]
[--optimizer=NAME] [--kill_at_record] [--sweep=FIELD=V1,V2] [--seeds=0:2]

The study ``experiments.toy_study`` (registered in ``sys.modules``; no configs/ file) trains
the toy task for ``train.num_train_steps`` steps in the cell's folder (0 steps: no training,
the record is a function of the cell) and reports its eval accuracy and loss. With
``--kill_at_record`` this process SIGKILLs itself while it writes its first cell record,
after the record's text is written and before the file replaces the old one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import types

# The repository root: tests/ (the toy task), configs/ and experiments/ (not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ml_collections

from experiments import main as experiments_main
from experiments.core import outputs, sweep
from experiments.core.train import trainer as train
from tests.support.toy_training import toy_config, toy_task

SEED_FIELD = "train.seed"


def get_config(steps: int, optimizer: str) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "toy_study"
    config.powered = False
    config.trains = steps > 0  # False: no training, the record is a function of the cell
    config.train = toy_config(max(steps, 1))  # valid trainer options either way
    config.train.optimizer = optimizer
    return config


def validate_config(config: ml_collections.ConfigDict) -> None:
    del config  # its trainer options are checked by the ablation runner


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    seed = config.train.seed
    if not config.trains:
        return {"accuracy": 0.5 + 0.01 * seed + config.train.learning_rate, "loss": 1.0}
    final = train.train_and_evaluate(config.train, workdir, toy_task(seed))
    return {"accuracy": final["eval_accuracy"], "loss": final["train_loss"]}


def headline(measured: dict) -> dict:
    return dict(measured)


def _kill_while_writing_a_record() -> None:
    """SIGKILLs the process inside the first atomic write of a cell record, before the
    temporary file replaces ``result.json``."""
    replacing = outputs.replacing

    @contextlib.contextmanager
    def dying(path: str, newline: str | None = None):
        with replacing(path, newline) as handle:
            yield handle
            if os.path.basename(path) == sweep.RECORD_FILE:
                handle.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    outputs.replacing = dying


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--worker", default="0/1")
    parser.add_argument("--worker_wait", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--sweep", default="train.learning_rate=0.01,0.03")
    parser.add_argument("--seeds", default="0:2")
    parser.add_argument("--kill_at_record", action="store_true")
    args = parser.parse_args()
    sys.modules["experiments.toy_study"] = types.ModuleType("experiments.toy_study")
    module = sys.modules["experiments.toy_study"]
    for name in ("SEED_FIELD", "validate_config", "measure", "headline"):
        setattr(module, name, globals()[name])
    if args.kill_at_record:
        _kill_while_writing_a_record()
    sweep.WORKER = experiments_main.parse_worker(args.worker)
    sweep.WAIT_SECONDS = args.worker_wait
    experiments_main.run_ablation(
        get_config(args.steps, args.optimizer),
        args.workdir,
        ["python", "tests/support/toy_study.py", *sys.argv[1:]],
        sweep_text=args.sweep,
        seeds_text=args.seeds,
        metric="accuracy",
    )


if __name__ == "__main__":
    main()
