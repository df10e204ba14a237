"""One arm x seed runner over records stored with the settings, arm and seed they were made
under.

A sweep measures every cell (an arm, e.g. an attention kind or a feature map, and a seed) into
``workdir/runs/<arm>_seed<seed>/``, where the cell's measurement is stored as ``result.json``
with its identity: the settings, the arm and the seed it was made under. A cell whose record
has the current identity is reused, any other is measured: so an interrupted sweep resumes, a
committed sweep is extended by seeds without its checkpoints, and a change of settings measures
again. Seeds are the outer loop, so an interrupted sweep leaves complete pairs.

Runs never mix. Before a cell is measured its folder holds ``cell.json``, the identity it is
measured under, and the trainers store that identity in every checkpoint and check it on
restore (``experiments.core.train.checkpoints``). A folder made under another identity (other
settings, a record of another seed copied in, or no ``cell.json``: made before cells recorded
it) is moved aside whole to ``workdir/superseded/<arm>_seed<seed>.<n>/`` (kept, named in the
log with the fields that differ) and the cell is measured from scratch; a folder with its own
identity is resumed (a trainer continues from its checkpoint).

Several independent processes share a sweep through ``worker=(index, count)``: each measures
the cells ``index, index + count, ...`` (in the order above), then re-reads the other workers'
cells every ``POLL_SECONDS`` until every cell has a record or it has waited ``wait_s`` seconds
(``WAIT_SECONDS``; ``experiments.main --worker=I/N --worker_wait=S``); ``run`` raises
``Pending`` with the cells still missing. A cell that another process is measuring (it holds
the cell's lock: a worker started twice) is waited for in the same way, never measured twice at
once. Of the workers that see every record, ``reporting`` elects exactly one to write the
report. A cell is measured whole by one worker: a sweep nested
in it (an ablation of a study that runs its own sweep) is not shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from experiments.core import outputs, records
from experiments.core.validate import require_distinct_seeds

RECORD_FILE = "result.json"
CELL_FILE = "cell.json"
SUPERSEDED_DIR = "superseded"
REPORTED_FILE = ".reported"  # the digest of the records the last report was written from
REPORT_LOCK_FILE = ".report.lock"
CELL_LOCKS_DIR = ".cell_locks"  # <arm>_seed<seed>.lock: held while a process measures it
POLL_SECONDS = 2.0


class Pending(Exception):  # noqa: N818 (a state, not a failure)
    """A sweep shared by workers is not complete yet: the cells without a record."""

    def __init__(self, missing: list[tuple[str, int]]):
        super().__init__(f"{len(missing)} cells wait for other workers: {missing}")
        self.missing = missing


# This process's share of every sweep, (index, count), and how long it waits for the other
# workers' cells after its own: ``experiments.main --worker=I/N --worker_wait=SECONDS``.
WORKER = (0, 1)
WAIT_SECONDS = 600.0


def run_dir(workdir: str, arm: str, seed: int) -> str:
    """The folder of one cell, ``workdir/runs/<arm>_seed<seed>``."""
    return os.path.join(workdir, "runs", f"{arm}_seed{seed}")


def identity(settings: Mapping[str, Any], arm: str, seed: int) -> dict:
    """What a cell's measurement is made under, as JSON stores it: ``settings``, ``arm`` and
    ``seed``."""
    return json.loads(json.dumps({"settings": dict(settings), "arm": arm, "seed": seed}))


def _load(directory: str, expected: dict) -> tuple[dict | None, str]:
    """The record in ``directory`` if it has the ``expected`` identity, else None and why not
    ("" when there is no record)."""
    path = os.path.join(directory, RECORD_FILE)
    if not os.path.exists(path):
        return None, ""
    try:
        with open(path) as handle:
            stored = json.load(handle)
        if not (isinstance(stored, dict) and {"settings", "run"} <= set(stored)):
            raise ValueError("not a record: it needs 'settings' and 'run'")
        run = stored["run"]
        if not isinstance(run, dict):
            raise ValueError("not a record: its 'run' is not an object")
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        return None, f"{path}: unreadable record ({error})"
    # Records written before the identity was stored at the top keep the arm and seed in run.
    made = {
        "settings": stored["settings"],
        "arm": stored.get("arm", run.get("arm")),
        "seed": stored.get("seed", run.get("seed")),
    }
    differing = records.differences(made, expected)
    if differing:
        return None, f"{path}: recorded under another identity ({'; '.join(differing)})"
    return run, ""


def read(directory: str, settings: Mapping[str, Any], *, arm: str, seed: int) -> dict | None:
    """The record in ``directory`` when it was made under ``settings`` for the cell ``(arm,
    seed)``; None (saying why, with the file's path) when there is none, it was made under
    other settings or for another arm or seed (a folder copied from another cell), or it cannot
    be read (cut short, or not a record)."""
    record, why_not = _load(directory, identity(settings, arm, seed))
    if why_not:
        print(f"{why_not}; measuring the cell again", flush=True)
    return record


def write(
    directory: str, settings: Mapping[str, Any], record: Mapping[str, Any], *, arm: str, seed: int
) -> None:
    """Stores one cell's ``record`` with its identity, the ``settings``, ``arm`` and ``seed``
    it was made under (process 0; atomically)."""
    outputs.write_json(
        os.path.join(directory, RECORD_FILE),
        {**identity(settings, arm, seed), "run": dict(record)},
    )


def cell(directory: str) -> dict | None:
    """The identity ``directory`` is measured under (its ``cell.json``, written by
    ``start_cell``), or None when it is not a sweep cell or has no readable identity."""
    path = os.path.join(directory, CELL_FILE)
    try:
        with open(path) as handle:
            stored = json.load(handle)
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


def start_cell(workdir: str, arm: str, seed: int, settings: Mapping[str, Any]) -> str:
    """Readies the folder of the cell ``(arm, seed)`` to be measured under ``settings``: a
    folder made under another identity (or none recorded) is moved whole to
    ``workdir/superseded/<arm>_seed<seed>.<n>/``, and ``cell.json`` records the identity (a
    folder with this identity is kept as it is, to be resumed). Returns the folder."""
    directory = run_dir(workdir, arm, seed)
    expected = identity(settings, arm, seed)
    if not outputs.is_writer():
        _wait_for_identity(directory, expected)  # process 0 readies the folder
        return directory
    made = cell(directory)
    if made == expected:
        return directory
    if os.path.isdir(directory) and os.listdir(directory):
        why = "; ".join(records.differences(made, expected)) if made else "no cell.json"
        destination = _superseded_path(workdir, os.path.basename(directory))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        os.replace(directory, destination)
        print(
            f"{directory} was made under another identity ({why}): moved to {destination}; "
            "measuring the cell from scratch",
            flush=True,
        )
    outputs.write_json(os.path.join(directory, CELL_FILE), expected)
    return directory


def _wait_for_identity(directory: str, expected: dict, timeout_s: float = 600.0) -> None:
    """Waits (the other processes of a multi-process run, on shared storage) until process 0
    has readied ``directory`` for the cell: its ``cell.json`` holds ``expected``. A file, not a
    collective: Orbax runs collectives of its own in background threads."""
    deadline = time.monotonic() + timeout_s
    while cell(directory) != expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{os.path.join(directory, CELL_FILE)} did not get this cell's identity in "
                f"{timeout_s:.0f} s (process 0 writes it on storage every process sees)"
            )
        time.sleep(0.05)


def _superseded_path(workdir: str, name: str) -> str:
    number = 1
    while os.path.exists(path := os.path.join(workdir, SUPERSEDED_DIR, f"{name}.{number}")):
        number += 1
    return path


def run(
    workdir: str,
    arms: Sequence[str],
    seeds: Sequence[int],
    measure: Callable[[str, int, str], Mapping[str, Any]],
    settings: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
    *,
    worker: tuple[int, int] | None = None,
    wait_s: float | None = None,
) -> list[dict]:
    """Measures every (seed, arm) cell that has no record under its identity.

    Args:
      workdir: the sweep's folder (cells in ``runs/``).
      arms, seeds: the cells, seeds outside.
      measure: ``(arm, seed, run_dir) -> record`` (JSON-serialisable) of one cell; ``run_dir``
        holds the cell's identity (``start_cell``) when it is called.
      settings: what a cell's measurement depends on (the config less its seeds and other
        cells' arms), one mapping for every arm or a function of the arm.
      worker: ``(index, count)``: this process measures every ``count``-th cell from ``index``
        (default ``WORKER``).
      wait_s: how long a worker waits for the other workers' cells after its own (default
        ``WAIT_SECONDS``).

    Returns:
      The records in cell order, each with ``arm`` and ``seed`` (and ``seconds``, the wall time
      of a cell measured now).

    Raises:
      Pending: when cells of other workers still have no record after the wait.
      ValueError: for a repeated seed (naming it) or a bad ``worker``.
    """
    index, count = WORKER if worker is None else worker
    if not 0 <= index < count:
        raise ValueError(f"worker must be (index, count) with 0 <= index < count, got {worker}")
    require_distinct_seeds(seeds, "seeds")
    cells = [(arm, seed) for seed in seeds for arm in arms]

    def cell_settings(arm: str) -> Mapping[str, Any]:
        return settings(arm) if callable(settings) else settings

    own = [cell for position, cell in enumerate(cells) if position % count == index]
    found = {}
    for arm, seed in own:
        record = _measured(workdir, arm, seed, measure, cell_settings(arm))
        if record is not None:  # None: another process measures it (waited for below)
            found[arm, seed] = record
    wait = WAIT_SECONDS if wait_s is None else wait_s
    return _with_others(workdir, cells, found, cell_settings, time.monotonic() + wait)


def _measured(
    workdir: str,
    arm: str,
    seed: int,
    measure: Callable[[str, int, str], Mapping[str, Any]],
    settings: Mapping[str, Any],
) -> dict | None:
    """The record of the cell ``(arm, seed)``: read, or measured and stored; None when another
    process is measuring it now (``_cell_lock``)."""
    directory = run_dir(workdir, arm, seed)
    record = read(directory, settings, arm=arm, seed=seed)
    if record is not None:
        return record
    with _cell_lock(workdir, arm, seed) as held:
        if not held:
            print(
                f"{directory} is being measured by another process; waiting for its record",
                flush=True,
            )
            return None
        record, _ = _load(directory, identity(settings, arm, seed))  # recorded meanwhile?
        if record is None:
            start_cell(workdir, arm, seed, settings)
            began = time.perf_counter()
            with _whole_cell():
                record = {**measure(arm, seed, directory), "arm": arm, "seed": seed}
            record.setdefault("seconds", time.perf_counter() - began)
            write(directory, settings, record, arm=arm, seed=seed)
    return record


@contextlib.contextmanager
def _cell_lock(workdir: str, arm: str, seed: int) -> Iterator[bool]:
    """Whether this process holds the cell ``(arm, seed)`` for the block: an exclusive lock on
    ``workdir/.cell_locks/<arm>_seed<seed>.lock`` (outside ``runs/``, whose entries are the
    cells' folders, and outside the folder, which may be moved aside), not waited for. Two
    processes on one workdir (a worker started twice, a job restarted while the old one still
    runs) trained one cell into one folder at once: Orbax's commits of the same step failed in
    both, or one moved the other's live folder aside. The lock goes with its process. The
    processes of one multi-process run measure each cell together (process 0 readies the
    folder), so they take no lock."""
    if jax.process_count() > 1:
        yield True
        return
    path = os.path.join(workdir, CELL_LOCKS_DIR, f"{arm}_seed{seed}.lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _with_others(
    workdir: str,
    cells: list[tuple[str, int]],
    found: dict[tuple[str, int], dict],
    cell_settings: Callable[[str], Mapping[str, Any]],
    deadline: float,
) -> list[dict]:
    """Every cell's record in cell order, re-reading the other workers' cells every
    ``POLL_SECONDS`` until all have one; ``Pending`` with those still missing at ``deadline``
    (a ``time.monotonic`` time)."""
    while True:
        for arm, seed in cells:
            if (arm, seed) not in found:
                expected = identity(cell_settings(arm), arm, seed)
                record, _ = _load(run_dir(workdir, arm, seed), expected)
                if record is not None:
                    found[arm, seed] = record
        missing = [cell for cell in cells if cell not in found]
        if not missing:
            return [{**found[arm, seed], "arm": arm, "seed": seed} for arm, seed in cells]
        if time.monotonic() >= deadline:
            raise Pending(missing)
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))


@contextlib.contextmanager
def _whole_cell() -> Iterator[None]:
    """One worker measures a cell whole: a sweep nested in it (an ablation's cell runs a
    study's sweep) is not shared among the workers."""
    global WORKER
    shared, WORKER = WORKER, (0, 1)
    try:
        yield
    finally:
        WORKER = shared


def records_digest(workdir: str) -> str:
    """A digest of every sweep record under ``workdir`` (``superseded/`` left out): equal for
    the workers of a sweep that see the same complete set of records."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(workdir, "**", RECORD_FILE), recursive=True)):
        relative = os.path.relpath(path, workdir)
        if relative.split(os.sep)[0] == SUPERSEDED_DIR:
            continue
        with open(path, "rb") as handle:
            digest.update(relative.encode() + b"\0" + handle.read() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def reporting(
    workdir: str, *, identity: str, worker: tuple[int, int] | None = None
) -> Iterator[bool]:
    """Whether this process writes the report of the complete sweep in ``workdir``.

    A single process always does. Workers of a shared sweep (``count > 1``) hold an exclusive
    lock on ``workdir/.report.lock`` for the block, so one at a time decides: the first to see
    a set of records (``records_digest``) under a report ``identity`` (what else the report
    depends on: the config, an ablation's metric and claim) that ``workdir/.reported`` does
    not name reports it, and the block's normal end records their digest there; the others
    see it reported. A reporter that dies releases the lock with its process (and names
    nothing), so another worker, or the same command run again, reports. (Without the
    identity, a study with no sweep records, or a new claim over the same records, was never
    reported again.)
    """
    _, count = WORKER if worker is None else worker
    if count == 1:
        yield True
        return
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, REPORT_LOCK_FILE), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            digest = hashlib.sha256(f"{identity}\0{records_digest(workdir)}".encode()).hexdigest()
            marker = os.path.join(workdir, REPORTED_FILE)
            reported = os.path.exists(marker) and open(marker).read() == digest  # noqa: SIM115
            yield not reported
            if not reported:
                outputs.write_text(marker, digest)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
