"""A harness for multi-process tests: N processes on localhost joined by ``jax.distributed``.

``run_processes(command, num_processes)`` starts ``num_processes`` copies of ``command`` (an
argv list, run from the repository root on CPU), appending to copy i the flags

  --coordinator_address=localhost:PORT --num_processes=N --process_id=i

with a free PORT; CPU collectives go through gloo. ``python -m experiments.main`` takes these
flags (``experiments.main.initialize_distributed``); any other program can parse them and call
``jax.distributed.initialize(coordinator_address, num_processes, process_id)`` first, e.g. a
``python -c`` script or a module of its own. It waits for all copies (killing them all if one
fails or the time runs out, so that none waits for a dead peer) and returns their results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from tests.support import ROOT


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    """What one process of a run left: its index, exit code and output."""

    process_id: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def distributed_flags(port: int, num_processes: int, process_id: int) -> list[str]:
    """The flags that join process ``process_id`` to a run coordinated on ``port``."""
    return [
        f"--coordinator_address=localhost:{port}",
        f"--num_processes={num_processes}",
        f"--process_id={process_id}",
    ]


def cpu_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment on CPU with gloo collectives (and ``extra`` on top)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    env.pop("XLA_FLAGS", None)  # one CPU device per process unless ``extra`` says otherwise
    env.update(extra or {})
    return env


def run_on_forced_devices(argv: Sequence[str], devices: int, *, timeout_s: float = 900.0) -> dict:
    """Runs ``python *argv`` from the repository root in one process on ``devices`` forced CPU
    devices and returns the JSON object on its last output line (the check scripts' way of
    reporting what they measured); fails with the end of its stderr if it fails. It keeps this
    process's other XLA flags (the suite's compile settings, ``conftest.py``)."""
    count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(count)]
    completed = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=cpu_environment({"XLA_FLAGS": " ".join([*flags, f"{count}={devices}"])}),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_processes(
    command: Sequence[str],
    num_processes: int = 2,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> list[ProcessResult]:
    """Runs ``num_processes`` copies of ``command`` joined by ``jax.distributed`` (see the
    module doc); ``env`` adds to ``cpu_environment()``.

    Raises:
      TimeoutError: if they do not all finish within ``timeout_s`` (all are killed).
    """
    port = free_port()
    environment = cpu_environment(env)
    with contextlib.ExitStack() as files:
        # Output to files, not pipes: no process blocks on a full pipe.
        outputs = [
            (
                files.enter_context(tempfile.TemporaryFile("w+")),
                files.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in range(num_processes)
        ]
        processes = [
            subprocess.Popen(
                [*command, *distributed_flags(port, num_processes, index)],
                cwd=ROOT,
                env=environment,
                stdout=out,
                stderr=err,
                text=True,
            )
            for index, (out, err) in enumerate(outputs)
        ]
        try:
            _wait(processes, timeout_s, command)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
        results = []
        for index, (process, (out, err)) in enumerate(zip(processes, outputs, strict=True)):
            out.seek(0)
            err.seek(0)
            results.append(ProcessResult(index, process.returncode, out.read(), err.read()))
    return results


def _wait(processes: list[subprocess.Popen], timeout_s: float, command) -> None:
    """Waits until all ``processes`` end, or one fails (then 5 s more for the others to report
    it), or ``timeout_s`` passes (``TimeoutError``)."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in processes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(processes)} processes of {command} ran past {timeout_s} s")
        if any(p.poll() not in (None, 0) for p in processes):
            time.sleep(5)
            return
        time.sleep(0.1)
