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


def run_experiment(config, workdir: str | None = None) -> dict:
    """Runs ``config.experiment`` with outputs in ``workdir``; returns its summary."""
    name = config.experiment
    workdir = workdir or os.path.join("workdirs", name)
    os.makedirs(workdir, exist_ok=True)
    module = importlib.import_module(f"experiments.{name}")
    return module.run(config, workdir)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    workdir = _WORKDIR.value or os.path.join("workdirs", _CONFIG.value.experiment)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "command.txt"), "w") as handle:  # for the results page
        handle.write(shlex.join(["python", "-m", "experiments.main", *sys.argv[1:]]) + "\n")
    run_experiment(_CONFIG.value, workdir)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
