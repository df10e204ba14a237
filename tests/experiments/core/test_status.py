"""A run's status file: its state, process, host and heartbeat; a killed run reads as dead."""

import datetime
import json
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from experiments.core import status
from tests.support import ROOT

_RUN_FOREVER = """
import sys, time
from experiments.core import status
status.Status(sys.argv[1], ["python", "run"], interval_s=0.2).set("running")
time.sleep(600)
"""


def _wait_for(path: pathlib.Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.01)


def test_a_running_status_names_its_process_and_beats_until_the_process_is_killed(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", _RUN_FOREVER, str(tmp_path)], cwd=ROOT)
    try:
        _wait_for(tmp_path / "status.json", child)
        alive = status.read(str(tmp_path))
        assert alive["state"] == "running" and alive["command"] == "python run"
        assert alive["pid"] == child.pid and alive["host"] == socket.gethostname()
        first = alive["heartbeat"]
        deadline = time.monotonic() + 60
        while status.read(str(tmp_path))["heartbeat"] == first:  # refreshed while it runs
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    dead = status.read(str(tmp_path))
    assert dead["state"] == "dead" and f"process {child.pid}" in dead["dead_because"]


def test_a_silent_heartbeat_on_another_host_reads_as_dead(tmp_path):
    writer = status.Status(str(tmp_path), ["run"], interval_s=30)
    writer.set("running")
    writer.close()
    stored = json.loads((tmp_path / "status.json").read_text())
    assert status.read(str(tmp_path))["state"] == "running"  # this process, fresh heartbeat
    stored.update(host="elsewhere", heartbeat="2020-01-01T00:00:00+00:00")
    (tmp_path / "status.json").write_text(json.dumps(stored))
    assert "last heartbeat was" in status.read(str(tmp_path))["dead_because"]
    # A status written before pids and heartbeats were recorded cannot be judged alive.
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "time": "x"}))
    assert status.read(str(tmp_path))["state"] == "dead"


def test_states_other_than_running_are_kept_and_a_waiting_worker_names_the_missing_cells(
    tmp_path,
):
    with status.Status(str(tmp_path), ["run"]) as writer:
        writer.set("running")
        writer.set("waiting", missing=[["a", 1]])
    stored = status.read(str(tmp_path))
    assert stored["state"] == "waiting" and stored["missing"] == [["a", 1]]
    assert writer.thread is None  # no heartbeat after running
    with pytest.raises(ValueError, match="state must be one of"):
        writer.set("finished")
    assert status.read(str(tmp_path / "none")) is None


def _running_elsewhere(tmp_path, silent_s: float, interval_s: float) -> None:
    """A running status of a process on another host whose last heartbeat was ``silent_s``
    seconds ago, beating every ``interval_s`` seconds."""
    beat = status._now() - datetime.timedelta(seconds=silent_s)
    stored = {"state": "running", "pid": 1, "host": "elsewhere", "heartbeat_seconds": interval_s}
    stored["heartbeat"] = status._timestamp(beat)
    (tmp_path / "status.json").write_text(json.dumps(stored))


@pytest.mark.parametrize(
    ("silent_s", "interval_s", "dead"),
    [
        (90.0, 30.0, False),  # 3 missed beats of 30 s: a busy machine, not a dead run
        (130.0, 30.0, True),  # more than 4
        (50.0, 1.0, False),  # 50 missed beats of 1 s, but under a minute
        (70.0, 1.0, True),
    ],
)
def test_a_heartbeat_is_stale_after_four_intervals_and_at_least_a_minute(
    tmp_path, silent_s, interval_s, dead
):
    _running_elsewhere(tmp_path, silent_s, interval_s)
    assert (status.read(str(tmp_path))["state"] == "dead") == dead


def test_a_process_of_another_user_is_alive(tmp_path, monkeypatch):
    writer = status.Status(str(tmp_path), ["run"])
    writer.set("running")
    writer.close()

    def not_permitted(pid, signum):
        raise PermissionError(f"operation not permitted on {pid}")

    monkeypatch.setattr(status.os, "kill", not_permitted)
    assert status.read(str(tmp_path))["state"] == "running"


def test_a_state_keeps_no_error_or_missing_cells_of_an_earlier_state(tmp_path):
    with status.Status(str(tmp_path), ["run"]) as writer:
        writer.set("waiting", missing=[["a", 1]])
        writer.set("failed", error="RuntimeError: disk full")
        writer.set("running")
        writer.set("done")
    stored = status.read(str(tmp_path))
    assert stored["state"] == "done" and "error" not in stored and "missing" not in stored
    assert stored["time"] == stored["heartbeat"]  # when the state was set
