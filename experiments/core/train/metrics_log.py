"""The trainer's metrics file, ``workdir/metrics.jsonl``: crash-safe appends, torn-line recovery.

One JSON object per line: ``step``, ``split`` ("train" or "eval") and the values. Each record is
appended, flushed and ``fsync``-ed before training goes on, so a kill can tear at most the line
being written, never an earlier one. On resume the file is cut back to the restored checkpoint's
step (the checkpoint is the truth): a torn or empty last line is dropped, and records after that
step go; the cut writes a temporary file and ``os.replace``-s it over the old one, so a kill
during the cut leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping

import jax

from experiments.core import outputs

FILENAME = "metrics.jsonl"

try:  # optional TensorBoard summaries
    from clu import metric_writers as _clu_writers
except ImportError:  # pragma: no cover - clu is optional
    _clu_writers = None


def _record(line: str) -> dict | None:
    """The record on ``line``, or None if it is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or "step" not in record or "split" not in record:
        return None
    return record


def _parse(path: str, text: str) -> tuple[list[dict], bool]:
    """The records of a metrics file's ``text`` and whether its last line was torn.

    Raises:
      ValueError: if a line other than the last is not a JSON record (a torn write can only
        damage the last line, so this is corruption from elsewhere); the message names the file
        and the line.
    """
    lines = text.split("\n")
    # A complete file ends with "\n", so the last element is "": anything else there is a line
    # whose write was cut short.
    torn = lines.pop() != ""
    records = []
    for number, line in enumerate(lines, start=1):
        record = _record(line)
        if record is not None:
            records.append(record)
        elif number == len(lines):
            torn = True  # a complete-looking last line that does not parse: also torn
        else:
            raise ValueError(f"{path}, line {number}: not a metrics record: {line[:120]!r}")
    return records, torn


def read_metrics(workdir: str) -> list[dict]:
    """The records of ``workdir/metrics.jsonl`` (a torn last line is left out)."""
    path = os.path.join(workdir, FILENAME)
    with open(path) as handle:
        return _parse(path, handle.read())[0]


class MetricsWriter:
    """Writes training and evaluation records to ``workdir/metrics.jsonl``, the console and
    TensorBoard (when ``clu`` is installed); only process 0 writes.

    Args:
      workdir: the run's directory.
      resume_step: the step of the restored checkpoint (0 for a fresh run): records after it
        are dropped, as is a torn last line.
      echo: prints one formatted record (default ``print``); the trainer passes its progress
        display's ``write``.
    """

    def __init__(self, workdir: str, resume_step: int, echo: Callable[[str], None] = print) -> None:
        self.path = os.path.join(workdir, FILENAME)
        self.echo = echo
        self.active = jax.process_index() == 0
        self.records: list[dict] = []
        self.written: set[tuple[str, int]] = set()
        self.handle = None
        self.tensorboard = None
        if not self.active:
            return
        if os.path.exists(self.path):
            with open(self.path) as handle:
                text = handle.read()
            records, torn = _parse(self.path, text)
            self.records = [r for r in records if r["step"] <= resume_step]
            if torn or len(self.records) < len(records):
                outputs.write_text(self.path, "".join(map(_line, self.records)))
            self.written = {(r["split"], r["step"]) for r in self.records}
        self.handle = open(self.path, "a")  # noqa: SIM115 - closed by close()
        if _clu_writers is not None:
            self.tensorboard = _clu_writers.SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, split: str, step: int, values: Mapping[str, float]) -> None:
        """Appends one record (once per ``(split, step)``: a record kept from before a resume
        is not written again) and echoes it."""
        if not self.active or (split, step) in self.written:
            return
        self.written.add((split, step))
        record = {"step": step, "split": split, **{k: float(v) for k, v in values.items()}}
        self._append(_line(record))
        self.records.append(record)
        self.echo(f"[{split} step {step}] " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
        if self.tensorboard is not None:
            self.tensorboard.write_scalars(step, {f"{split}/{k}": v for k, v in values.items()})

    def last(self, split: str) -> dict | None:
        """The latest record of ``split`` (None if there is none)."""
        return next((r for r in reversed(self.records) if r["split"] == split), None)

    def _append(self, line: str) -> None:
        if self.handle is None:
            raise ValueError("the metrics log is closed")
        self.handle.write(line)
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def _line(record: dict) -> str:
    return json.dumps(record) + "\n"
