"""How the trainer spreads batches and metrics over the devices of all processes.

The mesh (``train_mesh``) has two axes, ``"data"`` x ``"seq"``: every global batch is split
along its leading axis over ``"data"``, and the batch entries a task names as sequences
(``Task.sequence_keys``) along their axis 1 over ``"seq"`` (``sequence_parallelism`` devices;
1 for the experiments whose examples are not split). The devices are laid out process by
process, and ``"seq"`` must divide each process's device count, so that a sequence never spans
processes: each process then holds whole sequences of its rows of the batch, the rows
``process_share`` gives it, and loads only those.

Evaluation batches (``padded_batches``) are padded with masked rows to a multiple of the
``"data"`` axis, so any ``eval_batch_size`` works on any number of devices and processes;
training batch sizes must divide evenly (``check_batch_size`` says which sizes do, and the
trainer's ``validate_train_config`` calls it). ``evaluate`` sums a task's metric sums over such
batches on the mesh: the same totals on every process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
SEQUENCE_AXIS = "seq"

Batch = Mapping[str, np.ndarray]


def check_sequence_parallelism(sequence_parallelism: int) -> None:
    """Raises ``ValueError`` unless ``sequence_parallelism`` divides every process's devices."""
    local = jax.local_device_count()
    if sequence_parallelism < 1 or local % sequence_parallelism:
        raise ValueError(
            f"config.train.sequence_parallelism={sequence_parallelism} must divide the "
            f"{local} devices of each process (a sequence is split over devices of one "
            f"process): use a divisor of {local}"
        )


def data_parallelism(sequence_parallelism: int) -> int:
    """The size of the ``"data"`` axis: all devices over ``sequence_parallelism``."""
    return jax.device_count() // sequence_parallelism


def check_batch_size(batch_size: int, sequence_parallelism: int) -> None:
    """Raises ``ValueError`` naming the fix unless a global training batch of ``batch_size``
    splits evenly over the ``"data"`` axis (and so over the processes).
    """
    parts = data_parallelism(sequence_parallelism)
    if batch_size % parts:
        lower, upper = batch_size - batch_size % parts, batch_size - batch_size % parts + parts
        suggestion = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(
            f"config.train.batch_size={batch_size} must be divisible by {parts}, the devices "
            f"that split each batch ({jax.device_count()} devices in {jax.process_count()} "
            f"processes / sequence_parallelism {sequence_parallelism}): set "
            f"config.train.batch_size to a multiple of {parts}, e.g. {suggestion}"
        )


def train_mesh(sequence_parallelism: int = 1) -> Mesh:
    """All devices of all processes as a ``"data"`` x ``"seq"`` mesh (automatic axes), laid out
    process by process (see the module docstring)."""
    check_sequence_parallelism(sequence_parallelism)
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    grid = np.array(devices).reshape(len(devices) // sequence_parallelism, sequence_parallelism)
    return Mesh(grid, (DATA_AXIS, SEQUENCE_AXIS), axis_types=(AxisType.Auto,) * 2)


def batch_spec(name: str, sequence_keys: tuple[str, ...]) -> P:
    """The sharding of batch entry ``name``: rows over ``"data"``, and axis 1 over ``"seq"``
    for the entries in ``sequence_keys``."""
    return P(DATA_AXIS, SEQUENCE_AXIS) if name in sequence_keys else P(DATA_AXIS)


def to_device(mesh: Mesh, batch: Batch, sequence_keys: tuple[str, ...] = ()) -> dict:
    """A global batch on ``mesh`` from this process's share of it (``process_share``)."""
    return {
        name: jax.make_array_from_process_local_data(
            NamedSharding(mesh, batch_spec(name, sequence_keys)), np.asarray(value)
        )
        for name, value in batch.items()
    }


def process_share(batch_size: int) -> slice:
    """The rows of a global batch of ``batch_size`` that this process loads: the
    ``jax.process_index()``-th of ``jax.process_count()`` equal parts (all rows on one host)."""
    processes = jax.process_count()
    if batch_size % processes:
        raise ValueError(
            f"batch size {batch_size} must be divisible by the process count {processes}"
        )
    local = batch_size // processes
    return slice(jax.process_index() * local, (jax.process_index() + 1) * local)


def padded_batches(
    arrays: Batch, batch_size: int, sequence_parallelism: int = 1
) -> Iterator[dict[str, np.ndarray]]:
    """All examples in order, ``batch_size`` real ones per global batch (fewer in the last), each
    batch zero-padded to a multiple of the ``"data"`` axis of ``train_mesh(
    sequence_parallelism)`` (so that it splits over every device and process) with a boolean
    ``"mask"`` marking the real examples. On multi-host each process gets its
    ``jax.process_index()`` share of every global batch."""
    parts = data_parallelism(sequence_parallelism)
    padded_size = -(-batch_size // parts) * parts
    share = process_share(padded_size)
    size = len(next(iter(arrays.values())))
    for start in range(0, size, batch_size):
        count = min(batch_size, size - start)
        batch = {}
        for name, value in arrays.items():
            chunk = value[start : start + count]
            pad = np.zeros((padded_size - count, *chunk.shape[1:]), chunk.dtype)
            batch[name] = np.concatenate([chunk, pad])[share]
        batch["mask"] = (np.arange(padded_size) < count)[share]
        yield batch


def replicated(mesh: Mesh, tree: Any) -> Any:
    """``tree`` (host or device arrays, the same on every process) replicated over ``mesh``."""
    sharding = NamedSharding(mesh, P())

    def place(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree)


def metric_sums(
    eval_step: Callable[..., dict],
    params: Any,
    batches: Iterable[Batch],
    put: Callable[[Batch], dict],
    rng: Any,
    step: Any,
) -> dict[str, float]:
    """``sum over batches of eval_step(params, put(batch), rng, step)``, as host floats."""
    totals: dict[str, float] = {}
    for batch in batches:
        sums = eval_step(params, put(batch), rng, step)
        for name, value in jax.device_get(sums).items():
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def evaluate(
    eval_metrics: Callable[..., dict],
    params: Any,
    batches: Iterable[Batch],
    *,
    sequence_parallelism: int = 1,
    sequence_keys: tuple[str, ...] = (),
    rng: Any = None,
    step: Any = None,
) -> dict[str, float]:
    """The sums of ``eval_metrics(params, batch, rng, step)`` (a dict of metric sums over the
    batch) over ``batches`` (this process's shares, e.g. ``padded_batches``), every batch split
    over all devices of all processes (``train_mesh``); the same totals on every process.

    ``params`` may be host arrays (e.g. ``trainer.final_params``), the same on every
    process.
    """
    mesh = train_mesh(sequence_parallelism)
    placed = replicated(mesh, params)
    step_fn = jax.jit(eval_metrics, out_shardings=NamedSharding(mesh, P()))
    return metric_sums(
        step_fn, placed, batches, lambda batch: to_device(mesh, batch, sequence_keys), rng, step
    )
