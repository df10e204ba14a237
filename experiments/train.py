"""A config-driven, model-agnostic trainer: data parallel, checkpointed, resumable.

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
``default_rng([seed, e])``). Checkpoints (Orbax ``CheckpointManager`` in
``workdir/checkpoints``: step, params and optimiser state) are written every
``checkpoint_every_steps`` and at the end; a run started again in the same workdir restores the
latest one and continues, producing the same batches, keys and therefore (on the same devices)
bit-identical parameters as an uninterrupted run. The metrics file ``workdir/metrics.jsonl``
(one JSON object per line: ``step``, ``split`` = "train" | "eval", values) is cut back to the
restored step on resume. TensorBoard summaries are written too if ``clu`` is installed.

Sharding. All visible devices form a 1-D mesh with axis ``"data"``: each global batch is
sharded along its leading axis (``batch_size`` must be divisible by the device count),
parameters and optimiser state are replicated, and the jitted train step (state donated) lets
XLA insert the gradient all-reduce. The same code runs on one CPU, on
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` CPUs, and on GPUs/TPUs. Multi-host (not
tested here): call ``jax.distributed.initialize()`` in every process before anything else; the
mesh then spans all processes' devices, batches are assembled with
``jax.make_array_from_process_local_data`` from each process's share (``epoch_batches`` yields
the rows of ``jax.process_index()``), and Orbax writes one checkpoint cooperatively.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

try:  # optional TensorBoard summaries
    from clu import metric_writers as _clu_writers
except ImportError:  # pragma: no cover - clu is optional
    _clu_writers = None

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
      eval_batches: ``() -> iterable`` of host eval batches (padded to a multiple of the device
        count; see ``padded_batches``).
    """

    init: Callable[[jax.Array, Batch], Params]
    loss: Callable[[Params, Batch, jax.Array, jax.Array], tuple[jax.Array, dict]]
    train_batches: Callable[[int], Iterator[Batch]]
    eval_metrics: Callable[[Params, Batch, jax.Array, jax.Array], dict] | None = None
    eval_batches: Callable[[], Iterable[Batch]] | None = None


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
    local = batch_size // jax.process_count()
    offset = jax.process_index() * local
    step, epoch, permutation = start_step, None, None
    while True:
        this_epoch, index = divmod(step, steps_per_epoch)
        if this_epoch != epoch:
            epoch = this_epoch
            permutation = np.random.default_rng([seed, epoch]).permutation(size)
        rows = permutation[index * batch_size : (index + 1) * batch_size][offset : offset + local]
        yield {name: value[rows] for name, value in arrays.items()}
        step += 1


def padded_batches(arrays: Batch, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """All examples in order, in batches of ``batch_size`` (the last one zero-padded), each with
    a boolean ``"mask"`` marking the real examples."""
    size = len(next(iter(arrays.values())))
    for start in range(0, size, batch_size):
        count = min(batch_size, size - start)
        batch = {}
        for name, value in arrays.items():
            chunk = value[start : start + count]
            pad = np.zeros((batch_size - count, *chunk.shape[1:]), chunk.dtype)
            batch[name] = np.concatenate([chunk, pad])
        batch["mask"] = np.arange(batch_size) < count
        yield batch


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


# --------------------------------------------------------------------------- metrics


class MetricsWriter:
    """JSON lines in ``workdir/metrics.jsonl`` (cut back to ``resume_step``), the console, and
    TensorBoard when ``clu`` is installed."""

    def __init__(self, workdir: str, resume_step: int):
        self.path = os.path.join(workdir, "metrics.jsonl")
        kept = []
        if os.path.exists(self.path):
            with open(self.path) as handle:
                kept = [line for line in handle if json.loads(line)["step"] <= resume_step]
        with open(self.path, "w") as handle:
            handle.writelines(kept)
        self.written = {(r["split"], r["step"]) for r in map(json.loads, kept)}
        self.tensorboard = (
            _clu_writers.SummaryWriter(os.path.join(workdir, "tensorboard"))
            if _clu_writers is not None and jax.process_index() == 0
            else None
        )

    def write(self, split: str, step: int, values: Mapping[str, float]) -> None:
        if (split, step) in self.written or jax.process_index() != 0:
            return
        self.written.add((split, step))
        record = {"step": step, "split": split, **{k: float(v) for k, v in values.items()}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        tqdm.write(f"[{split} step {step}] " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
        if self.tensorboard is not None:
            self.tensorboard.write_scalars(step, {f"{split}/{k}": v for k, v in values.items()})

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def read_metrics(workdir: str) -> list[dict]:
    """The records of ``workdir/metrics.jsonl``."""
    with open(os.path.join(workdir, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle]


# --------------------------------------------------------------------------- trainer


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
      The final metrics: ``train_<name>`` averaged over the last logging interval of this run
      (absent if it ran no step) and ``eval_<name>`` at the final step (if the task evaluates).
    """
    devices = jax.device_count()
    if config.batch_size % devices:
        raise ValueError(
            f"batch_size ({config.batch_size}) must be divisible by the device count ({devices})"
        )
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = NamedSharding(mesh, P())
    data_sharding = NamedSharding(mesh, P("data"))

    def to_device(batch: Batch) -> dict[str, jax.Array]:
        return {
            name: jax.make_array_from_process_local_data(data_sharding, np.asarray(value))
            for name, value in batch.items()
        }

    optimizer, schedule = make_optimizer(config)
    init_rng, train_rng = jax.random.split(jax.random.key(config.seed))

    def init_state(rng, batch):
        params = task.init(rng, batch)
        return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))

    example = to_device(next(task.train_batches(0)))
    abstract = jax.eval_shape(init_state, init_rng, example)
    state_sharding = jax.tree.map(lambda _: replicated, abstract)
    manager = ocp.CheckpointManager(
        os.path.join(workdir, "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True),
    )
    latest = manager.latest_step()
    if latest is None:
        state = jax.jit(init_state, out_shardings=state_sharding)(init_rng, example)
    else:
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), abstract
        )
        state = manager.restore(latest, args=ocp.args.StandardRestore(target))
    step = int(state.step)

    def train_step(state, batch, rng):
        def loss_fn(params):
            return task.loss(params, batch, rng, state.step)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, **metrics, "learning_rate": schedule(state.step)}
        return TrainState(state.step + 1, params, opt_state), metrics

    train_step = jax.jit(
        train_step,
        donate_argnums=0,
        in_shardings=(state_sharding, data_sharding, replicated),
        out_shardings=(state_sharding, replicated),
    )

    eval_step = None
    if task.eval_metrics is not None:
        eval_step = jax.jit(task.eval_metrics, out_shardings=replicated)

    def evaluate(state) -> dict[str, float]:
        totals: dict[str, float] = {}
        for batch in task.eval_batches():
            sums = jax.device_get(eval_step(state.params, to_device(batch), train_rng, state.step))
            for name, value in sums.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        count = totals.pop("count")
        return {name: value / count for name, value in totals.items()}

    writer = MetricsWriter(workdir, resume_step=step)
    end = (
        config.num_train_steps
        if stop_at_step is None
        else min(stop_at_step, config.num_train_steps)
    )
    final: dict[str, float] = {}
    pending: list[dict] = []
    batches = task.train_batches(step)
    bar = tqdm(total=config.num_train_steps, initial=step, desc="train", disable=None, leave=False)
    while step < end:
        state, metrics = train_step(state, to_device(next(batches)), train_rng)
        step += 1
        bar.update()
        pending.append(metrics)
        if step % config.log_every_steps == 0 or step == end:
            summary = {
                name: float(np.mean([m[name] for m in jax.device_get(pending)]))
                for name in pending[0]
            }
            pending = []
            writer.write("train", step, summary)
            bar.set_postfix(loss=f"{summary['loss']:.4g}")
            final.update({f"train_{k}": v for k, v in summary.items()})
        if (
            eval_step is not None
            and config.eval_every_steps
            and step % config.eval_every_steps == 0
            and step < config.num_train_steps
        ):
            writer.write("eval", step, evaluate(state))
        if step % config.checkpoint_every_steps == 0 or step == end:
            manager.save(step, args=ocp.args.StandardSave(state))
    bar.close()
    if eval_step is not None and step == config.num_train_steps:
        results = evaluate(state)
        writer.write("eval", step, results)
        final.update({f"eval_{k}": v for k, v in results.items()})
    manager.wait_until_finished()
    manager.close()
    writer.close()
    final["step"] = step
    return final


def final_params(workdir: str) -> Params:
    """The parameters of the latest checkpoint in ``workdir`` (host NumPy arrays)."""
    manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"))
    try:
        restored = manager.restore(manager.latest_step())
    finally:
        manager.close()
    return restored["params"]


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
    """One run of a sweep: ``train_and_evaluate`` with ``train_config`` at ``seed`` in
    ``workdir/runs/<name>_seed<seed>`` (resumed if it exists).

    Returns the final metrics, the run's directory and the seconds spent in this session.
    """
    run_dir = os.path.join(workdir, "runs", f"{name}_seed{seed}")
    run_config = ml_collections.ConfigDict(train_config.to_dict())
    run_config.seed = seed
    start = time.perf_counter()
    final = train_and_evaluate(run_config, run_dir, task)
    return final, run_dir, time.perf_counter() - start
