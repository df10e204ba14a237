"""Trains the toy task of ``toy_training`` in a subprocess that the tests kill or interrupt.

Usage: python tests/support/training_child.py WORKDIR OUT.npz [--kill=metrics:N|checkpoint:N|cut:1]
[--step_delay=SECONDS] [--steps=N] [--signal_at=STEP:SIGNAME]

``--kill=metrics:N`` writes half of the N-th metrics record of this process, then SIGKILLs
itself (a torn line); ``--kill=checkpoint:N`` SIGKILLs itself right after starting the N-th
checkpoint save (Orbax is still writing it); ``--kill=cut:1`` SIGKILLs itself when the metrics
file cut back on resume is about to replace the old one. ``--step_delay`` sleeps before each
training batch, so that a signal sent from outside lands inside the training loop;
``--signal_at=STEP:SIGTERM`` sends the process a signal when the batch of STEP is drawn. On
success it saves the final parameters to OUT.npz and prints the final metrics as JSON on the
last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

# The repository root: tests/ (the toy task), configs/ and experiments/ (not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np

from experiments.core.train import checkpoints, metrics_log
from experiments.core.train import trainer as train
from tests.support.toy_training import leaves, resume_config, signal_at, toy_task, with_batches


def _kill_on_call(owner: type, method: str, call: int, before) -> None:
    """Makes the ``call``-th call of ``owner.method`` run ``before`` and SIGKILL the process."""
    original = getattr(owner, method)
    calls = [0]

    def wrapper(self, *args):
        calls[0] += 1
        if calls[0] != call:
            return original(self, *args)
        before(original, self, *args)
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(owner, method, wrapper)


def _write_half(original, writer, line):
    original(writer, line[: len(line) // 2])


def _start_save(original, manager, *args):
    original(manager, *args)


def _kill_before_replacing_metrics() -> None:
    """SIGKILLs the process when the cut-back metrics file is about to replace the old one."""
    replace = os.replace

    def killing_replace(source, destination):
        if str(destination).endswith(metrics_log.FILENAME):
            os.kill(os.getpid(), signal.SIGKILL)
        replace(source, destination)

    os.replace = killing_replace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("out")
    parser.add_argument("--kill", default="")
    parser.add_argument("--step_delay", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--signal_at", default="")
    args = parser.parse_args()
    if args.kill:
        where, call = args.kill.split(":")
        if where == "metrics":
            _kill_on_call(metrics_log.MetricsWriter, "_append", int(call), _write_half)
        elif where == "checkpoint":
            _kill_on_call(checkpoints.Checkpoints, "save", int(call), _start_save)
        else:
            _kill_before_replacing_metrics()
    task = toy_task()
    if args.step_delay:
        task = with_batches(task, lambda step, batch: time.sleep(args.step_delay))
    if args.signal_at:
        step, name = args.signal_at.split(":")
        task = signal_at(task, int(step), signal.Signals[name])
    final = train.train_and_evaluate(resume_config(args.steps), args.workdir, task)
    np.savez(args.out, *leaves(train.final_params(args.workdir)))
    print(json.dumps(final))


if __name__ == "__main__":
    main()
