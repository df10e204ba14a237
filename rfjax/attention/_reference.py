"""Exact softmax attention in FAVOR's conventions: the reference that FAVOR approximates."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from rfjax.attention._checks import check_causal, check_mask, check_qkv, compute_dtype


def softmax_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    causal: bool = False,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Exact softmax attention softmax(q k^T / sqrt(H)) v: the reference for FAVOR.

    Same conventions as ``favor_attention`` (BTNH shapes, key padding mask, causal), computed in
    at least float32; a query with no unmasked key gets 0 (no key at all, S = 0, included), and
    no query (T = 0) gives an empty output. Non-finite inputs reach exactly the
    outputs that attend to them, as in ``favor_attention``: a query row holding a NaN or inf
    makes its own output row NaN; an unmasked key or value at position j makes every row that
    attends to it NaN (every row, or rows t >= j if causal); masked keys and values are never
    read, and no other output or gradient sees them (weights are selected with ``where``,
    never multiplied by 0).

    Args:
      query: ``(B, T, N, H)``.
      key: ``(B, S, N, H)``.
      value: ``(B, S, N, H_v)``.
      causal: attend only to keys j <= t.
      mask: key padding mask ``(B, S)``, bool, True = attend.

    Returns:
      ``(B, T, N, H_v)`` in the inputs' result dtype.
    """
    causal = check_causal(causal)
    query, key, value, unbatched = check_qkv(query, key, value, causal=causal)
    batch, key_length = key.shape[:2]
    mask = check_mask(mask[None] if unbatched and mask is not None else mask, batch, key_length)
    out = _softmax_attention(query, key, value, mask, causal=causal)
    return out[0] if unbatched else out


@functools.partial(jax.jit, static_argnames=("causal",))
def _softmax_attention(query, key, value, mask, *, causal):
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = compute_dtype(query, key, value)
    query, key, value = (x.astype(dtype) for x in (query, key, value))
    # Non-finite rows are read by no product (0 * NaN would reach every row): they are zeroed,
    # and the rows that attend to them (a query: its own) are set to NaN at the end.
    bad_query, bad_key = (~jnp.all(jnp.isfinite(x), axis=-1) for x in (query, key))
    bad_key = bad_key | ~jnp.all(jnp.isfinite(value), axis=-1)  # (B, S, N)
    query = jnp.where(bad_query[..., None], 0, query)
    key, value = (jnp.where(bad_key[..., None], 0, x) for x in (key, value))
    logits = jnp.einsum("btnh,bsnh->bnts", query, key) / math.sqrt(query.shape[-1])
    allowed = jnp.broadcast_to(mask[:, None, None, :], logits.shape)
    if causal:
        allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], dtype=bool))
    logits = jnp.where(allowed, logits, -jnp.inf)
    # initial: no key at all (S = 0) is a row with no unmasked key, not an empty reduction.
    shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf))
    scores = jnp.where(allowed, jnp.exp(logits - jnp.where(allowed, shift, 0)), 0)
    weights = scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1.0e-30)
    out = jnp.einsum("bnts,bsnh->btnh", weights, value)
    poisoned = jnp.any(allowed & jnp.moveaxis(bad_key, 1, 2)[:, :, None, :], axis=-1)
    poisoned = jnp.moveaxis(poisoned, 1, 2) | bad_query  # (B, T, N)
    return jnp.where(poisoned[..., None], jnp.nan, out).astype(out_dtype)
