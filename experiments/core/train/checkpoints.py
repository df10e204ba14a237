"""The trainer's checkpoints: Orbax ``CheckpointManager`` with a fallback past corrupt steps.

A checkpoint (``workdir/checkpoints/<step>``) holds two items: ``state``, the ``TrainState``
pytree (step, parameters, optimiser state), and ``progress``, a JSON object with what the
trainer needs to continue exactly as an uninterrupted run would: the per-step training metrics
since the last logged record (so the next record averages the same steps) and the training
time so far. Saves are asynchronous (Orbax writes to a temporary directory and renames it when
complete), so a kill during a save leaves the previous checkpoints intact.

Every checkpoint also carries the settings of the run that made it (``Checkpoints(...,
settings=...)``: the trainer's options, and the cell's identity in a sweep: settings, arm and
seed). A restore checks them: a checkpoint made under other settings (or before checkpoints
recorded them) is refused with ``SettingsMismatchError``, which names the fields that differ;
the trainer never continues another run's model.

Restoring tries the newest step first. A checkpoint that does not restore (a damaged file, a
missing item) is reported with its step, path and error, moved to ``workdir/corrupt_checkpoints``
(kept for inspection, and out of the way of the step numbers training will save again), and the
next newest is tried. If checkpoints exist but none restores, ``CheckpointError`` names them all:
the trainer never restarts silently from scratch over a workdir that has checkpoints.

A restore that fails stops at the first bad read while the other TensorStore reads of the same
checkpoint are still in flight; Orbax runs it in an asyncio loop of its own and closes that
loop at once, so those reads would end by calling into a closed loop ("Event loop is closed",
printed as an ignored exception, or a ``PytestUnraisableExceptionWarning`` in whatever test
runs next). Restores therefore run under ``_settled_event_loops``: a loop created meanwhile
lets its pending tasks finish (their errors are the failed restore's, already reported) before
it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from experiments.core import records

CORRUPT_DIRNAME = "corrupt_checkpoints"
SETTINGS_KEY = "settings"  # in a checkpoint's progress item: the settings it was made under


class CheckpointError(RuntimeError):
    """Checkpoints exist in a workdir but none of them restores."""


class SettingsMismatchError(CheckpointError):
    """The checkpoints in a workdir were made under other settings than the run's."""


@dataclasses.dataclass
class TrainingProgress:
    """The ``progress`` item of a checkpoint.

    Attributes:
      pending: per-step training metrics not yet logged, ``{name: [value per step]}`` (float32
        values, exact in JSON).
      elapsed_seconds: training wall time of all sessions up to this checkpoint.
    """

    pending: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    elapsed_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored checkpoint, and the newer ones that could not be restored."""

    step: int
    state: Any
    progress: TrainingProgress
    skipped: tuple[str, ...]  # one line per unrestorable checkpoint: step, path, error


class _SettlingEventLoop(asyncio.SelectorEventLoop):
    """An event loop that, closed with tasks still pending, first runs them to completion."""

    def close(self) -> None:
        pending = [task for task in asyncio.all_tasks(self) if not task.done()]
        if pending and not self.is_running() and not self.is_closed():
            self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        super().close()


class _SettlingEventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _SettlingEventLoop()


@contextlib.contextmanager
def _settled_event_loops() -> Iterator[None]:
    """Event loops created inside (Orbax's, one per restore) finish their tasks before closing
    (module docstring)."""
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_SettlingEventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


class Checkpoints:
    """The checkpoints of one run in ``directory`` (created if missing).

    Args:
      directory: ``workdir/checkpoints``.
      keep: how many of the newest checkpoints to keep (at least 2 leaves a fallback; None
        keeps all).
      settings: what the run depends on (JSON: the trainer's options, the sweep cell's
        identity), stored in every checkpoint and required of every restored one.
    """

    def __init__(self, directory: str, keep: int | None, settings: Mapping[str, Any]):
        self.settings = json.loads(json.dumps(dict(settings)))
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, cleanup_tmp_directories=True
            ),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "progress": ocp.JsonCheckpointHandler(),
            },
        )

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def restore_latest(self, target: Any) -> Restored | None:
        """The newest checkpoint that restores into ``target`` (abstract arrays with
        shardings), or None if there is no checkpoint.

        Raises:
          SettingsMismatchError: if the newest checkpoint that restores was made under other
            settings (naming the fields that differ).
          CheckpointError: if there are checkpoints and none restores.
        """
        skipped: dict[int, str] = {}
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                # The settings first (a small JSON item): another run's state may not even
                # have this run's structure.
                stored = dict(self._restore(step, progress=ocp.args.JsonRestore())["progress"])
                made_under = stored.pop(SETTINGS_KEY, None)
                progress = TrainingProgress(**stored)
            except Exception as error:  # Orbax/TensorStore raise many types for damaged files
                skipped[step] = self._unrestorable(step, error)
                continue
            self._check_settings(step, made_under)
            try:
                state = self._restore(step, state=ocp.args.StandardRestore(target))["state"]
            except Exception as error:
                skipped[step] = self._unrestorable(step, error)
                continue
            self._set_aside(list(skipped))
            return Restored(step, state, progress, tuple(skipped.values()))
        if skipped:
            raise CheckpointError(
                "no checkpoint in "
                f"{self.directory} could be restored:\n  "
                + "\n  ".join(skipped.values())
                + "\nMove or delete them to train from scratch."
            )
        return None

    def _restore(self, step: int, **items: Any) -> Any:
        with _settled_event_loops():
            return self.manager.restore(step, args=ocp.args.Composite(**items))

    def _unrestorable(self, step: int, error: Exception) -> str:
        return (
            f"checkpoint of step {step} at {self.path(step)} could not be restored "
            f"({type(error).__name__}: {_first_line(error)})"
        )

    def _check_settings(self, step: int, made_under: Any) -> None:
        if made_under == self.settings:
            return
        differing = (
            "; ".join(records.differences(made_under, self.settings))
            if isinstance(made_under, dict)
            else "the checkpoint records no settings (made before checkpoints recorded them)"
        )
        raise SettingsMismatchError(
            f"the checkpoint of step {step} at {self.path(step)} was made under other settings "
            f"than this run's ({differing}); refusing to continue another run's model. Run "
            f"with the settings it was made under, or move {self.directory} aside (or delete "
            "it) to train from step 0."
        )

    def _set_aside(self, steps: list[int]) -> None:
        """Moves the checkpoints of ``steps`` to ``../corrupt_checkpoints/<step>``."""
        if not steps:
            return
        if jax.process_index() == 0:
            corrupt = os.path.join(os.path.dirname(self.directory), CORRUPT_DIRNAME)
            os.makedirs(corrupt, exist_ok=True)
            for step in steps:
                destination = os.path.join(corrupt, str(step))
                if os.path.exists(destination):
                    shutil.rmtree(destination)
                shutil.move(self.path(step), destination)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("rfjax checkpoints set aside")
        self.manager.reload()

    def save(self, step: int, state: Any, progress: TrainingProgress) -> None:
        """Starts saving ``state`` and ``progress`` as the checkpoint of ``step`` (asynchronous:
        ``wait`` blocks until it is complete)."""
        stored = {**dataclasses.asdict(progress), SETTINGS_KEY: self.settings}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(stored)
            ),
        )

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def latest_params(directory: str) -> Any:
    """The parameters of the newest checkpoint in ``directory`` as host NumPy arrays."""
    checkpoints = Checkpoints(directory, keep=None, settings={})
    try:
        step = checkpoints.manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {checkpoints.directory}")
        with _settled_event_loops():
            restored = checkpoints.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
            )
    finally:
        checkpoints.close()
    return restored["state"]["params"]


def _first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of ``error``'s message, cut to ``limit`` characters (TensorStore's
    messages append kilobytes of JSON specs)."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else "no message"
    return line if len(line) <= limit else line[:limit] + " ..."
