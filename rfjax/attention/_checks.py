"""Argument checks of the FAVOR functions: BTNH arrays, masks, projections and feature maps
(shared or ``PerHead``), the stabiliser switch, and the computation dtype; and the mesh axes
that scan carries vary over inside ``shard_map`` (``vary_like``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features
from rfjax._validation import check_bool, check_real
from rfjax.attention._per_head import PerHead
from rfjax.features import FeatureMap
from rfjax.projections import DenseProjection, Projection

FeatureMapSpec = str | FeatureMap | PerHead[FeatureMap]
# A drawn projection, or a raw matrix W (m, H) (N stacked ones (N, m, H) in a PerHead).
ProjectionSpec = Projection | jax.Array | PerHead[Projection] | PerHead[jax.Array]
# Per-head axes of (projection, feature map) in vmap's in_axes: 0 per head, None shared.
HeadAxes = tuple[int | None, int | None]


def check_array(name: str, x: object) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array, got dtype {x.dtype}")
    return x


def check_qkv(
    query: object, key: object, value: object, *, causal: bool
) -> tuple[jax.Array, jax.Array, jax.Array, bool]:
    """Validates BTNH query/key/value (or TNH, given a batch axis); returns them and 'unbatched'."""
    query, key, value = (
        check_array(n, x) for n, x in (("query", query), ("key", key), ("value", value))
    )
    ndims = {query.ndim, key.ndim, value.ndim}
    if len(ndims) != 1 or ndims.pop() not in (3, 4):
        raise ValueError(
            "query, key and value must all have shape (B, T, N, H) or all (T, N, H); got "
            f"{query.shape}, {key.shape}, {value.shape}"
        )
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    batch, length, heads, head_dim = query.shape
    if key.shape[0] != batch or key.shape[2:] != (heads, head_dim):
        raise ValueError(
            f"key must have shape (B, S, N, H) = ({batch}, S, {heads}, {head_dim}) to match "
            f"query {query.shape}; got {key.shape}"
        )
    if value.shape[:3] != key.shape[:3]:
        raise ValueError(
            f"value must have shape (B, S, N, H_v) with (B, S, N) = {key.shape[:3]} as key; "
            f"got {value.shape}"
        )
    if causal and key.shape[1] != length:
        raise ValueError(
            f"causal attention needs as many keys as queries; got query length {length} and "
            f"key length {key.shape[1]}"
        )
    return query, key, value, unbatched


def check_causal(causal: object) -> bool:
    return check_bool("causal", causal)


def check_mask(mask: object, batch: int, length: int) -> jax.Array:
    """A key padding mask of bools, returned as ``(B, S)``; ``None`` means every key is attended
    to. Accepted shapes: ``(B, S)``, or the ``(B, 1, 1, S)`` form that broadcasts over heads
    and queries in ``jax.nn.dot_product_attention`` and Flax attention (``pad[:, None, None]``,
    or ``flax.linen.make_attention_mask(jnp.ones((B, 1)), pad, dtype=bool)``)."""
    if mask is None:
        return jnp.ones((batch, length), dtype=bool)
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be a boolean array (True = attend), got dtype {mask.dtype}")
    if mask.shape == (batch, 1, 1, length):
        return mask[:, 0, 0]
    if mask.shape != (batch, length):
        raise ValueError(
            f"mask must be a key padding mask of shape (B, S) = ({batch}, {length}) or "
            f"(B, 1, 1, S) = ({batch}, 1, 1, {length}); got {mask.shape} (FAVOR cannot apply "
            f"a mask that depends on the query position other than causal=True)"
        )
    return mask


def _check_stacked(name: str, value: PerHead, num_heads: int) -> None:
    for leaf in jax.tree.leaves(value.stacked):
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != num_heads:
            raise ValueError(
                f"{name} is PerHead, so every leaf must have a leading axis N = {num_heads} "
                f"(one entry per head); got a leaf of shape {jnp.shape(leaf)}"
            )


def as_projection(projection: object) -> object:
    """A raw floating array W (``(m, H)``, or ``(N, m, H)`` inside ``PerHead``) wrapped as a
    ``DenseProjection``; anything else unchanged."""
    if isinstance(projection, PerHead):
        return PerHead(as_projection(projection.stacked))
    if isinstance(projection, jax.Array | np.ndarray):
        weights = check_array("projection", projection)
        if weights.ndim < 2 or 0 in weights.shape[-2:]:
            raise ValueError(
                f"projection as an array must be a matrix W of shape (m, H) with m, H >= 1; "
                f"got shape {weights.shape}"
            )
        return DenseProjection(weights)
    return projection


def unwrap_projection(projection: object, num_heads: int) -> tuple[Projection, int | None]:
    """Validates a shared or ``PerHead`` projection (or raw matrices, ``as_projection``);
    returns the projection (the stacked one for ``PerHead``) and its head axis (0 per head,
    ``None`` shared)."""
    projection = as_projection(projection)
    if isinstance(projection, PerHead):
        if not isinstance(projection.stacked, Projection):
            raise TypeError(
                f"projection as PerHead must hold stacked Projections, got "
                f"{type(projection.stacked).__name__}"
            )
        _check_stacked("projection", projection, num_heads)
        return projection.stacked, 0
    if not isinstance(projection, Projection):
        raise TypeError(
            f"projection must be an rfjax.projections.Projection (drawn with a sampler such as "
            f"rfjax.projections.gaussian), a floating matrix W of shape (m, H) or a PerHead of "
            f"them, got {type(projection).__name__}"
        )
    shape = jax.eval_shape(projection.matrix).shape
    if len(shape) != 2:
        raise ValueError(
            f"projection must be one draw (matrix (m, H)) shared by the heads, or N draws "
            f"stacked with jax.vmap and marked PerHead (draw_projection(..., num_heads=N) "
            f"returns one); got a projection with matrix shape {shape}"
        )
    return projection, None


def read_as(shape: tuple[int, ...]) -> str:
    """How ``check_qkv`` reads an array of ``shape`` (4-D: (B, T, N, H); 3-D: (T, N, H))."""
    names = ("B", "T", "N", "H")[-len(shape) :]
    return f"({', '.join(names)}) = {tuple(shape)}"


def check_projection(
    projection: object, head_dim: int, num_heads: int, *, query_shape: tuple[int, ...] = ()
) -> tuple[Projection, int | None]:
    """``unwrap_projection``, and the projection's dim must be the head dim H (the last axis of
    the query, whose given shape ``query_shape`` the message then says how it was read)."""
    projection, axis = unwrap_projection(projection, num_heads)
    if projection.dim != head_dim:
        read = (
            f" The query of shape {tuple(query_shape)} was read as {read_as(query_shape)}: "
            "query, key and value must be (B, T, N, H) or (T, N, H) arrays, the heads on their "
            "own axis (for a (B, T, D) array of N heads pass x.reshape(B, T, N, D // N))."
            if query_shape
            else ""
        )
        raise ValueError(
            f"projection must have dim == head_dim H = {head_dim}; got dim = "
            f"{projection.dim}.{read}"
        )
    return projection, axis


def resolve_feature_map(feature_map: object, num_heads: int) -> tuple[FeatureMap, int | None]:
    """(the map, its head axis): a registered name, a ``FeatureMap`` or a ``PerHead`` of one."""
    if isinstance(feature_map, str):
        if feature_map not in features.available():
            raise ValueError(
                f"feature_map must be a name from rfjax.features.available() "
                f"({', '.join(features.available())}) or a FeatureMap; got {feature_map!r}"
            )
        return features.get(feature_map)(), None
    if isinstance(feature_map, PerHead):
        if not isinstance(feature_map.stacked, FeatureMap):
            raise TypeError(
                f"feature_map as PerHead must hold a stacked rfjax.features.FeatureMap, got "
                f"{type(feature_map.stacked).__name__}"
            )
        _check_stacked("feature_map", feature_map, num_heads)
        return feature_map.stacked, 0
    if isinstance(feature_map, FeatureMap):
        return feature_map, None
    raise TypeError(
        f"feature_map must be a name from rfjax.features.available(), an "
        f"rfjax.features.FeatureMap (FeatureMapPair for two maps) or a PerHead of one; got "
        f"{type(feature_map).__name__}"
    )


def resolve_stabilize(stabilize: object, fmap: FeatureMap) -> bool:
    """Whether to use the maps' log-space form (``scaled_features``) or raw features."""
    if stabilize is None:
        return True
    if not isinstance(stabilize, bool):
        raise TypeError(f"stabilize must be None or a bool, got {stabilize!r}")
    if stabilize and not fmap.has_log_space_form:
        raise ValueError(
            f"stabilize=True needs feature maps with a log-space form (scaled_features, e.g. "
            f"exponential maps such as 'positive'); got {type(fmap).__name__}"
        )
    return stabilize


def compute_dtype(*values: object) -> jnp.dtype:
    """At least float32 (low-precision inputs are accumulated in float32), and the widest
    floating dtype among ``values``' arrays and pytree leaves (a float64 projection computes
    in float64; its features in float32 put float64 into float32 scan carries)."""
    leaves = [x for x in jax.tree.leaves(values) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.result_type(jnp.float32, *(x.dtype for x in leaves))


def log_floor(dtype: jnp.dtype) -> float:
    """A finite stand-in for -inf log-scales (masked keys); differences never overflow."""
    return -0.25 * float(jnp.finfo(dtype).max)


# The default denominator floor of signed feature maps: their estimated normalisers cross zero
# once the estimate's relative error nears 1 (|q|, |k| from ~6 at H = 64, m = 128), and a row
# divided by a floor of float32's smallest normal number was inf or NaN. Normalisers are in
# units where every key's largest term is at most 1 (the stabiliser), so the floor clips only
# rows whose estimate is near 0 or negative, and bounds them by |numerator| / SIGNED_EPS.
SIGNED_EPS = 1e-3


def default_eps(eps: float | None, dtype: jnp.dtype, *, signed: bool) -> float:
    """``eps``, or its default: ``SIGNED_EPS`` for maps with ``signed`` features (a normaliser
    that can be <= 0), else the smallest normal number of ``dtype`` (only underflow)."""
    if eps is None:
        return SIGNED_EPS if signed else float(jnp.finfo(dtype).tiny)
    return check_real("eps", eps, positive=True)


def vary_like(init: jax.Array, *references: object) -> jax.Array:
    """``init`` marked as varying over every ``shard_map`` mesh axis that a leaf of
    ``references`` varies over (a no-op outside ``shard_map``).

    A scan's carry must keep its type, and inside ``shard_map`` the type includes the mesh axes
    a value varies over: a carry started from constants (zeros) and updated from a device's
    shard must be marked varying from the start.
    """
    leaves = jax.tree.leaves(references)
    axes = frozenset().union(*(jax.typeof(x).manual_axis_type.varying for x in leaves))
    missing = tuple(sorted(axes - jax.typeof(init).manual_axis_type.varying))
    return jax.lax.pcast(init, missing, to="varying") if missing else init
