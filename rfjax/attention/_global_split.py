"""FAVOR called on global arrays split over ``Explicit`` mesh axes: sequence parallel
(``favor_attention(..., sequence_axis=name)`` outside ``jax.shard_map``, under ``jax.set_mesh``
with ``name`` an ``Explicit`` axis), or data parallel (no ``sequence_axis``, the batch or heads
split, as ``jax.device_put`` over ``jax.make_mesh``'s default Explicit mesh leaves them).

There the arrays' types say how each dimension is split (``float32[B,T@seq,N,H]``), so the split
is checked rather than trusted: the sequence dimension of query, key, value and a given mask must
be split over ``name`` and the query's and key's H must not be split, else ``ValueError`` names the
array, its split and what is needed. The call then runs as ``jax.shard_map`` over every mesh axis
that splits an input (a batch or head split over other axes is kept), each device attending over
its local shard with ``sequence_axis=name`` as inside a user's ``shard_map``. Inside a
``shard_map`` a shard's type records only the axes it varies over, not which dimension they split
(``_sequence_parallel.check_split_along``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rfjax.attention._per_head import PerHead


def bound_by_shard_map(axis_name: str) -> bool:
    """Whether ``axis_name`` is a manual axis of an enclosing ``jax.shard_map``."""
    try:
        jax.lax.axis_size(axis_name)
    except NameError:
        return False
    return True


def explicit_mesh_axis(sequence_axis: str) -> None:
    """Require ``sequence_axis`` to be an ``Explicit`` axis of the mesh set by
    ``jax.set_mesh`` (the only place outside ``shard_map`` where types show a split)."""
    mesh = jax.sharding.get_abstract_mesh()
    names = () if mesh.empty else mesh.axis_names
    if sequence_axis not in names:
        raise ValueError(
            f"sequence_axis={sequence_axis!r} names no mesh axis: call favor_attention inside "
            f"jax.shard_map over a mesh with an axis {sequence_axis!r} that splits the sequence "
            f"(in_specs P(None, {sequence_axis!r}) for (B, T, N, H) inputs), or on global arrays "
            f"split along it under jax.set_mesh with an Explicit axis "
            f"{sequence_axis!r}, or pass sequence_axis=None (mesh axes here: {names})"
        )
    axis_type = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))[sequence_axis]
    if axis_type != AxisType.Explicit:
        raise ValueError(
            f"sequence_axis={sequence_axis!r} is an {axis_type.name} axis of the mesh set here: "
            f"outside jax.shard_map only the types of Explicit axes say which dimension they "
            f"split; make the axis Explicit (jax.make_mesh(..., axis_types=(AxisType.Explicit, "
            f"...))) or call favor_attention inside jax.shard_map"
        )


Spec = tuple[object, ...]  # a PartitionSpec's entries, one per dimension


def _spec(array: jax.Array) -> Spec:
    spec = tuple(jax.typeof(array).sharding.spec)
    return spec + (None,) * (array.ndim - len(spec))


def _axes(entry: object) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (str(entry),)


def split_spec(name: str, array: jax.Array, sequence_dim: int, sequence_axis: str | None) -> Spec:
    """The split of ``array`` (one entry per dimension) if its dimension ``sequence_dim`` is
    split over exactly ``sequence_axis`` (``None``: not split) and, for query and key, the
    last (H) is not split (a value's may be: each output column depends on its own); else
    ``ValueError`` saying how the array is split."""
    spec = _spec(array)
    read_as = "(B, S)" if name == "mask" else "(B, T, N, H)"
    layout = f"{name} of shape {array.shape} {read_as} split as P{spec}"
    if sequence_axis is None and spec[sequence_dim] is not None:
        split = spec[sequence_dim]
        raise ValueError(
            f"the sequence (dimension {sequence_dim}) of {name} is split over the mesh axis "
            f"{split!r}: pass sequence_axis={split!r} for sequence parallelism ({layout})"
        )
    if sequence_axis is not None and _axes(spec[sequence_dim]) != (sequence_axis,):
        elsewhere = [dim for dim, entry in enumerate(spec) if sequence_axis in _axes(entry)]
        where = f"splits its dimension {elsewhere[0]} instead" if elsewhere else "does not split it"
        raise ValueError(
            f"sequence_axis={sequence_axis!r} must split the sequence (dimension "
            f"{sequence_dim}) of {name} alone; the mesh axis {where}: {layout}"
        )
    if name in ("query", "key") and spec[-1] is not None:
        raise ValueError(
            f"the last dimension (H) of {name} must not be split over devices, as the random "
            f"features read whole vectors: {layout}"
        )
    return spec


def _shared_spec(shared: object, head_split: object) -> object:
    """Specs of the projection and feature map: ``PerHead`` leaves split as the heads are,
    every other leaf replicated."""

    def spec(value: object) -> object:
        if isinstance(value, PerHead):
            return jax.tree.map(lambda _: P(head_split), value)
        return jax.tree.map(lambda _: P(), value)

    return jax.tree.map(spec, shared, is_leaf=lambda value: isinstance(value, PerHead))


def is_split(arrays: dict[str, jax.Array | None]) -> bool:
    """Whether any array's type says it is split over devices (a global array split over an
    ``Explicit`` mesh axis, e.g. of ``jax.make_mesh``'s default mesh) and the mesh is known
    (``mesh_known``): such arrays attend through ``attend_split``, since FAVOR's scans do not
    trace over them (their carries lose the split)."""
    return mesh_known(arrays) and any(
        any(entry is not None for entry in _spec(array))
        for array in arrays.values()
        if array is not None
    )


def _split_specs(arrays: dict[str, jax.Array | None], sequence_axis: str | None) -> dict[str, Spec]:
    """The checked split of each array given (``split_spec``): dimension 1, T of (B, T, N, H)
    query, key and value and S of a (B, S) mask, split over ``sequence_axis`` (``None``: not
    split); ``()`` for a ``None`` mask."""
    if sequence_axis is not None:
        explicit_mesh_axis(sequence_axis)
    return {
        name: () if array is None else split_spec(name, array, 1, sequence_axis)
        for name, array in arrays.items()
    }


def mesh_known(arrays: dict[str, jax.Array | None]) -> bool:
    """Whether a mesh to run ``attend_split`` over is known: one set by ``jax.set_mesh``, or
    the one an eager query is placed on (``jax.device_put`` over a mesh needs no
    ``jax.set_mesh``). A traced query carries only an abstract mesh, which cannot be lowered."""
    query = arrays["query"]
    eager = not isinstance(query, jax.core.Tracer)
    return not jax.sharding.get_abstract_mesh().empty or (
        eager and isinstance(getattr(query, "sharding", None), NamedSharding)
    )


def _arrays_mesh(arrays: dict[str, jax.Array | None]) -> contextlib.AbstractContextManager:
    """The mesh set by ``jax.set_mesh`` or, outside it, the mesh the eager query is placed on
    (``mesh_known``)."""
    sharding = getattr(arrays["query"], "sharding", None)
    mesh = sharding.mesh if isinstance(sharding, NamedSharding) else None
    if not jax.sharding.get_abstract_mesh().empty or not isinstance(mesh, jax.sharding.Mesh):
        return contextlib.nullcontext()
    return jax.set_mesh(mesh)


def _in_specs(specs: dict[str, Spec]) -> tuple[P | None, ...]:
    return tuple(P(*spec) if spec else None for spec in specs.values())


def _manual_axes(specs: dict[str, Spec], dims: slice = slice(None)) -> frozenset[str]:
    """The mesh axes that split the given dimensions of any array."""
    return frozenset(
        axis for spec in specs.values() for entry in spec[dims] for axis in _axes(entry)
    )


def attend_split(
    attend: Callable[..., jax.Array],
    sequence_axis: str | None,
    arrays: dict[str, jax.Array | None],
    shared: object,
) -> jax.Array:
    """``attend(query, key, value, mask, shared)`` on each device's shard of global arrays whose
    sequence is split over the Explicit mesh axis ``sequence_axis`` or, with ``None``, whose
    batch or heads are split over Explicit axes (data parallelism).

    Args:
      attend: the local attention (``favor_attention`` with ``sequence_axis``).
      sequence_axis: the mesh axis that must split the sequence, or ``None`` (it must not be
        split).
      arrays: ``query``, ``key``, ``value`` (``(B, T, N, H)``) and ``mask`` (``(B, S)`` or
        ``None``).
      shared: the projection and feature map (pytrees; ``PerHead`` ones split as the heads).

    Returns:
      The global output, split as the query.
    """
    specs = _split_specs(arrays, sequence_axis)
    out_spec = P(*specs["query"][:-1], specs["value"][-1])
    shared_spec = _shared_spec(shared, specs["query"][-2])
    with _arrays_mesh(arrays):
        shared = jax.tree.map(lambda leaf, spec: jax.reshard(leaf, spec), shared, shared_spec)
        return jax.shard_map(
            attend,
            in_specs=(*_in_specs(specs), shared_spec),
            out_specs=out_spec,
            axis_names=_manual_axes(specs),
        )(*arrays.values(), shared)


def fit_split(
    fit: Callable[..., object],
    sequence_axis: str | None,
    arrays: dict[str, jax.Array | None],
) -> PerHead:
    """A data-fitted map's per-head parameters from global (B, T, N, H) arrays split over the
    Explicit axis ``sequence_axis``: ``fit(query, key, valid, pooled_axes)`` on each device's
    shard, its sums added over every mesh axis that splits the batch or the sequence
    (``pooled_axes``), as one device pools them, and split over the heads as the query is.

    Args:
      fit: the local fit (``_data_fitted.fit_to_inputs``), returning a ``PerHead``.
      sequence_axis: the mesh axis that must split the sequence (``None``: not split).
      arrays: ``query``, ``key`` and ``mask`` (``(B, S)`` or ``None``).
    """
    specs = _split_specs(arrays, sequence_axis)
    pooled = tuple(sorted(_manual_axes(specs, slice(0, 2))))

    def local(query, key, mask):
        valid = jnp.ones(key.shape[:2], bool) if mask is None else mask
        return fit(query, key, valid, pooled)

    with _arrays_mesh(arrays):
        return jax.shard_map(
            local,
            in_specs=_in_specs(specs),
            out_specs=PerHead(P(specs["query"][-2])),
            axis_names=_manual_axes(specs),
        )(*arrays.values())
