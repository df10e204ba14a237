"""A config-driven, model-agnostic trainer: data parallel, multi-process, checkpointed,
resumable, interruptible.

In the style of the Flax examples' ``train.py``: an experiment supplies a ``Task`` (how to
initialise parameters, the loss, evaluation metrics and a data iterator factory) and a trainer
config (``configs.training.train_config()``); ``train_and_evaluate(config, workdir, task)`` runs
it. The same trainer serves the Performer ViT, the LSTM LM and the Conformer experiments.

Determinism and resume. Everything random is a function of ``config.seed`` and the step:
parameters are initialised from ``split(key(seed))[0]``; the loss gets the run's base key
``split(key(seed))[1]`` (constant over the run) and the step, and derives per-step randomness
with ``fold_in(rng, step)`` (``step_rngs`` does this for dropout-like streams) and redrawn
projections with ``rfjax.attention.redraw_key(rng, step)``; the data iterator factory is called
with the first step to produce and must yield the batch of step s as a function of (seed, s)
only (``epoch_batches`` does: epoch e = s // steps_per_epoch is shuffled by
``default_rng([seed, e])``). Checkpoints (``experiments.checkpoints``: Orbax, in
``workdir/checkpoints``) are written every ``checkpoint_every_steps``, at the end and on
SIGINT/SIGTERM; they hold the train state, the per-step metrics not yet logged and the
settings the run is made under (``run_settings``: the trainer options and, in a sweep cell, the
cell's settings, arm and seed), so a run started again in the same workdir under the same
settings continues from the newest checkpoint that restores (saying
"resuming from step N") and produces the same batches, keys, parameters (bit-identical on the
same devices) and ``metrics.jsonl`` records as an uninterrupted run, whatever
``checkpoint_every_steps`` and ``log_every_steps`` are; under other settings it refuses
(``SettingsMismatchError``, naming the fields that differ) rather than continue another run's
model (the sweep moves such a folder aside before it measures a cell). The metrics file
(``experiments.metrics_log``: one JSON record per line, ``step``, ``split`` = "train" | "eval",
values) is appended with an ``fsync`` per record and cut back to the restored step on resume;
a torn last line left by a kill is dropped. Train records hold the means over the logging
interval's steps, except ``learning_rate``: the rate of the interval's last update.

Interrupts. SIGINT (Ctrl-C) and SIGTERM (pre-emption) stop training after the current step:
the trainer saves a checkpoint, says how to resume and raises ``TrainingInterrupted`` (a
``SystemExit`` with code 128 + signal number, so a script exits without a traceback). The
training time of all sessions is kept in the checkpoints and reported (``train_seconds``).

Sharding. All devices of all processes form a ``"data"`` x ``"seq"`` mesh
(``experiments.core.train.distributed``): each global batch is split along its leading
axis over ``"data"``, and the entries a task names in ``Task.sequence_keys`` along their
axis 1 over ``"seq"`` (``config.sequence_parallelism`` devices, 1 unless the task splits
sequences); parameters and optimiser state are replicated, and the jitted train step (state
donated) lets XLA insert the gradient all-reduce. ``batch_size`` must be divisible by the
``"data"`` axis (checked with the config, naming the sizes that work); evaluation batches of
any size are padded with masked rows (``padded_batches``). The same code runs on one CPU, on
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` CPUs, on GPUs/TPUs and on several
processes: call ``jax.distributed.initialize()`` in every process first
(``python -m experiments.main --distributed``); each process then loads only its rows of every
global batch (``epoch_batches`` and ``padded_batches`` yield the ``jax.process_index()`` share),
batches are assembled with ``jax.make_array_from_process_local_data``, Orbax writes one
checkpoint cooperatively (the workdir must be on storage all processes share) and process 0
writes the metrics. ``tests/experiments/core/test_multiprocess.py`` runs two processes on localhost.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs.training import train_config
from experiments.core import outputs, sweep
from experiments.core.train import distributed
from experiments.core.train.checkpoints import Checkpoints, TrainingProgress, latest_params
from experiments.core.train.distributed import padded_batches, process_share
from experiments.core.train.metrics_log import FILENAME as METRICS_FILE
from experiments.core.train.metrics_log import MetricsWriter, read_metrics
from experiments.core.training_check import trainer_sections
from experiments.core.validate import check_types, require_int, require_names, require_positive

__all__ = [
    "Task",
    "TrainState",
    "TrainingInterrupted",
    "array_task",
    "enable_compilation_cache",
    "epoch_batches",
    "final_params",
    "make_optimizer",
    "padded_batches",
    "read_metrics",
    "run_settings",
    "step_rngs",
    "train_and_evaluate",
    "train_seed",
    "validate_train_config",
    "validate_train_sections",
]

Batch = Mapping[str, np.ndarray]
Params = Any
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class Task:
    """What the trainer needs from an experiment.

    Attributes:
      init: ``(rng, batch) -> params``, the parameter pytree from an example batch.
      loss: ``(params, batch, rng, step) -> (loss, metrics)``, jitted inside the train step;
        ``rng`` is the run's base key (constant over the run) and ``step`` the int32 step of
        this update: derive per-step keys with ``step_rngs``/``fold_in(rng, step)``. ``metrics``
        is a dict of scalars (batch means) logged beside the loss.
      train_batches: ``start_step -> iterator`` of host batches (dicts of NumPy arrays with the
        global batch on the leading axis, or this process's share of it on multi-host), the
        first being the batch of ``start_step``; batch s must depend only on the seed and s.
      eval_metrics: ``(params, batch, rng, step) -> dict`` of metric sums over the batch,
        including ``"count"`` (the number of real examples); reported as sum / count.
      eval_batches: ``() -> iterable`` of host eval batches (padded to a multiple of the mesh's
        ``"data"`` axis; see ``padded_batches``).
      sequence_keys: the batch entries whose axis 1 is a sequence split over the mesh's
        ``"seq"`` axis (``config.sequence_parallelism`` devices; ``distributed``);
        the loss and metrics then split their computation with ``jax.shard_map`` over
        ``distributed.train_mesh(config.sequence_parallelism)``.
    """

    init: Callable[[jax.Array, Batch], Params]
    loss: Callable[[Params, Batch, jax.Array, jax.Array], tuple[jax.Array, dict]]
    train_batches: Callable[[int], Iterator[Batch]]
    eval_metrics: Callable[[Params, Batch, jax.Array, jax.Array], dict] | None = None
    eval_batches: Callable[[], Iterable[Batch]] | None = None
    sequence_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.eval_metrics is None) != (self.eval_batches is None):
            raise ValueError(
                "Task: eval_metrics and eval_batches go together (both or neither); got "
                f"eval_metrics={self.eval_metrics!r}, eval_batches={self.eval_batches!r}"
            )


def array_task(
    init: Callable[[jax.Array, Batch], Params],
    loss: Callable[[Params, Batch, jax.Array, jax.Array], tuple[jax.Array, dict]],
    eval_metrics: Callable[[Params, Batch, jax.Array, jax.Array], dict],
    train_arrays: Batch,
    eval_arrays: Batch,
    *,
    batch_size: int,
    eval_batch_size: int,
    seed: int,
) -> Task:
    """A ``Task`` over in-memory arrays: shuffled ``epoch_batches`` of ``train_arrays`` (seeded by
    ``seed``) and ``padded_batches`` of ``eval_arrays``."""
    return Task(
        init=init,
        loss=loss,
        train_batches=lambda start: epoch_batches(train_arrays, batch_size, seed, start),
        eval_metrics=eval_metrics,
        eval_batches=lambda: padded_batches(eval_arrays, eval_batch_size),
    )


class TrainState(flax.struct.PyTreeNode):
    """What a checkpoint holds: the step, the parameters and the optimiser state (no keys)."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState


# --------------------------------------------------------------------------- helpers for tasks


def step_rngs(
    rng: jax.Array,
    step: jax.Array,
    *,
    per_step: tuple[str, ...] = ("dropout",),
    fixed: tuple[str, ...] = ("projection",),
) -> dict[str, jax.Array]:
    """Flax ``rngs`` for one step from the run's base key.

    Each stream's key is ``fold_in(rng, crc32(name))`` (independent of the other names listed),
    folded once more with ``step`` for the ``per_step`` streams (e.g. ``"dropout"``: fresh
    every step) and left constant for the ``fixed`` ones (e.g. ``"projection"``, which
    ``rfjax.nn.PerformerAttention`` redraws itself from the step it is given).
    """
    if set(per_step) & set(fixed):
        raise ValueError(f"per_step {per_step} and fixed {fixed} streams must be distinct")
    rngs = {}
    for name in (*per_step, *fixed):
        stream = jax.random.fold_in(rng, zlib.crc32(name.encode()) & 0x7FFFFFFF)
        rngs[name] = jax.random.fold_in(stream, step) if name in per_step else stream
    return rngs


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """A run's base keys ``(initialisation, training) = split(key(seed))``: ``train_and_evaluate``
    initialises from the first and derives every step's streams (``step_rngs``) from the second,
    so code that replays a run (its evaluation, a benchmark of its model) takes them from here."""
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    return init_rng, train_rng


def fixed_stream(rng: jax.Array, name: str = "projection") -> jax.Array:
    """The constant stream ``name`` of ``step_rngs`` (the same key at every step), e.g. the
    ``"projection"`` key from which ``rfjax.nn.PerformerAttention`` redraws by step."""
    return step_rngs(rng, jnp.int32(0), per_step=(), fixed=(name,))[name]


def epoch_batches(
    arrays: Batch, batch_size: int, seed: int, start_step: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled batches, step-indexed: batch s is rows ``perm_e[i b:(i+1) b]`` of
    ``perm_e = default_rng([seed, e]).permutation(n)``, e, i = divmod(s, n // b).

    The last partial batch of each epoch is dropped. On multi-host each process gets its
    ``jax.process_index()`` share of every global batch.
    """
    sizes = {len(v) for v in arrays.values()}
    if len(sizes) != 1:
        raise ValueError(f"arrays must have the same length, got sizes {sizes}")
    size = sizes.pop()
    steps_per_epoch = size // batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} exceeds the number of examples {size}")
    share = process_share(batch_size)
    step, epoch, permutation = start_step, None, None
    while True:
        this_epoch, index = divmod(step, steps_per_epoch)
        if this_epoch != epoch:
            epoch = this_epoch
            permutation = np.random.default_rng([seed, epoch]).permutation(size)
        assert permutation is not None  # drawn at the first step (epoch starts as None)
        rows = permutation[index * batch_size : (index + 1) * batch_size][share]
        yield {name: value[rows] for name, value in arrays.items()}
        step += 1


# --------------------------------------------------------------------------- optimiser


def make_optimizer(config: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, Any]:
    """The optax optimiser and learning-rate schedule of a trainer config."""
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {config.optimizer!r}")
    if config.lr_schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {config.lr_schedule!r}")
    warmup = min(config.warmup_steps, config.num_train_steps)
    if config.lr_schedule == "cosine":
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, config.learning_rate, max(warmup, 1), max(config.num_train_steps, warmup + 1)
        )
    else:
        schedule = optax.join_schedules(
            [
                optax.linear_schedule(0.0, config.learning_rate, max(warmup, 1)),
                optax.constant_schedule(config.learning_rate),
            ],
            [warmup],
        )
    if config.optimizer == "adam":
        optimizer = optax.adam(schedule)
    elif config.optimizer == "adamw":
        optimizer = optax.adamw(schedule, weight_decay=config.weight_decay)
    else:
        optimizer = optax.sgd(schedule, momentum=0.9)
    if config.grad_clip_norm:
        optimizer = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), optimizer)
    return optimizer, schedule


# --------------------------------------------------------------------------- config


def validate_train_config(config: ml_collections.ConfigDict, prefix: str = "config.train") -> None:
    """Checks a trainer config (``configs.training.train_config()`` with overrides; ``prefix``
    names it in messages).

    Raises:
      TypeError: if a field has the wrong type (e.g. a string where a number is expected).
      ValueError: if a value is out of range or not an allowed name; the message names the
        field, the value and what is allowed.
    """
    check_types(config, train_config(), prefix)
    require_int(config, "seed", minimum=0, prefix=prefix)  # NumPy's batch order takes no < 0
    require_names(config, "optimizer", OPTIMIZERS, prefix=prefix)
    require_names(config, "lr_schedule", SCHEDULES, prefix=prefix)
    require_positive(
        config,
        "num_train_steps",
        "batch_size",
        "learning_rate",
        "log_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "progress_every_seconds",
        "sequence_parallelism",
        prefix=prefix,
    )
    for key in ("warmup_steps", "eval_every_steps", "weight_decay", "grad_clip_norm"):
        value = config[key]
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{prefix}.{key} must be finite and >= 0, got {value!r}")
    distributed.check_sequence_parallelism(config.sequence_parallelism)
    distributed.check_batch_size(config.batch_size, config.sequence_parallelism)


def validate_train_sections(config: ml_collections.ConfigDict) -> None:
    """``validate_train_config`` on every trainer section of an experiment's ``config``:
    ``config.train`` and those of nested configs (``config.vit.train``: a study that trains
    another study's models), each named in messages by its dotted path.

    Raises:
      TypeError, ValueError: naming the field, as ``validate_train_config``.
    """
    for section in trainer_sections(config):
        *path, kind = section.split(".")
        if kind != "train":
            continue
        node = config
        for name in (*path, kind):
            node = node[name]
        validate_train_config(node, prefix=f"config.{section}")


# --------------------------------------------------------------------------- interrupts


class TrainingInterrupted(SystemExit):
    """Training stopped on SIGINT or SIGTERM after saving a checkpoint.

    A ``SystemExit`` (code 128 + the signal number, the shell's convention), so a script that
    does not catch it exits without a traceback; starting it again resumes.

    Attributes:
      signal_name: "SIGINT" or "SIGTERM".
      step: the step of the saved checkpoint.
      workdir: the run's directory.
    """

    def __init__(self, signum: int, step: int, workdir: str):
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name
        self.step, self.workdir = step, workdir

    def __str__(self) -> str:
        return (
            f"training interrupted by {self.signal_name} at step {self.step}; checkpoint "
            f"saved in {self.workdir}"
        )


class _StopRequests:
    """While active, SIGINT and SIGTERM only record a request to stop (the trainer checks it
    after each step); a second signal interrupts at once. Signal handlers can only be set in
    the main thread: elsewhere this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        self.signum = signum
        self.echo(
            f"received {signal.Signals(signum).name}: saving a checkpoint after this step "
            "(send it again to stop at once)"
        )

    def requested(self) -> bool:
        """Whether any process received a stop signal (all processes agree)."""
        local = self.signum is not None
        if jax.process_count() == 1:
            return local
        signals = multihost_utils.process_allgather(np.int32(self.signum or 0))
        self.signum = self.signum or int(np.max(signals)) or None
        return self.signum is not None


# --------------------------------------------------------------------------- trainer


class _Pending:
    """The per-step training metrics since the last train record (on device until needed).

    They travel in checkpoints (``TrainingProgress.pending``) so that a resumed run's next
    record averages the same steps as an uninterrupted run's.
    """

    def __init__(self, saved: Mapping[str, list[float]]):
        self.steps: list[dict] = [
            dict(zip(saved, values, strict=True)) for values in zip(*saved.values(), strict=True)
        ]

    def append(self, metrics: dict) -> None:
        self.steps.append(metrics)

    def values(self) -> dict[str, list[float]]:
        """``{name: [value per step]}`` as host floats."""
        steps = jax.device_get(self.steps)
        return {name: [float(step[name]) for step in steps] for name in (steps or [{}])[0]}

    def take_values(self) -> dict[str, list[float]]:
        """``values()``, emptying the list (the interval is recorded)."""
        values = self.values()
        self.steps = []
        return values

    def take_summary(self) -> dict[str, float]:
        """A train record, emptying the list: the mean of each metric over the interval's
        steps, except the learning rate, which is that of the last step (the current one)."""
        return {
            name: values[-1]
            if name == "learning_rate"
            else float(np.mean(values, dtype=np.float64))
            for name, values in self.take_values().items()
        }


@dataclasses.dataclass(frozen=True)
class _Steps:
    """The jitted functions of a run over the ``"data"`` mesh of all devices."""

    to_device: Callable[[Batch], dict[str, jax.Array]]
    init: Callable[[], TrainState]  # fresh parameters and optimiser state
    train: Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict]]
    evaluate: Callable[[TrainState], dict[str, float]] | None
    target: Any  # the abstract TrainState with shardings, to restore into


def _make_steps(config: ml_collections.ConfigDict, task: Task) -> _Steps:
    if config.sequence_parallelism > 1 and not task.sequence_keys:
        raise ValueError(
            f"config.train.sequence_parallelism={config.sequence_parallelism}, but this task "
            "splits no sequence over devices (Task.sequence_keys is empty): set it to 1"
        )
    mesh = distributed.train_mesh(config.sequence_parallelism)
    replicated = NamedSharding(mesh, P())

    def to_device(batch: Batch) -> dict[str, jax.Array]:
        return distributed.to_device(mesh, batch, task.sequence_keys)

    optimizer, schedule = make_optimizer(config)
    init_rng, train_rng = run_keys(config.seed)

    def init_state(rng, batch):
        params = task.init(rng, batch)
        return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))

    example = to_device(next(task.train_batches(0)))
    abstract = jax.eval_shape(init_state, init_rng, example)
    state_sharding = jax.tree.map(lambda _: replicated, abstract)
    init = jax.jit(init_state, out_shardings=state_sharding)

    def train_step(state, batch, rng):
        def loss_fn(params):
            return task.loss(params, batch, rng, state.step)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, **metrics, "learning_rate": schedule(state.step)}
        return TrainState(state.step + 1, params, opt_state), metrics

    batch_sharding = {
        name: NamedSharding(mesh, distributed.batch_spec(name, task.sequence_keys))
        for name in example
    }
    train_step = jax.jit(
        train_step,
        donate_argnums=0,
        in_shardings=(state_sharding, batch_sharding, replicated),
        out_shardings=(state_sharding, replicated),
    )

    evaluate = None
    if task.eval_metrics is not None:
        eval_step = jax.jit(task.eval_metrics, out_shardings=replicated)

        def evaluate(state) -> dict[str, float]:
            assert task.eval_batches is not None  # Task checks the pair when it is built
            totals = distributed.metric_sums(
                eval_step, state.params, task.eval_batches(), to_device, train_rng, state.step
            )
            count = totals.pop("count")
            return {name: value / count for name, value in totals.items()}

    return _Steps(
        to_device=to_device,
        init=lambda: init(init_rng, example),
        train=lambda state, batch: train_step(state, batch, train_rng),
        evaluate=evaluate,
        target=jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), abstract
        ),
    )


# Trainer options that change neither the model nor its metrics records: a run resumed with
# other values of them continues the same run.
OPERATIONAL_FIELDS = ("checkpoint_every_steps", "keep_checkpoints", "progress_every_seconds")


def run_settings(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """What a run's checkpoints are made under, and checked against on restore: the trainer
    options less ``OPERATIONAL_FIELDS`` (``train``) and, when ``workdir`` is a sweep cell, its
    identity (``cell``: the study's settings, the arm and the seed; ``sweep.cell``)."""
    options = {k: v for k, v in config.to_dict().items() if k not in OPERATIONAL_FIELDS}
    return {"train": options, "cell": sweep.cell(workdir)}


def _restore_or_initialise(
    checkpoints: Checkpoints, steps: _Steps
) -> tuple[TrainState, TrainingProgress]:
    """The state of the newest checkpoint that restores (saying which, and which were
    skipped), or a fresh one."""
    restored = checkpoints.restore_latest(steps.target)
    if restored is None:
        return steps.init(), TrainingProgress()
    for line in restored.skipped:
        print(f"WARNING: {line}; falling back to an older checkpoint", flush=True)
    print(
        f"resuming from step {restored.step} (checkpoint {checkpoints.path(restored.step)}, "
        f"{outputs.format_duration(restored.progress.elapsed_seconds)} of training so far)",
        flush=True,
    )
    return restored.state, restored.progress


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    task: Task,
    *,
    stop_at_step: int | None = None,
) -> dict[str, float]:
    """Trains ``task`` for ``config.num_train_steps``, resuming from ``workdir`` if possible.

    Args:
      config: a trainer config (``configs.training.train_config()``).
      workdir: checkpoints, ``metrics.jsonl`` (and TensorBoard files) go here.
      task: the model, loss, metrics and data (``Task``).
      stop_at_step: stop after this step (with a checkpoint), as if the job were pre-empted;
        starting again continues to ``num_train_steps``. For tests and job splitting.

    Returns:
      The final metrics: ``train_<name>`` of the last train record (interval means),
      ``eval_<name>`` at the final step (if the task evaluates), ``step``,
      ``train_seconds`` (training wall time over all sessions of this run) and, where a train
      record's loss is not finite, ``diverged_at_step`` (the first such record's step).

    Raises:
      TrainingInterrupted: on SIGINT/SIGTERM, after saving a checkpoint.
      experiments.checkpoints.CheckpointError: if checkpoints exist and none restores.
      experiments.checkpoints.SettingsMismatchError: if the checkpoint to resume was made
        under other settings (``run_settings``; the message names the fields that differ).
    """
    session_start = time.monotonic()
    validate_train_config(config)
    steps = _make_steps(config, task)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    checkpoints = Checkpoints(
        os.path.join(workdir, "checkpoints"),
        config.keep_checkpoints,
        run_settings(config, workdir),
    )
    state, progress = _restore_or_initialise(checkpoints, steps)
    step, pending = int(state.step), _Pending(progress.pending)

    def elapsed() -> float:
        return progress.elapsed_seconds + time.monotonic() - session_start

    display = outputs.Progress(
        "train",
        config.num_train_steps,
        initial=step,
        unit="steps",
        interval_s=config.progress_every_seconds,
    )
    writer = MetricsWriter(workdir, resume_step=step, echo=display.write)
    end = (
        config.num_train_steps
        if stop_at_step is None
        else min(stop_at_step, config.num_train_steps)
    )
    batches = task.train_batches(step)
    with _StopRequests(display.write) as stop:
        while step < end:
            state, metrics = steps.train(state, steps.to_device(next(batches)))
            step += 1
            display.update()
            pending.append(metrics)
            if step % config.log_every_steps == 0 or step == config.num_train_steps:
                summary = pending.take_summary()
                writer.write("train", step, summary)
                display.set_note(f"loss {summary['loss']:.4g}")
            if (
                steps.evaluate is not None
                and config.eval_every_steps
                and step % config.eval_every_steps == 0
                and step < config.num_train_steps
            ):
                writer.write("eval", step, steps.evaluate(state))
            stopping = stop.requested()
            if step % config.checkpoint_every_steps == 0 or step == end or stopping:
                checkpoints.save(step, state, TrainingProgress(pending.values(), elapsed()))
            if stopping:
                for closable in (checkpoints, writer, display):
                    closable.close()
                assert stop.signum is not None  # requested() is true only once a signal is set
                interrupted = TrainingInterrupted(stop.signum, step, workdir)
                print(f"{interrupted}; run the same command again to resume.", flush=True)
                raise interrupted
    display.close()
    final: dict[str, float] = {}
    last_train = writer.last("train")
    if last_train is not None:
        final.update({f"train_{k}": v for k, v in last_train.items() if k not in ("step", "split")})
    if steps.evaluate is not None and step == config.num_train_steps:
        results = steps.evaluate(state)
        writer.write("eval", step, results)
        final.update({f"eval_{k}": v for k, v in results.items()})
    checkpoints.close()
    writer.close()
    final["step"] = step
    final["train_seconds"] = elapsed()
    diverged = _diverged_at_step(workdir)
    if diverged is not None:
        final["diverged_at_step"] = diverged
        print(
            f"the training loss is not finite from the record of step {diverged}: the run "
            "diverged, and its final metrics are those of non-finite parameters",
            flush=True,
        )
    print(
        f"trained to step {step} in {outputs.format_duration(final['train_seconds'])} "
        f"({outputs.format_duration(time.monotonic() - session_start)} in this session)",
        flush=True,
    )
    return final


def _diverged_at_step(workdir: str) -> int | None:
    """The step of the first train record whose loss is not finite (over every session of the
    run: the metrics file, which process 0 writes), or None."""
    if not os.path.exists(os.path.join(workdir, METRICS_FILE)):
        return None
    for record in read_metrics(workdir):
        if record["split"] == "train" and not math.isfinite(record["loss"]):
            return int(record["step"])
    return None


def final_params(workdir: str) -> Params:
    """The parameters of the latest checkpoint in ``workdir`` (host NumPy arrays)."""
    return latest_params(os.path.join(os.path.abspath(workdir), "checkpoints"))


def enable_compilation_cache(workdir: str, cache_dir: str) -> None:
    """Persists compiled executables in ``workdir/cache_dir`` (nothing if ``cache_dir`` is "").

    The runs of a sweep that share shapes (e.g. the seeds of one model) then compile once.
    """
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, cache_dir))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def train_seed(
    train_config: ml_collections.ConfigDict, workdir: str, name: str, seed: int, task: Task
) -> tuple[dict[str, float], str, float]:
    """One run of a sweep: ``train_and_evaluate`` with ``train_config`` at ``seed`` in the
    cell folder ``workdir/runs/<name>_seed<seed>`` (resumed if it holds this cell's
    checkpoints: ``sweep.start_cell`` moved any other run's aside).

    Returns the final metrics, the run's directory and its training time in seconds over all
    sessions (``final["train_seconds"]``: a resumed run reports the whole, not the last part).
    """
    run_dir = sweep.run_dir(workdir, name, seed)
    run_config = ml_collections.ConfigDict(train_config.to_dict())
    run_config.seed = seed
    final = train_and_evaluate(run_config, run_dir, task)
    return final, run_dir, final["train_seconds"]
