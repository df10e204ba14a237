"""Causal FAVOR: per head, chunked prefix sums with the key stabiliser's running maximum, so that
no position sees a later one: one shift per feature for exponential maps, whose features the
op forms chunk by chunk from the rows (``_log_prefix.causal_feature_prefix``,
``uses_log_space_prefix``), one per key for the others (``_prefix.causal_prefix``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax.attention._checks import HeadAxes, log_floor
from rfjax.attention._head_features import (
    feature_logs,
    finite_key_features,
    finite_query_features,
    floored_ratio,
    has_feature_logs,
    normalise,
)
from rfjax.attention._log_prefix import causal_feature_prefix
from rfjax.attention._prefix import causal_prefix
from rfjax.attention._sequence_parallel import (
    earlier_devices_any,
    sequence_parallel_feature_prefix,
    sequence_parallel_prefix,
)
from rfjax.features import FeatureMap, exponential_side
from rfjax.projections import Projection


def _normalise(numerator_and_denominator: jax.Array, eps: float) -> jax.Array:
    numerator, denominator = (
        numerator_and_denominator[..., :-1],
        numerator_and_denominator[..., -1:],
    )
    return floored_ratio(numerator, denominator, eps)


def uses_log_space_prefix(fmap: FeatureMap, stabilize: bool) -> bool:
    """Whether causal attention with ``fmap`` keeps a key shift per feature (the one place
    that decides it): stabilised exponential maps (both sides: positive features, OPRF, DERF,
    the cluster hybrid) run ``_log_prefix.causal_log_prefix``.

    One shift per key (``_prefix.causal_prefix``) loses every key feature below e^-87 of the
    key's largest before a query can weigh it; at large |q|, |k| the query's largest features
    and the keys' differ, and rows underflow (0 / 0) or their gradients overflow: positive
    features at |q| = |k| = 110-120 (H = 64, m = 128) had NaN gradients and outputs off the
    float64 result by up to 200x the rounding tolerance (issue 32), the data-fitted maps from
    norm 40 (issue 19). The log-space op forms the chunk's quadratic form per feature in blocks
    of ``_log_prefix.LOG_BLOCK`` positions, at about the per-key op's cost.
    """
    return stabilize and has_feature_logs(fmap)


def map_log_features(maps: tuple[Projection, FeatureMap], rows: jax.Array, side: str) -> jax.Array:
    """The exponential map's log-features l_side(rows) for ``maps`` = (projection, map): the
    function ``_log_prefix.causal_feature_prefix`` applies chunk by chunk."""
    projection, fmap = maps
    exponential = exponential_side(fmap, side)  # type: ignore[arg-type]
    assert exponential is not None
    return exponential.log_features(rows, projection, side=side)  # type: ignore[arg-type]


def normalised_log_features(
    maps: tuple[Projection, FeatureMap], rows: jax.Array, side: str
) -> jax.Array:
    """``map_log_features`` of the rows scaled by H^-1/4 (``normalise``): applied chunk by
    chunk, so that the scaled (T, N, H) queries and keys are never formed."""
    return map_log_features(maps, normalise(rows), side)


def _log_space_heads(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    chunk_size: int,
    eps: float,
    sequence_axis: str | None,
    matmul_dtype: jnp.dtype | None,
) -> jax.Array:
    """All heads of one sequence for ``uses_log_space_prefix`` maps: query (T, N, H), key
    (T, N, H), value (T, N, H_v), valid (T,) -> (T, N, H_v). The op forms the features from
    the rows chunk by chunk, all heads at once in the rows' layout (a vmap over heads would
    copy each output and cotangent heads-first: 1.5x the (T, N, m) features at T = 64k). It
    leaves out, and flags, the query, key and value rows that are not finite, and the rows
    whose features are not; the outputs that read them are NaN (see ``_head_attention``)."""
    prefix = causal_feature_prefix
    if sequence_axis is not None:
        prefix = functools.partial(sequence_parallel_feature_prefix, axis_name=sequence_axis)
    result = prefix(
        (projection, fmap),
        query,
        key,
        value,
        valid,
        log_features=normalised_log_features,
        chunk=chunk_size,
        matmul_dtype=matmul_dtype,
        normaliser=True,
        head_axes=axes,
    )
    poisoned = result.query_bad | (jnp.cumsum(result.key_bad, axis=0, dtype=jnp.int32) > 0)
    if sequence_axis is not None:
        poisoned = poisoned | earlier_devices_any(jnp.any(result.key_bad, axis=0), sequence_axis)
    out = _normalise(result.out.astype(value.dtype), eps)
    return jnp.where(poisoned[..., None], jnp.nan, out)


def _head_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    stabilize: bool,
    chunk_size: int,
    eps: float,
    sequence_axis: str | None,
) -> jax.Array:
    """One head, for the maps with one shift per key (``_prefix.causal_prefix``): query
    (T, H), key (T, H), value (T, H_v), valid (T,) -> (T, H_v); with ``sequence_axis``, the
    local shard of a sequence split along that mesh axis.

    Non-finite queries, keys and values are kept out of the prefix sums (``finite_*_features``)
    and make NaN exactly the outputs that attend to them: row t if its query is not finite, and
    every row t >= j for an unmasked key or value j that is not finite (on any earlier device).
    """
    floor = log_floor(query.dtype)
    (phi_q, _), bad_query = finite_query_features(query, projection, fmap, stabilize, False)
    (key_factor, key_log), value, bad_key = finite_key_features(
        key,
        value,
        valid,
        lambda k: feature_logs(k, projection, fmap, stabilize, False, "key"),
        floor,
    )
    # The denominator's column: 1 for the keys that count, 0 for those left out.
    counted = (valid & ~bad_key).astype(value.dtype)
    value_ones = jnp.concatenate([value, counted[:, None]], axis=-1)
    poisoned = bad_query | (jnp.cumsum(bad_key, dtype=jnp.int32) > 0)
    if sequence_axis is not None:
        poisoned = poisoned | earlier_devices_any(jnp.any(bad_key), sequence_axis)
    psi_k, mu = key_factor, key_log[:, 0]
    running_max = jax.lax.cummax(mu, axis=0)
    prefix: Callable[..., jax.Array]
    if sequence_axis is None:
        prefix = causal_prefix
    else:
        prefix = functools.partial(sequence_parallel_prefix, axis_name=sequence_axis)
    out = _normalise(prefix(phi_q, psi_k, value_ones, mu, running_max, chunk_size), eps)
    return jnp.where(poisoned[:, None], jnp.nan, out)


def _per_key_heads(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    chunk_size: int,
    eps: float,
    sequence_axis: str | None,
) -> jax.Array:
    """All heads of one sequence for the other maps: ``_head_attention`` vmapped over the heads
    of the rows scaled by H^-1/4 (T, N, H) -> (T, N, H_v)."""
    head = functools.partial(
        _head_attention,
        stabilize=stabilize,
        chunk_size=chunk_size,
        eps=eps,
        sequence_axis=sequence_axis,
    )
    over_heads = jax.vmap(head, in_axes=(1, 1, 1, None, *axes), out_axes=1)
    return over_heads(normalise(query), normalise(key), value, valid, projection, fmap)


def causal_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    chunk_size: int,
    eps: float,
    sequence_axis: str | None = None,
    matmul_dtype: jnp.dtype | None = None,
) -> jax.Array:
    """All heads, BTNH in and out: ``_log_space_heads`` or ``_per_key_heads`` (one sequence)
    vmapped over the batch. Queries and keys as given: scaled by H^-1/4 here (``normalise``)."""
    if uses_log_space_prefix(fmap, stabilize):
        heads = functools.partial(_log_space_heads, matmul_dtype=matmul_dtype)
    else:
        heads = functools.partial(_per_key_heads, stabilize=stabilize)
    sequence = functools.partial(
        heads, axes=axes, chunk_size=chunk_size, eps=eps, sequence_axis=sequence_axis
    )
    return jax.vmap(sequence, in_axes=(0, 0, 0, 0, None, None))(
        query, key, value, mask, projection, fmap
    )
