"""Runs one experiment from a config file.

Usage:
  python -m experiments.main --config=configs/kernel_mse.py [--workdir=workdirs/kernel_mse]
  python -m experiments.main --config=configs/kernel_mse.py:quick

The config names its experiment (``config.experiment``); the module ``experiments.<name>``
provides ``run(config, workdir)``, which writes its results into ``workdir``.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory (default: workdirs/<experiment>)."
)


def run_experiment(config, workdir: str | None = None, *, command: list[str] | None = None) -> dict:
    """Runs ``config.experiment`` with outputs in ``workdir`` (default ``workdirs/<name>``);
    returns its summary. ``command``, the command line that reproduces the run, is recorded in
    ``workdir/command.txt`` for the results page."""
    name = config.experiment
    workdir = workdir or os.path.join("workdirs", name)
    os.makedirs(workdir, exist_ok=True)
    if command is not None:
        with open(os.path.join(workdir, "command.txt"), "w") as handle:
            handle.write(shlex.join(command) + "\n")
    module = importlib.import_module(f"experiments.{name}")
    return module.run(config, workdir)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    command = ["python", "-m", "experiments.main", *sys.argv[1:]]
    run_experiment(_CONFIG.value, _WORKDIR.value, command=command)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
