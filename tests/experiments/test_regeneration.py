"""Every committed report regenerates from its committed records, as ``python -m
experiments.regenerate`` writes it: a change to a study's reporting code, the core or a template
that moves a number, an outcome or a sentence of a committed summary fails here until the results
are regenerated and committed with it (``git diff results/`` then shows what moved).

Compared: every text file a report writes (``summary.md``, ``verdicts.json``, tables); figures
are not compared, since their bytes depend on matplotlib's version and fonts.
"""

from __future__ import annotations

import pathlib
import shutil

import matplotlib
import pytest

from experiments import regenerate
from experiments.core import records
from tests.support import ROOT

matplotlib.use("Agg")

RESULTS = ROOT / "results"
FOLDERS = sorted(p.parent.name for p in RESULTS.glob(f"*/{records.RECORDS_FILE}"))
TEXT_SUFFIXES = {".md", ".json", ".csv"}


def _texts(folder: pathlib.Path) -> dict[str, bytes]:
    """The report's text files of ``folder`` (not its runs' own files), by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.suffix in TEXT_SUFFIXES and "runs" not in path.relative_to(folder).parts
    }


def test_every_results_folder_with_records_is_checked():
    assert len(FOLDERS) >= 20, FOLDERS  # the guard on the discovery itself


@pytest.mark.integration
@pytest.mark.parametrize("name", FOLDERS)
def test_committed_report_regenerates_from_its_records(name, tmp_path):
    copy = tmp_path / name
    shutil.copytree(RESULTS / name, copy, ignore=shutil.ignore_patterns("*.png", "runs"))
    runs = RESULTS / name / "runs"
    if runs.exists():  # some reports read their runs' logs (learning curves)
        shutil.copytree(runs, copy / "runs")
    committed = _texts(copy)
    regenerate.regenerate(str(copy))
    regenerated = _texts(copy)
    changed = sorted(p for p in committed if regenerated.get(p) != committed[p])
    assert not changed, (
        f"results/{name}: {changed} differ from what the committed records regenerate; run "
        f"python -m experiments.regenerate {name} and commit the result"
    )
