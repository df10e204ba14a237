"""Causal FAVOR: per head, chunked prefix sums with the key stabiliser's running maximum, so that
no position sees a later one: one shift per key (``_prefix.causal_prefix``) or, for the maps
``uses_log_space_prefix`` names, one per feature (``_log_prefix.causal_log_prefix``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax.attention._checks import HeadAxes, log_floor
from rfjax.attention._head_features import (
    exponential_side,
    feature_logs,
    finite_key_features,
    finite_query_features,
    floored_ratio,
    has_feature_logs,
)
from rfjax.attention._log_prefix import causal_log_prefix
from rfjax.attention._prefix import causal_prefix
from rfjax.attention._sequence_parallel import (
    earlier_devices_any,
    sequence_parallel_log_prefix,
    sequence_parallel_prefix,
)
from rfjax.features import SIDES, ExponentialFeatureMap, FeatureMap, FeatureMapPair
from rfjax.projections import Projection


def _normalise(numerator_and_denominator: jax.Array, eps: float) -> jax.Array:
    numerator, denominator = (
        numerator_and_denominator[..., :-1],
        numerator_and_denominator[..., -1:],
    )
    return floored_ratio(numerator, denominator, eps)


# Largest query boost (natural log): boosted query features stay <= e^60, so the chunk's
# (C, m) x (m, C) products stay below float32's e^88 for m up to ~e^20.
MAX_QUERY_BOOST = 60.0


def _positive_without_floor(fmap: FeatureMap) -> bool:
    """Maps whose stabilised features are >= 0 on both sides (exponential maps) and whose
    denominator floor only catches underflow: a per-row query factor is free for them."""
    if isinstance(fmap, FeatureMapPair):
        return _positive_without_floor(fmap.query) and _positive_without_floor(fmap.key)
    return isinstance(fmap, ExponentialFeatureMap) and not fmap.needs_denominator_floor


def _query_boost(
    phi_q: jax.Array, psi_k: jax.Array, mu: jax.Array, running_max: jax.Array
) -> jax.Array:
    """Per-row log-factor b_t (T,) for the stabilised query features, a constant that cancels.

    With query features psi_q (largest entry 1) and key terms psi_k,j exp(mu_j - c_t) (running
    maximum c_t), the largest term of row t's denominator is exp(M_t), M_t = max_i (log psi_q,ti
    + max_{j <= t} (log psi_k,ji + mu_j)) - c_t <= 0. At large |q|, |k| the query's and the keys'
    largest features differ, M_t falls below float32's exp(-87) and the row's sums underflow
    (0 / 0). Scaling row t by exp(b_t), b_t = min(-M_t, MAX_QUERY_BOOST), lifts its largest
    term to 1 (or by e^60). Causal: M_t reads keys j <= t only.
    """
    key_logs = jax.lax.cummax(jnp.log(psi_k) + mu[:, None], axis=0)
    best = jnp.max(jnp.log(phi_q) + key_logs, axis=-1) - running_max
    return jax.lax.stop_gradient(jnp.clip(-best, 0.0, MAX_QUERY_BOOST))


def uses_log_space_prefix(fmap: FeatureMap, stabilize: bool) -> bool:
    """Whether causal attention with ``fmap`` keeps a key shift per feature (the one place
    that decides it).

    Stabilised exponential maps (both sides) whose ``per_feature_causal_shifts`` is set (on
    either side) run ``_log_prefix.causal_log_prefix``: their query-side and key-side
    log-features peak in different directions (data-fitted or asymmetric transforms), and one
    shift per key loses every key feature below e^-87 of the key's largest before a query can
    weigh it (rows 0 / 0 at norms of 40-100). It costs C^2 m exponentials per chunk where the
    per-key shift does a matmul: 4-5x the time of forward + backward for positive features at
    T = 1024, m = 256, C = 64, 4 heads (medians of 7 interleaved repeats, two runs on a shared
    2-core CPU: 0.70 s and 0.58 s against 0.14 s and 0.14 s). Positive features
    (``"positive"``, ``"positive_antithetic"``) keep the per-key shift with the per-row query
    boost (``_query_boost``), which is exact for them up to norm 100 (tests).
    """
    if not (stabilize and has_feature_logs(fmap)):
        return False
    sides = [exponential_side(fmap, side) for side in SIDES]
    return any(side is not None and side.per_feature_causal_shifts for side in sides)


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
    """One head: query (T, H), key (T, H), value (T, H_v), valid (T,) -> (T, H_v); with
    ``sequence_axis``, the local shard of a sequence split along that mesh axis.

    Non-finite queries, keys and values are kept out of the prefix sums (``finite_*_features``)
    and make NaN exactly the outputs that attend to them: row t if its query is not finite, and
    every row t >= j for an unmasked key or value j that is not finite (on any earlier device).
    """
    floor = log_floor(query.dtype)
    per_feature = uses_log_space_prefix(fmap, stabilize)
    (phi_q, query_log), bad_query = finite_query_features(
        query, projection, fmap, stabilize, per_feature
    )
    (key_factor, key_log), value, bad_key = finite_key_features(
        key,
        value,
        valid,
        lambda k: feature_logs(k, projection, fmap, stabilize, per_feature, "key"),
        floor,
    )
    # The denominator's column: 1 for the keys that count, 0 for those left out.
    counted = (valid & ~bad_key).astype(value.dtype)
    value_ones = jnp.concatenate([value, counted[:, None]], axis=-1)
    poisoned = bad_query | (jnp.cumsum(bad_key, dtype=jnp.int32) > 0)
    if sequence_axis is not None:
        poisoned = poisoned | earlier_devices_any(jnp.any(bad_key), sequence_axis)
    if per_feature:
        if sequence_axis is None:
            sums, _ = causal_log_prefix(query_log, key_log, value_ones, chunk_size)
        else:
            sums = sequence_parallel_log_prefix(
                query_log, key_log, value_ones, chunk_size, axis_name=sequence_axis
            )
        return jnp.where(poisoned[:, None], jnp.nan, _normalise(sums, eps))
    psi_k, mu = key_factor, key_log[:, 0]
    running_max = jax.lax.cummax(mu, axis=0)
    if stabilize and _positive_without_floor(fmap):
        phi_q = phi_q * jnp.exp(_query_boost(phi_q, psi_k, mu, running_max))[:, None]
    prefix: Callable[..., jax.Array]
    if sequence_axis is None:
        prefix = causal_prefix
    else:
        prefix = functools.partial(sequence_parallel_prefix, axis_name=sequence_axis)
    out = _normalise(prefix(phi_q, psi_k, value_ones, mu, running_max, chunk_size), eps)
    return jnp.where(poisoned[:, None], jnp.nan, out)


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
) -> jax.Array:
    """All heads, BTNH in and out: ``_head_attention`` vmapped over batch and heads."""
    head = functools.partial(
        _head_attention,
        stabilize=stabilize,
        chunk_size=chunk_size,
        eps=eps,
        sequence_axis=sequence_axis,
    )
    over_heads = jax.vmap(head, in_axes=(1, 1, 1, None, *axes), out_axes=1)
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None, None))
    return over_batch(query, key, value, mask, projection, fmap)
