"""Writing experiment outputs: CSV, JSON and markdown tables, figures and progress reports."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import string
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import IO

import jax
import ml_collections
from tqdm.auto import tqdm

from rfjax import projections

# Short names of the couplings in tables and legends (the papers' names), from the registry.
COUPLING_LABELS = {name: projections.info(name).label for name in projections.available()}


def is_writer() -> bool:
    """Whether this process writes results: process 0 of a multi-process run (the others
    compute the same results and write nothing, so that files on shared storage are written
    once)."""
    return jax.process_index() == 0


_UMASK = os.umask(0o022)  # read once (os.umask can only set it), then restored
os.umask(_UMASK)


@contextlib.contextmanager
def replacing(path: str, newline: str | None = None, *, binary: bool = False) -> Iterator[IO]:
    """A text (or ``binary``) handle whose content replaces ``path`` at once when the block
    ends (creating its folder): written to a temporary file beside it, flushed to disk, then
    ``os.replace``d, so a reader (another worker, a resumed run) sees the old file or the
    whole new one, never a part, whenever the writer is killed. An error in the block leaves
    ``path`` as it was."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        os.chmod(temporary, 0o666 & ~_UMASK)  # as open(path, "w") would (mkstemp: 0o600)
        opened = (
            os.fdopen(descriptor, "wb") if binary else os.fdopen(descriptor, "w", newline=newline)
        )
        with opened as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def write_csv(path: str, rows: Sequence[dict]) -> None:
    """Writes ``rows`` (dicts with the same keys) as a CSV file with a header (process 0;
    atomically, ``replacing``)."""
    if not is_writer():
        return
    with replacing(path, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_csvs(workdir: str, tables: Mapping[str, Sequence[dict]]) -> None:
    """Writes each ``{file name: rows}`` of ``tables`` into ``workdir`` (``write_csv``)."""
    for name, rows in tables.items():
        write_csv(os.path.join(workdir, name), rows)


def read_csv(path) -> list[dict[str, str]]:
    """The rows of a CSV file written by ``write_csv``, as dicts of strings."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def select(rows: Iterable[dict], columns: Sequence[str] | Mapping[str, str]) -> list[dict]:
    """The rows with only ``columns``: names, or a mapping {shown name: key in the row}.

    Examples:
      >>> select([{"a": 1, "b": 2, "c": 3}], ("c", "a"))
      [{'c': 3, 'a': 1}]
      >>> select([{"a": 1, "b": 2}], {"A": "a"})
      [{'A': 1}]
    """
    pairs = columns.items() if isinstance(columns, Mapping) else [(c, c) for c in columns]
    return [{shown: row[key] for shown, key in pairs} for row in rows]


def markdown_table(rows: Sequence[dict], float_format: str = "{:.4g}") -> str:
    """Formats ``rows`` as a GitHub markdown table (floats with ``float_format``)."""
    header = list(rows[0])

    def cell(value):
        return float_format.format(value) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(row[key]) for key in header) + " |" for row in rows]
    return "\n".join(lines)


# Seconds between progress lines when stderr is not a terminal (logs, CI, nohup).
PROGRESS_INTERVAL_S = 30.0

# The experiments package: a study's summary template is ``experiments/<study>/summary.md``.
EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nan_note(columns: str, reasons: Mapping[str, str]) -> str:
    """A note for under a table: why ``columns`` are nan for the names with a non-empty reason
    ("" if none has one)."""
    missing = {name: reason for name, reason in reasons.items() if reason}
    if not missing:
        return ""
    because = " ".join(f"{name}: {reason}." for name, reason in missing.items())
    return f"{columns} are nan for {', '.join(missing)}, which have no closed form. {because}"


class _SummaryTemplate(string.Template):
    """``string.Template`` whose placeholders may be dotted, ``$config.train.num_train_steps``."""

    idpattern = r"(?a:[_a-z][_a-z0-9]*(?:\.[_a-z][_a-z0-9]*)*)"


def _config_value(config: ml_collections.ConfigDict, path: str) -> object:
    value: object = config
    for key in path.split("."):
        value = value[key]  # type: ignore[index]
    return value


def render_summary(
    name: str, config: ml_collections.ConfigDict | None = None, **values: object
) -> str:
    """The summary text of experiment ``name``: ``experiments/<name>/summary.md`` with its
    ``$placeholders`` (``string.Template`` syntax; ``$$`` is a literal ``$``) filled from
    ``values`` and, for ``$config.<path>`` (a dotted path into ``config``), from the config
    (formatted with ``str``).

    Raises:
      FileNotFoundError: if the template does not exist (the message gives its path).
      ValueError: if a placeholder has no value or a value has no placeholder (both listed).
    """
    path = os.path.join(EXPERIMENTS, name, "summary.md")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no summary template for experiment {name!r} at {path}")
    with open(path) as handle:
        template = _SummaryTemplate(handle.read())
    placeholders = set(template.get_identifiers())
    if config is not None:
        values = {
            **values,
            **{
                key: _config_value(config, key.removeprefix("config."))
                for key in placeholders
                if key.startswith("config.")
            },
        }
    missing, unused = sorted(placeholders - set(values)), sorted(set(values) - placeholders)
    if missing or unused:
        raise ValueError(
            f"summary template {path}: placeholders without values {missing}, values without "
            f"placeholders {unused}"
        )
    return template.substitute({key: str(value) for key, value in values.items()})


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path``, creating its folder (process 0; atomically,
    ``replacing``)."""
    if not is_writer():
        return
    with replacing(path) as handle:
        handle.write(text)


def write_json(path: str, data, indent: int = 1) -> None:
    """Writes ``data`` (JSON-serialisable) to ``path``, creating its folder (process 0;
    atomically, ``replacing``: a record or status is never read half-written)."""
    if not is_writer():
        return
    with replacing(path) as handle:
        json.dump(data, handle, indent=indent)


def save_config(workdir: str, config: ml_collections.ConfigDict) -> str:
    """Writes ``config`` as ``workdir/config.json``; returns the path."""
    path = os.path.join(workdir, "config.json")
    write_json(path, config.to_dict())
    return path


def save_figure(fig, path: str, *, layout: bool = True) -> None:
    """Lays out ``fig`` (unless ``layout`` is False: a figure that places its own axes, such
    as a colour bar spanning panels), saves it to ``path`` (120 dpi; process 0; atomically,
    ``replacing``, in the format of the path's extension) and closes it."""
    import matplotlib.pyplot as plt  # here: the experiments choose the backend first

    if is_writer():
        if layout:
            fig.tight_layout()
        kind = os.path.splitext(path)[1].lstrip(".") or "png"
        with replacing(path, binary=True) as handle:  # bbox: keeps legends outside the axes
            fig.savefig(handle, format=kind, dpi=120, bbox_inches="tight")
    plt.close(fig)


class Progress:
    """Progress of a long phase: a tqdm bar on a terminal, periodic lines elsewhere.

    When stderr is a terminal, a tqdm bar (cleared at the end). Otherwise (logs, CI, ``nohup``)
    a line on stdout at most every ``interval_s`` seconds, ``description: done/total (percent),
    rate, elapsed, time left[, note]``, and a last line with the total time if any was printed
    (a phase shorter than ``interval_s`` stays silent), ending in ``done``, or in
    ``interrupted`` (Ctrl-C, SIGTERM) or ``stopped by <error>`` when the phase ends early.

    Args:
      description: what is being counted (first word of each line).
      total: the number of items, or None if unknown.
      initial: items already done (a resumed phase).
      unit: the name of one item in the rate ("it", "steps", ...).
      interval_s: seconds between lines when not on a terminal (default
        ``PROGRESS_INTERVAL_S``).
    """

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        initial: int = 0,
        unit: str = "it",
        interval_s: float | None = None,
    ):
        self.description, self.total, self.unit = description, total, unit
        self.initial = self.done = initial
        self.interval_s = PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self.note = ""
        self.start = self.last_line = time.monotonic()
        self.lines = 0
        self.bar = (
            tqdm(total=total, initial=initial, desc=description, unit=unit, leave=False)
            if sys.stderr.isatty()
            else None
        )

    def update(self, count: int = 1) -> None:
        """Counts ``count`` more items done."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.done != self.total and time.monotonic() - self.last_line >= self.interval_s:
            self._line()  # (the last item's line is close()'s)

    def set_note(self, note: str) -> None:
        """Text shown after the counts (e.g. the latest loss)."""
        self.note = note
        if self.bar is not None:
            self.bar.set_postfix_str(note)

    def write(self, text: str) -> None:
        """Prints ``text`` on its own line (above the bar on a terminal)."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self, outcome: str = "done") -> None:
        """Ends the phase; the last line (if any was printed) ends in ``outcome``."""
        if self.bar is not None:
            self.bar.close()
        elif self.lines:
            self._line(final=outcome)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.close(_outcome(exc_type))

    def _line(self, final: str | None = None) -> None:
        now = time.monotonic()
        elapsed = now - self.start
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        if self.total:
            count += f" ({100 * self.done / self.total:.0f}%)"
        parts = [f"{self.description}: {count}"]
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            parts.append(f"{rate:.3g} {self.unit}/s")
        parts.append(f"{format_duration(elapsed)} elapsed")
        if self.total and rate > 0 and not final:
            parts.append(f"~{format_duration((self.total - self.done) / rate)} left")
        if final:
            parts.append(final)
        if self.note:
            parts.append(self.note)
        print(", ".join(parts), flush=True)
        self.last_line = now
        self.lines += 1


def _outcome(exc_type: type[BaseException] | None) -> str:
    """How a phase ended, for its last progress line."""
    if exc_type is None:
        return "done"
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):  # SystemExit: SIGTERM's exit
        return "interrupted"
    if issubclass(exc_type, GeneratorExit):  # ``progress`` closed before its last item
        return "stopped"
    return f"stopped by {exc_type.__name__}"


def format_duration(seconds: float) -> str:
    """``seconds`` as "42 s", "3.5 min" or "1.2 h"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def progress(items: Iterable, description: str, total: int | None = None, **options) -> Iterator:
    """Iterates over ``items`` showing a ``Progress`` (a bar on a terminal, periodic lines in
    logs); ``options`` go to ``Progress``."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with Progress(description, total, **options) as display:
        for item in items:
            yield item
            display.update()


def run_cost(train_seconds: float, cpu_start: float) -> dict[str, float]:
    """The timing fields of one training run's row (read by ``timing_text``): its training
    wall time over all sessions (``train_seconds``, as ``train.train_seed`` returns it), the
    process CPU time of this session since ``cpu_start`` (``time.process_time()`` when the run
    began) and the machine's 1-min load average now."""
    return {
        "train_seconds": train_seconds,
        "cpu_seconds_this_session": time.process_time() - cpu_start,
        "load_average": os.getloadavg()[0],
    }


def timing_text(runs: Sequence[dict]) -> str:
    """The measured time of a sweep's training runs, for summaries: the sum of the rows'
    ``train_seconds`` (wall, over all sessions of each run) and ``cpu_seconds_this_session``
    (process CPU time in the session that finished the run), and the mean of their
    ``load_average`` (the machine's 1-min load when each run ended)."""
    seconds = sum(r["train_seconds"] for r in runs)
    cpu_seconds = sum(r["cpu_seconds_this_session"] for r in runs)
    load = sum(r["load_average"] for r in runs) / len(runs)
    return (
        f"{len(runs)} runs took {seconds / 60:.1f} min wall clock of training (over all "
        f"sessions) and {cpu_seconds / 60:.1f} min of process CPU time for training and "
        f"evaluation in the session that finished them; the machine was shared, with a mean "
        f"1-min load average of {load:.1f} when the runs ended"
    )
