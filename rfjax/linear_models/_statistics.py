"""The streaming pass of a ridge fit: Phi^T Phi and Phi^T Y summed over blocks, devices, hosts."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import DTypeLike
from numpy.typing import ArrayLike

from rfjax._validation import check_array_size, check_float_dtype, check_int
from rfjax.linear_models._blocks import fixed_blocks
from rfjax.linear_models._transform import Featurizer
from rfjax.ops import symmetric_rank_update

_HIGHEST = jax.lax.Precision.HIGHEST


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RidgeStatistics:
    """The sufficient statistics of ridge regression on features Phi (n x m) and targets Y (n x t).

    Attributes:
      gram: Phi^T Phi, shape ``(m, m)`` (while rows are being added, its lower triangle:
        ``add_rows``).
      cross: Phi^T Y, shape ``(m, t)``.
      feature_sum: Phi^T 1, shape ``(m,)``.
      target_sum: Y^T 1, shape ``(t,)``.
      count: n, an int32 scalar.
    """

    gram: jax.Array
    cross: jax.Array
    feature_sum: jax.Array
    target_sum: jax.Array
    count: jax.Array

    @classmethod
    def zeros(cls, width: int, targets: int, dtype: DTypeLike) -> RidgeStatistics:
        """The statistics of no rows."""
        return cls(
            jnp.zeros((width, width), dtype),
            jnp.zeros((width, targets), dtype),
            jnp.zeros((width,), dtype),
            jnp.zeros((targets,), dtype),
            jnp.zeros((), jnp.int32),
        )

    def add_rows(self, phi: jax.Array, y: jax.Array, valid: jax.Array) -> RidgeStatistics:
        """The statistics with rows ``phi (b, m)``, ``y (b, t)`` added (only the first ``valid``
        rows; the rest are padding). Phi^T Phi is added to the lower triangle of ``gram`` only
        (``rfjax.ops.symmetric_rank_update``: BLAS syrk on CPU, half the work of the whole
        product); ``with_full_gram`` fills the upper triangle once all rows are in."""
        mask = (jnp.arange(phi.shape[0]) < valid).astype(self.gram.dtype)[:, None]
        phi = phi.astype(self.gram.dtype) * mask
        y = y.astype(self.gram.dtype) * mask
        return RidgeStatistics(
            symmetric_rank_update(self.gram, phi),
            self.cross + jnp.matmul(phi.T, y, precision=_HIGHEST),
            self.feature_sum + phi.sum(axis=0),
            self.target_sum + y.sum(axis=0),
            self.count + valid.astype(jnp.int32),
        )

    def with_full_gram(self) -> RidgeStatistics:
        """The statistics with ``gram`` made whole from its lower triangle (as ``add_rows``
        leaves it)."""
        gram = jnp.tril(self.gram) + jnp.tril(self.gram, -1).T
        return dataclasses.replace(self, gram=gram)


def ridge_statistics(
    transform: Featurizer,
    blocks: Iterable[tuple[ArrayLike, ArrayLike]],
    *,
    block_rows: int = 4096,
    mesh: Mesh | None = None,
    axis_name: str = "data",
    dtype: DTypeLike = jnp.float32,
) -> RidgeStatistics:
    """Sums Phi^T Phi, Phi^T Y, Phi^T 1, Y^T 1 and n over a stream of row blocks.

    The pass streams: it holds one block of ``block_rows`` rows and, per device, one set of
    statistics (O(m^2) memory whatever n), so n is bounded by disk, not memory (pass
    ``array_blocks`` of a ``numpy.memmap``, or any iterator of blocks). Blocks of any sizes are
    re-cut into ``block_rows`` rows (the last zero-padded and masked), so one compiled step serves
    them all.

    Scaling out (JAX's own machinery): each block's rows are sharded along ``axis_name`` over
    this process's devices of ``mesh`` (``mesh.local_mesh``); each device adds its rows to its
    own statistics with no communication; at the end one ``psum`` over ``axis_name`` (inside
    ``shard_map``) adds the statistics of every device of every process. With several processes
    (``jax.distributed.initialize``), each process passes its own rows (any number of blocks;
    processes need not agree on it, but each needs at least one row, or the others wait for it
    in the final ``psum``), and every process gets the statistics of all rows.

    Args:
      transform: the features phi, a ``Featurizer`` such as ``RandomFeatureTransform``.
      blocks: ``(x, y)`` pairs, x floating ``(b, d)``, y real ``(b,)`` or ``(b, t)``; e.g.
        ``array_blocks(x, y)``. Values are checked finite block by block.
      block_rows: rows per step, rounded up to a multiple of the local devices on
        ``axis_name``.
      mesh: devices to shard rows over; default a 1-D mesh of all devices named ``axis_name``.
        Other mesh axes hold replicas.
      axis_name: the mesh axis the rows are sharded along.
      dtype: the dtype the statistics are summed in (``float32`` or ``float64``; float64 needs
        ``jax_enable_x64``). Inputs x are converted to the transform's dtype, features and
        targets y to ``dtype``; values beyond the range of their dtype raise.

    Returns:
      The statistics, replicated on the mesh (``count`` = rows of all processes).

    Raises:
      TypeError, ValueError: for a bad block (named by its index), option or dtype, or a
        Gram matrix or block of features over ``rfjax._validation.MAX_ARRAY_BYTES`` (refused
        before anything compiles: XLA's CPU runtime aborts the interpreter on an allocation it
        cannot make).

    Examples:
      >>> import jax, numpy as np
      >>> from rfjax import features, projections
      >>> from rfjax.linear_models import RandomFeatureTransform, array_blocks, ridge_statistics
      >>> transform = RandomFeatureTransform(
      ...     projections.get("gaussian")(jax.random.key(0), 3, 4), features.get("positive")())
      >>> x, y = np.ones((10, 3), np.float32), np.arange(10.0)
      >>> stats = ridge_statistics(transform, array_blocks(x, y, block_rows=4))
      >>> stats.gram.shape, stats.cross.shape, int(stats.count)
      ((4, 4), (4, 1), 10)
    """
    if not isinstance(transform, Featurizer):
        raise TypeError(
            "transform must be a Featurizer (e.g. a RandomFeatureTransform), got "
            f"{type(transform).__name__}"
        )
    dtype = _check_dtype(dtype)
    mesh = Mesh(np.array(jax.devices()), (axis_name,)) if mesh is None else mesh
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name must be an axis of mesh {mesh.axis_names}, got {axis_name!r}")
    local = mesh.local_mesh
    devices = local.shape[axis_name]
    rows = -(-check_int("block_rows", block_rows, minimum=1) // devices) * devices
    width = transform.width
    check_array_size("Phi^T Phi", (width, width), dtype, {"transform.width": width})
    check_array_size(
        "the features of a block",
        (rows, width),
        dtype,
        {"block_rows": block_rows, "transform.width": width},
    )
    row_sharding = NamedSharding(local, P(axis_name))
    state = None
    for block in fixed_blocks(blocks, rows, np.dtype(transform.dtype), np.dtype(dtype)):
        if block.x.shape[1] != transform.dim:
            raise ValueError(
                f"x must have {transform.dim} columns (the projection's dim), got {block.x.shape}"
            )
        if state is None:
            state = _local_zeros(local, axis_name, transform.width, block.y.shape[1], dtype)
        valid = np.clip(block.valid - rows // devices * np.arange(devices), 0, rows // devices)
        state = _local_step(local, axis_name)(
            state,
            transform,
            jax.device_put(block.x, row_sharding),
            jax.device_put(block.y, row_sharding),
            jax.device_put(valid.astype(np.int32), row_sharding),
        )
    if state is None:
        raise ValueError("blocks must hold at least one row, got none")
    return _all_reduce(state, mesh, axis_name)


def _check_dtype(dtype: DTypeLike) -> jnp.dtype:
    if dtype is not None and _is_float64(dtype) and not jax.config.read("jax_enable_x64"):
        # Refused, not truncated (check_float_dtype would truncate it with a warning).
        raise ValueError(
            "dtype=float64 needs jax_enable_x64 (jax.config.update('jax_enable_x64', True)); "
            "JAX would sum in float32"
        )
    canonical = check_float_dtype("dtype", dtype)
    if canonical not in (jnp.float32, jnp.float64):
        raise ValueError(f"dtype must be float32 or float64, got {canonical}")
    return canonical


def _is_float64(dtype: DTypeLike) -> bool:
    try:
        return jnp.dtype(dtype) == jnp.float64
    except TypeError:  # not a dtype: check_float_dtype names it
        return False


def _local_zeros(local: Mesh, axis_name: str, width: int, targets: int, dtype) -> RidgeStatistics:
    """One set of zero statistics per device along ``axis_name``: leading axis of that size."""
    devices = local.shape[axis_name]
    zeros = RidgeStatistics.zeros(width, targets, dtype)
    return jax.tree.map(
        lambda a: jax.device_put(
            jnp.broadcast_to(a, (devices, *a.shape)), NamedSharding(local, P(axis_name))
        ),
        zeros,
    )


@functools.cache
def _local_step(local: Mesh, axis_name: str):
    """The compiled step: every device adds its rows of the block to its own statistics."""

    def step(state, transform, x, y, valid):
        state = jax.tree.map(lambda a: a[0], state)
        state = state.add_rows(transform(x), y, valid[0])
        return jax.tree.map(lambda a: a[None], state)

    sharded = jax.shard_map(
        step,
        mesh=local,
        in_specs=(P(axis_name), P(), P(axis_name), P(axis_name), P(axis_name)),
        out_specs=P(axis_name),
    )
    return jax.jit(sharded, donate_argnums=0)


def _all_reduce(state: RidgeStatistics, mesh: Mesh, axis_name: str) -> RidgeStatistics:
    """The sum over all devices of all processes (one ``psum`` over ``axis_name``), its Gram
    matrix made whole (``RidgeStatistics.with_full_gram``).

    Each device's statistics become its shard of a global array over ``mesh`` (which row of the
    global array a device's sum lands in does not matter: all are added).
    """
    sharding = NamedSharding(mesh, P(axis_name))

    def global_array(a: jax.Array) -> jax.Array:
        shape = (mesh.shape[axis_name], *a.shape[1:])
        shards = [shard.data for shard in a.addressable_shards]
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)

    total = jax.jit(
        jax.shard_map(
            lambda s: jax.tree.map(lambda a: jax.lax.psum(a[0], axis_name), s).with_full_gram(),
            mesh=mesh,
            in_specs=P(axis_name),
            out_specs=P(),
        )
    )
    return total(jax.tree.map(global_array, state))
