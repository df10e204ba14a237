"""The quick run of a study, shared by the tests of its outputs: ``quick_run_fixture``."""

from __future__ import annotations

import pathlib
import types
from typing import Any, NamedTuple

import ml_collections
import pytest

from experiments.main import run_experiment


class QuickRun(NamedTuple):
    """A study run in-process: its config, the folder it wrote and what it returned."""

    config: ml_collections.ConfigDict
    workdir: pathlib.Path
    result: Any


def quick_run_fixture(config_module: types.ModuleType, variant: str = "quick"):
    """A module-scoped ``quick_run`` fixture: the study of ``config_module`` (a ``configs/``
    module) run once through ``experiments.main.run_experiment`` at ``variant`` of its config,
    in a fresh folder, with the command line that reproduces it recorded as a real run records
    it. Assign it in a test module as ``quick_run = quick_run_fixture(configs.<study>)``.
    """
    name = config_module.__name__.rpartition(".")[2]

    @pytest.fixture(scope="module")
    def quick_run(tmp_path_factory) -> QuickRun:
        workdir = tmp_path_factory.mktemp(name)
        config = config_module.get_config(variant)
        command = [
            "python",
            "-m",
            "experiments.main",
            f"--config=configs/{name}.py:{variant}",
            f"--workdir={workdir}",
        ]
        return QuickRun(config, workdir, run_experiment(config, str(workdir), command=command))

    return quick_run
