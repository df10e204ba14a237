"""Attention over ``(B, T, N, H)`` heads as ``PerformerAttention`` (linen and NNX) computes it:
FAVOR forward, its explicit weights and decoding (a prefill or one step) through
``rfjax.attention`` with a ``FavorMask``, and exact attention with non-finite inputs isolated
and its key/value cache step."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rfjax._validation import is_concrete
from rfjax.attention import (
    DecodeState,
    PerHead,
    favor_attention,
    favor_attention_weights,
    favor_decode_step,
    favor_prefill,
)
from rfjax.features import FeatureMap
from rfjax.nn._attention_masks import FavorMask, favor_mask
from rfjax.projections import Projection


def by_causality[T](compute: Callable[[bool], T], causal: bool | jax.Array) -> T:
    """``compute(causal)``; a traced ``causal`` selects between both at run time."""
    if isinstance(causal, bool):
        return compute(causal)
    return jax.lax.cond(causal, lambda: compute(True), lambda: compute(False))


def favor_heads(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: FavorMask,
    *,
    chunk_size: int,
    eps: float | None,
    sequence_axis: str | None = None,
    implementation: str = "auto",
) -> jax.Array:
    """``favor_attention`` over ``(B, T, N, H)`` heads with a ``FavorMask`` (on the local shard
    of a sequence split over the mesh axis ``sequence_axis``, if given), by ``implementation``
    (``favor_attention``'s)."""
    return by_causality(
        lambda causal: favor_attention(
            query,
            key,
            value,
            projection,
            feature_map=feature_map,
            causal=causal,
            mask=mask.key_padding,
            chunk_size=chunk_size,
            eps=eps,
            sequence_axis=sequence_axis,
            implementation=implementation,
        ),
        mask.causal,
    )


def favor_heads_weights(
    query: jax.Array,
    key: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: FavorMask,
    *,
    eps: float | None,
) -> jax.Array:
    """The ``(B, N, T, S)`` weights that ``favor_heads`` applies (``favor_attention_weights``)."""
    return by_causality(
        lambda causal: favor_attention_weights(
            query,
            key,
            projection,
            feature_map=feature_map,
            causal=causal,
            mask=mask.key_padding,
            eps=eps,
        ),
        mask.causal,
    )


def decode_heads(
    state: DecodeState,
    index: jax.Array,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: jax.Array | None,
    *,
    chunk_size: int,
    eps: float | None,
) -> tuple[DecodeState, jax.Array]:
    """T tokens of causal FAVOR while decoding, on ``(B, T, N, H)`` heads after ``index`` tokens
    (the cache's): one token is a step (``favor_decode_step``); T > 1 tokens are a prefill
    (``favor_prefill``, the chunked causal form in one call), which starts the sequence
    (``check_prefill_start``). The new state keeps ``state``'s dtype.

    ``mask``: ``None``; for one token, whether its key is attended to, B elements (any shape,
    e.g. ``(B, 1, 1, 1)``); for a prefill, a key padding mask or Flax mask as ``favor_mask``
    reads them (causality is implied).
    """
    batch, length = query.shape[:2]
    if length == 1:
        return decode_step(state, query, key, value, projection, feature_map, mask, eps=eps)
    check_prefill_start(index)
    if mask is not None and jnp.ndim(mask) and jnp.shape(mask)[-1] not in (1, length):
        raise ValueError(
            f"while decoding, a prefill's mask covers its T = {length} tokens (a (B, T) key "
            f"padding mask or a T x T Flax mask; the Performer's state keeps no earlier keys); "
            f"got shape {jnp.shape(mask)}"
        )
    padding = favor_mask(
        mask,
        batch_shape=(batch,),
        num_heads=query.shape[2],
        query_length=length,
        key_length=length,
        causal=True,
    ).key_padding
    out, prefilled = favor_prefill(
        query,
        key,
        value,
        projection,
        feature_map=feature_map,
        mask=padding,
        chunk_size=chunk_size,
        eps=eps,
    )
    return jax.tree.map(lambda new, old: new.astype(old.dtype), prefilled, state), out


PREFILL_START = (
    "a call of T > 1 tokens while decoding (a prefill) starts a sequence: the cache must be "
    "empty (cache_index 0, as init or init_cache leave it); continue a sequence one token per "
    "call"
)


def check_prefill_start(index: jax.Array) -> None:
    """A prefill needs an empty cache (``index`` 0): raises ``ValueError`` here for a concrete
    ``index``, at run time (``jax.debug.callback``) for a traced one."""
    if is_concrete(index):
        _raise_unless_start(np.asarray(index))
    else:
        jax.debug.callback(_raise_unless_start, index)


def _raise_unless_start(index: np.ndarray) -> None:
    if int(index) != 0:
        raise ValueError(f"{PREFILL_START}; got cache_index {int(index)}")


def decode_step(
    state: DecodeState,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: jax.Array | None,
    *,
    eps: float | None,
) -> tuple[DecodeState, jax.Array]:
    """One token of causal FAVOR (``favor_decode_step``) on ``(B, 1, N, H)`` heads.

    ``mask``: ``None`` or a mask for the new token's key (True = attend) of size B (any shape
    of B elements, e.g. ``(B, 1, 1, 1)``).
    """
    batch = query.shape[0]
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.size != batch:
            raise ValueError(
                f"while decoding, mask must say whether the new token is attended to: B = "
                f"{batch} elements (e.g. shape (B, 1, 1, 1)); got shape {mask.shape}"
            )
        mask = mask.reshape(batch).astype(bool)
    state, out = favor_decode_step(
        state,
        query[:, 0],
        key[:, 0],
        value[:, 0],
        projection,
        feature_map=feature_map,
        mask=mask,
        eps=eps,
    )
    return state, out[:, None]


def isolating_non_finite(
    attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
    *,
    causal: bool = False,
) -> jax.Array:
    """Exact attention ``attend(query, key, value)`` (Flax's ``dot_product_attention`` with
    ``mask``, and the causal mask when ``causal``, applied inside) on ``(B, T, N, H)`` heads,
    with non-finite inputs isolated as in
    FAVOR (``rfjax.attention.favor_attention``): a query, key or value row holding a NaN or inf
    is zeroed before ``attend`` (Flax multiplies masked weights by values, so 0 * NaN would reach
    every row), and the output rows that attend to it are NaN: a query's own row, every row
    whose ``mask`` (nonzero = attend, broadcastable to ``(B, N, T, S)``; ``None``: all)
    allows a key or value. Masked keys and values are never read."""
    bad_query, bad_key = (~jnp.all(jnp.isfinite(x), axis=-1) for x in (query, key))
    bad_key = bad_key | ~jnp.all(jnp.isfinite(value), axis=-1)  # (B, S, N)
    query = jnp.where(bad_query[..., None], 0, query)
    key, value = (jnp.where(bad_key[..., None], 0, x) for x in (key, value))
    out = attend(query, key, value)
    groups = bad_query.shape[-1] // bad_key.shape[-1]  # grouped key/value heads read by N/N_kv
    reads_bad = jnp.repeat(jnp.moveaxis(bad_key, 1, 2), groups, axis=1)[:, :, None, :]  # B,N,1,S
    batch, length, heads = bad_query.shape
    if causal and mask is None:  # row t reads keys j <= t: from the first bad key on, O(T)
        first_bad = jnp.argmax(reads_bad[:, :, 0], axis=-1)  # (B, N); 0 where none is bad
        any_bad = jnp.any(reads_bad[:, :, 0], axis=-1)
        poisoned = any_bad[..., None] & (jnp.arange(length) >= first_bad[..., None])
    else:
        if causal:  # row t reads keys j <= t only
            keys = key.shape[1]
            reads_bad = reads_bad & (jnp.arange(keys)[None, :] <= jnp.arange(length)[:, None])
        if mask is not None:
            reads_bad = reads_bad & (jnp.asarray(mask) != 0)
        poisoned = jnp.broadcast_to(jnp.any(reads_bad, axis=-1), (batch, heads, length))
    poisoned = jnp.moveaxis(poisoned, 1, 2) | bad_query
    return jnp.where(poisoned[..., None], jnp.nan, out)


def kv_cache_step(
    cached_key: jax.Array,
    cached_value: jax.Array,
    index: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Exact attention's decode call, as Flax's for one token: writes the keys and values
    ``(B, T, N, H)`` of T tokens at positions ``index, ..., index + T - 1`` of the caches
    ``(B, L, N, H)``; returns the caches and the mask ``(B, 1, T, L)`` under which query t sees
    the positions <= index + t (and ``mask``, if given, broadcast against it). T > 1 tokens are
    a prefill, which starts a sequence (``check_prefill_start``).

    A token whose key or value holds a NaN or inf is written as a NaN key and a zero value:
    attention that selects masked scores (Flax's and JAX's ``dot_product_attention``) then
    gives NaN to exactly the rows that attend to it (their scores hold a NaN) and nothing to
    the others (its score is selected away, its value is 0), as ``isolating_non_finite`` does,
    without a pass over the whole cache per token (which made a decode step 2.8x Flax's at
    L = 16k on CPU).

    Tokens past the cache's L positions raise ``ValueError`` for a concrete ``index``, and
    make this call's rows and every later one NaN for a traced one (Flax's clamped write
    overwrote the last positions silently)."""
    batch, capacity = cached_key.shape[:2]
    length = key.shape[1]
    if length > capacity:
        raise ValueError(
            f"the decode cache holds L = {capacity} positions (the length init or init_cache "
            f"was given); got {length} tokens in one call (keys of shape {key.shape})"
        )
    if length > 1:
        check_prefill_start(index)
    if is_concrete(index) and int(index) + length > capacity:
        raise ValueError(
            f"the decode cache holds L = {capacity} positions (the length init or init_cache "
            f"was given) and is full after {int(index)} tokens; got {length} more"
        )
    # A traced index past the cache: its tokens are written (at the last positions, where
    # dynamic_update_slice clamps them) as NaN keys, so every row of this call and later
    # ones is NaN, not attention over a cache whose last tokens were overwritten.
    fits = index + length <= capacity
    usable = jnp.all(jnp.isfinite(key), axis=-1) & jnp.all(jnp.isfinite(value), axis=-1) & fits
    key = jnp.where(usable[..., None], key, jnp.nan)
    value = jnp.where(usable[..., None], value, 0)
    zero = jnp.zeros((), index.dtype)
    at = (zero, index, zero, zero)
    cached_key = jax.lax.dynamic_update_slice(cached_key, key.astype(cached_key.dtype), at)
    cached_value = jax.lax.dynamic_update_slice(cached_value, value.astype(cached_value.dtype), at)
    seen = jnp.arange(capacity)[None, :] <= index + jnp.arange(length)[:, None]
    written = jnp.broadcast_to(seen, (batch, 1, length, capacity))
    return cached_key, cached_value, written if mask is None else written & jnp.asarray(mask, bool)
