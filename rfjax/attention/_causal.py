"""Causal FAVOR: per head, chunked prefix sums (``_prefix.causal_prefix``) with the key
stabiliser's running maximum, so that no position sees a later one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax.attention._checks import HeadAxes, log_floor
from rfjax.attention._head_features import (
    finite_key_features,
    finite_query_features,
    floored_ratio,
    scaled_key_features,
)
from rfjax.attention._prefix import causal_prefix
from rfjax.features import FeatureMap
from rfjax.projections import Projection


def _normalise(numerator_and_denominator: jax.Array, eps: float) -> jax.Array:
    numerator, denominator = (
        numerator_and_denominator[..., :-1],
        numerator_and_denominator[..., -1:],
    )
    return floored_ratio(numerator, denominator, eps)


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
) -> jax.Array:
    """One head: query (T, H), key (T, H), value (T, H_v), valid (T,) -> (T, H_v).

    Non-finite queries, keys and values are kept out of the prefix sums (``finite_*_features``)
    and make NaN exactly the outputs that attend to them: row t if its query is not finite, and
    every row t >= j for an unmasked key or value j that is not finite.
    """
    floor = log_floor(query.dtype)
    phi_q, bad_query = finite_query_features(query, projection, fmap, stabilize)
    psi_k, mu, value, bad_key = finite_key_features(
        key,
        value,
        valid,
        lambda k: scaled_key_features(k, projection, fmap, stabilize),
        floor,
    )
    value_ones = jnp.concatenate([value, jnp.ones((*value.shape[:-1], 1), value.dtype)], axis=-1)
    running_max = jax.lax.cummax(mu, axis=0)
    out = _normalise(causal_prefix(phi_q, psi_k, value_ones, mu, running_max, chunk_size), eps)
    poisoned = bad_query | (jnp.cumsum(bad_key, dtype=jnp.int32) > 0)
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
) -> jax.Array:
    """All heads, BTNH in and out: ``_head_attention`` vmapped over batch and heads."""
    head = functools.partial(_head_attention, stabilize=stabilize, chunk_size=chunk_size, eps=eps)
    over_heads = jax.vmap(head, in_axes=(1, 1, 1, None, *axes), out_axes=1)
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None, None))
    return over_batch(query, key, value, mask, projection, fmap)
