"""A run's state in ``workdir/status.json``: what it is doing, which process runs it, and
whether that process is still alive.

The file holds ``state`` (``running``, ``done``, ``failed``, ``interrupted``, or ``waiting``:
a worker of a shared sweep left while other workers' cells were missing, listed in
``missing``), ``time`` (UTC, when the state was set), ``command``, ``pid``, ``host`` and
``heartbeat`` (UTC), which a running process refreshes every ``HEARTBEAT_SECONDS``. It is
written atomically (``outputs.write_json``), by process 0 of a multi-process run.

A process killed with SIGKILL (or a lost machine) cannot say that it stopped, so ``read``
judges a ``running`` status: it reads as ``dead`` when its process no longer exists (on this
host) or its heartbeat is older than ``STALE_HEARTBEATS`` intervals and ``STALE_MIN_SECONDS``
(on any host).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import socket
import threading
from collections.abc import Sequence

from experiments.core import outputs

STATUS_FILE = "status.json"
HEARTBEAT_SECONDS = 30.0
STALE_HEARTBEATS = 4  # a running status whose heartbeat missed this many intervals is dead,
STALE_MIN_SECONDS = 60.0  # and at least this long (a busy machine delays a beat)
STATES = ("running", "done", "failed", "interrupted", "waiting")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _timestamp(moment: datetime.datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


class Status:
    """The status file of one process's run in ``workdir``; ``set`` writes a state.

    While the state is ``running`` a daemon thread refreshes the heartbeat every
    ``interval_s`` seconds; any other state stops it (``close`` too). Only process 0 of a
    multi-process run writes.

    Args:
      workdir: the run's folder (created if missing).
      command: the command line that runs it (recorded as one string).
      interval_s: seconds between heartbeats (default ``HEARTBEAT_SECONDS``).
    """

    def __init__(
        self, workdir: str, command: Sequence[str] | None, *, interval_s: float | None = None
    ):
        self.path = os.path.join(workdir, STATUS_FILE)
        self.interval_s = HEARTBEAT_SECONDS if interval_s is None else interval_s
        self.record: dict = {
            "command": shlex.join(command or []),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "heartbeat_seconds": self.interval_s,
        }
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def set(self, state: str, **fields) -> None:
        """Writes ``state`` (one of ``STATES``) with ``fields`` (an ``error``, the ``missing``
        cells); heartbeats go on only while it is ``running``."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        if state != "running":
            self.close()
        with self.lock:
            now = _timestamp(_now())
            self.record = {
                "state": state,
                "time": now,
                **{k: v for k, v in self.record.items() if k not in ("state", "time")},
            }
            for key in ("error", "missing"):
                self.record.pop(key, None)
            self.record.update(fields, heartbeat=now)
            outputs.write_json(self.path, self.record)
        if state == "running" and self.thread is None and outputs.is_writer():
            self.stop.clear()
            self.thread = threading.Thread(target=self._beat, name="status heartbeat", daemon=True)
            self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(self.interval_s):
            with self.lock:
                if self.stop.is_set():
                    return
                self.record["heartbeat"] = _timestamp(_now())
                outputs.write_json(self.path, self.record)

    def close(self) -> None:
        """Stops the heartbeat (the file keeps the last state)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def __enter__(self) -> Status:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def read(workdir: str) -> dict | None:
    """The status of ``workdir`` (None if it has none), with ``state`` ``dead`` (and the
    reason in ``dead_because``) for a ``running`` status whose process is gone from this host
    or whose heartbeat is older than ``STALE_HEARTBEATS`` intervals (and ``STALE_MIN_SECONDS``).

    Raises:
      ValueError: naming the file, if it is not a status JSON object.
    """
    path = os.path.join(workdir, STATUS_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        try:
            status = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not a JSON status ({error})") from None
    if not isinstance(status, dict) or status.get("state") != "running":
        return status
    reason = _death(status)
    if reason:
        status = {**status, "state": "dead", "dead_because": reason}
    return status


def _death(status: dict) -> str:
    """Why a ``running`` status's process is dead, or "" if it may be alive."""
    if "pid" not in status or "heartbeat" not in status:
        return "it records no process and no heartbeat (written before they were recorded)"
    if status.get("host") == socket.gethostname() and not _process_exists(status["pid"]):
        return f"its process {status['pid']} on {status['host']} no longer exists"
    beat = datetime.datetime.fromisoformat(status["heartbeat"])
    silent = (_now() - beat).total_seconds()
    interval = float(status.get("heartbeat_seconds", HEARTBEAT_SECONDS))
    if silent > max(STALE_HEARTBEATS * interval, STALE_MIN_SECONDS):
        return f"its last heartbeat was {silent:.0f} s ago (every {interval:g} s expected)"
    return ""
