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


def committed_figure_texts(monkeypatch, name: str, workdir: pathlib.Path) -> dict[str, str]:
    """The words of each figure the committed report ``results/<name>`` draws (its titles,
    axis labels and legends), by file name: the study's report rewritten from the committed
    records into ``workdir``, measuring nothing, with ``outputs.save_figure`` capturing the
    figures (as ``experiments.regenerate`` rewrites a report)."""
    import importlib
    import os

    from experiments.core import outputs, records
    from tests.support import ROOT

    texts: dict[str, str] = {}

    def capture(fig, path, **_):
        words = [fig.get_suptitle()]
        for axis in fig.axes:
            words += [axis.get_title(), axis.get_xlabel(), axis.get_ylabel()]
            if (legend := axis.get_legend()) is not None:
                words += [legend.get_title().get_text(), *(t.get_text() for t in legend.texts)]
        texts[os.path.basename(path)] = " | ".join(w for w in words if w)

    monkeypatch.setattr(outputs, "save_figure", capture)
    committed = os.path.join(ROOT, "results", name)
    config = records.load_config(committed)
    study = importlib.import_module(f"experiments.{config.experiment}")
    study.report(records.read(committed), config, str(workdir))
    return texts
