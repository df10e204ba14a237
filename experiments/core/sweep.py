"""One arm x seed runner over records stored with the settings they were made under.

A sweep measures every cell (an arm, e.g. an attention kind or a feature map, and a seed) into
``workdir/runs/<arm>_seed<seed>/``, where the cell's measurement is stored as ``result.json``
with the settings it was made under. A cell whose record matches the current settings is
reused, any other is measured (a trainer resumes it from its checkpoint): so an interrupted
sweep resumes, a committed sweep is extended by seeds without its checkpoints, and a change of
settings measures again. Seeds are the outer loop, so an interrupted sweep leaves complete
pairs.

Several independent processes share a sweep through ``worker=(index, count)``: each measures
the cells ``index, index + count, ...`` (in the order above) and the sweep is complete when
every cell has a record; until then ``run`` raises ``Pending`` with the missing cells
(``experiments.main --worker=I/N`` sets this process's share; the last worker to finish
reports).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments.core import outputs
from experiments.core.validate import require_distinct_seeds

RECORD_FILE = "result.json"


class Pending(Exception):  # noqa: N818 (a state, not a failure)
    """A sweep shared by workers is not complete yet: the cells without a record."""

    def __init__(self, missing: list[tuple[str, int]]):
        super().__init__(f"{len(missing)} cells wait for other workers: {missing}")
        self.missing = missing


# This process's share of every sweep, (index, count): ``experiments.main --worker=I/N``.
WORKER = (0, 1)


def run_dir(workdir: str, arm: str, seed: int) -> str:
    """The folder of one cell, ``workdir/runs/<arm>_seed<seed>``."""
    return os.path.join(workdir, "runs", f"{arm}_seed{seed}")


def read(directory: str, settings: Mapping[str, Any]) -> dict | None:
    """The record in ``directory`` when it was made under ``settings`` (as JSON stores them);
    None when there is none, it was made under other settings or it cannot be read (a file cut
    short or not a record: reported with its path)."""
    path = os.path.join(directory, RECORD_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            stored = json.load(handle)
        if not (isinstance(stored, dict) and {"settings", "run"} <= set(stored)):
            raise ValueError("not a record: it needs 'settings' and 'run'")
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        print(f"{path}: unreadable record ({error}); measuring the cell again", flush=True)
        return None
    if stored["settings"] != json.loads(json.dumps(settings)):
        print(f"{path}: recorded under other settings; measuring the cell again")
        return None
    return stored["run"]


def write(directory: str, settings: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """Stores one cell's ``record`` with the ``settings`` it was made under (process 0)."""
    outputs.write_json(
        os.path.join(directory, RECORD_FILE), {"settings": dict(settings), "run": dict(record)}
    )


def run(
    workdir: str,
    arms: Sequence[str],
    seeds: Sequence[int],
    measure: Callable[[str, int, str], Mapping[str, Any]],
    settings: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
    *,
    worker: tuple[int, int] | None = None,
) -> list[dict]:
    """Measures every (seed, arm) cell that has no record under its settings.

    Args:
      workdir: the sweep's folder (cells in ``runs/``).
      arms, seeds: the cells, seeds outside.
      measure: ``(arm, seed, run_dir) -> record`` (JSON-serialisable) of one cell.
      settings: what a cell's measurement depends on (the config less its seeds and other
        cells' arms), one mapping for every arm or a function of the arm.
      worker: ``(index, count)``: this process measures every ``count``-th cell from ``index``
        (default ``WORKER``).

    Returns:
      The records in cell order, each with ``arm`` and ``seed`` (and ``seconds``, the wall time
      of a cell measured now).

    Raises:
      Pending: when cells of other workers have no record yet.
      ValueError: for a repeated seed (naming it) or a bad ``worker``.
    """
    index, count = WORKER if worker is None else worker
    if not 0 <= index < count:
        raise ValueError(f"worker must be (index, count) with 0 <= index < count, got {worker}")
    require_distinct_seeds(seeds, "seeds")
    cells = [(arm, seed) for seed in seeds for arm in arms]
    records: dict[tuple[str, int], dict] = {}
    for position, (arm, seed) in enumerate(cells):
        directory = run_dir(workdir, arm, seed)
        arm_settings = settings(arm) if callable(settings) else settings
        record = read(directory, arm_settings)
        if record is None and position % count == index:
            began = time.perf_counter()
            record = {**measure(arm, seed, directory), "arm": arm, "seed": seed}
            record.setdefault("seconds", time.perf_counter() - began)
            write(directory, arm_settings, record)
        if record is not None:
            records[arm, seed] = {**record, "arm": arm, "seed": seed}
    missing = [cell for cell in cells if cell not in records]
    if missing:
        raise Pending(missing)
    return [records[cell] for cell in cells]
