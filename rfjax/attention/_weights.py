"""The attention matrix of FAVOR formed explicitly (O(T S) memory): for analysis and tests."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax.attention._checks import (
    FeatureMapSpec,
    HeadAxes,
    ProjectionSpec,
    check_causal,
    check_mask,
    check_projection,
    check_qkv,
    compute_dtype,
    default_eps,
    log_floor,
    resolve_feature_map,
    resolve_stabilize,
)
from rfjax.attention._data_fitted import fit_if_unfitted
from rfjax.attention._head_features import (
    feature_logs,
    floored_ratio,
    has_feature_logs,
    has_signed_features,
    key_features,
    normalise,
    query_features,
)
from rfjax.features import FeatureMap
from rfjax.projections import Projection

# The causal weights form rows x S x m exponents at a time, over all batch rows and heads:
# rows is the most that keeps them to this many elements (64 MiB in float32).
ROW_BLOCK_ELEMENTS = 2**24


def favor_attention_weights(
    query: jax.Array,
    key: jax.Array,
    projection: ProjectionSpec,
    *,
    feature_map: FeatureMapSpec = "positive",
    causal: bool = False,
    mask: jax.Array | None = None,
    stabilize: bool | None = None,
    eps: float | None = None,
) -> jax.Array:
    """The attention matrix that ``favor_attention`` applies implicitly, formed explicitly.

    A_tj = phi_Q(q_t) . phi_K(k_j) / sum_{l in A(t)} phi_Q(q_t) . phi_K(k_l) for j in A(t), else
    0, with the same features and stabiliser as ``favor_attention``. Exponential maps
    (phi = exp(l): positive, OPRF, DERF, cluster hybrid) form the scores in log space,
    sum_i exp(l_i(q_t) + l_i(k_j) - M_t) with M_t the largest exponent over A(t) and the
    features, so a row's largest term is 1 and no row underflows at any norm that
    ``favor_attention`` takes (one shift per key, before 2026-11-29, emptied the data-fitted
    maps' rows from |x'| ~ 16 in float32); other maps shift each key by its own scale and row
    t by the largest over A(t). O(T S) memory (causal exponential maps: blocks of rows of
    ``(rows, S, m)`` exponents, at most ``ROW_BLOCK_ELEMENTS`` over the batch and heads): for
    analysis and tests (``favor_attention(q, k, v)`` equals ``A @ v`` up to rounding).

    Args:
      query: ``(B, T, N, H)``.
      key: ``(B, S, N, H)``; S == T if ``causal``.
      projection: as in ``favor_attention``.
      feature_map: as in ``favor_attention`` (an unfitted data-fitted map, e.g. ``"oprf"``, is
        fitted to these queries and keys as ``favor_attention`` fits it: bidirectional only).
      causal: attend only to keys j <= t.
      mask: key padding mask ``(B, S)``, bool.
      stabilize: as in ``favor_attention``.
      eps: as in ``favor_attention``.

    Returns:
      Row-stochastic weights ``(B, N, T, S)`` in the computation dtype (at least float32), as
      ``jax.nn.dot_product_attention`` uses them; rows with no key are 0.

    Raises:
      TypeError, ValueError: as ``favor_attention`` (e.g. an unfitted data-fitted
        ``feature_map`` with ``causal=True``).
    """
    causal = check_causal(causal)
    query, key, _, unbatched = check_qkv(query, key, key[..., :1], causal=causal)
    if unbatched:
        raise ValueError("favor_attention_weights needs batched (B, T, N, H) inputs")
    batch, key_length, num_heads, head_dim = key.shape
    mask = check_mask(mask, batch, key_length)
    projection, projection_axis = check_projection(
        projection, head_dim, num_heads, query_shape=query.shape
    )
    fmap, map_axis = resolve_feature_map(feature_map, num_heads)
    dtype = compute_dtype(query, key, projection)
    # OPRF/DERF without statistics: fitted as favor_attention fits them (_data_fitted).
    fmap, map_axis = fit_if_unfitted(fmap, map_axis, query, key, mask, causal=causal, dtype=dtype)
    stabilize = resolve_stabilize(stabilize, fmap)
    eps = default_eps(eps, dtype, signed=has_signed_features(fmap))
    if query.size == 0 or key.size == 0:  # no rows, or no keys: every row is 0
        return jnp.zeros((batch, num_heads, query.shape[1], key_length), dtype)
    return _favor_attention_weights(
        query,
        key,
        mask,
        projection,
        fmap,
        axes=(projection_axis, map_axis),
        stabilize=stabilize,
        causal=causal,
        eps=eps,
    )


@functools.partial(jax.jit, static_argnames=("axes", "stabilize", "causal", "eps"))
def _favor_attention_weights(
    query: jax.Array,
    key: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    causal: bool,
    eps: float,
) -> jax.Array:
    dtype = compute_dtype(query, key, projection)
    floor = log_floor(dtype)
    batch, _, num_heads, _ = query.shape

    def head(q, k, valid, proj, f):
        allowed = jnp.broadcast_to(valid[None, :], (q.shape[0], k.shape[0]))
        if causal:
            allowed = allowed & jnp.tril(jnp.ones(allowed.shape, dtype=bool))
        if stabilize and has_feature_logs(f):
            log_q = feature_logs(q, proj, f, stabilize, True, "query").log
            log_k = key_features(k, valid, proj, f, stabilize, floor, per_feature=True).log
            if causal:
                scores = causal_log_scores(log_q, log_k, allowed, parallel=batch * num_heads)
            else:
                scores = log_scores(log_q, log_k, allowed)
        else:
            scores = row_shifted_scores(q, k, valid, proj, f, allowed, stabilize, floor)
        return floored_ratio(scores, jnp.sum(scores, axis=1, keepdims=True), eps)

    over_heads = jax.vmap(head, in_axes=(1, 1, None, *axes))
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, None, None))
    query, key = normalise(query.astype(dtype)), normalise(key.astype(dtype))
    return over_batch(query, key, mask, projection, fmap)


def log_scores(log_q: jax.Array, log_k: jax.Array, allowed: jax.Array) -> jax.Array:
    """Bidirectional scores s_tj = sum_f exp(lq_tf + lk_jf - M_t) ``(T, S)`` from the
    log-features ``(T, m)``, ``(S, m)``, with M_t = max_f (lq_tf + c_f) and c_f = max over the
    attended keys of lk_jf: each factor is at most 1 and a row's largest term is 1, so no row
    underflows (one matmul)."""
    valid = allowed[0]
    shift = jnp.max(jnp.where(valid[:, None], log_k, -jnp.inf), axis=0)
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0))
    top = jax.lax.stop_gradient(jnp.max(log_q + shift, axis=1, keepdims=True))
    query_factor = jnp.exp(log_q + shift - top)
    key_factor = jnp.where(valid[:, None], jnp.exp(log_k - shift), 0)
    return jnp.where(allowed, query_factor @ key_factor.T, 0)


def causal_log_scores(
    log_q: jax.Array, log_k: jax.Array, allowed: jax.Array, *, parallel: int
) -> jax.Array:
    """Causal scores s_tj = sum_f exp(lq_tf + lk_jf - M_t) ``(T, S)``, M_t the largest
    exponent over the keys row t attends to: row t's own shift (no key after t enters row t,
    not even through a shift). Formed a block of rows at a time, the most whose exponents,
    ``(rows, S, m)`` for each of ``parallel`` heads and batch rows, keep to
    ``ROW_BLOCK_ELEMENTS``."""
    length, width = log_q.shape[0], log_k.size
    rows = max(1, min(length, ROW_BLOCK_ELEMENTS // (parallel * width)))

    def row(inputs):
        log_row, allowed_row = inputs
        exponents = jnp.where(allowed_row[:, None], log_row[None, :] + log_k, -jnp.inf)
        top = jax.lax.stop_gradient(jnp.max(exponents))
        top = jnp.where(jnp.isfinite(top), top, 0)
        return jnp.where(allowed_row, jnp.sum(jnp.exp(exponents - top), axis=1), 0)

    return jax.lax.map(row, (log_q, allowed), batch_size=rows)


def row_shifted_scores(
    q: jax.Array,
    k: jax.Array,
    valid: jax.Array,
    proj: Projection,
    f: FeatureMap,
    allowed: jax.Array,
    stabilize: bool,
    floor: float,
) -> jax.Array:
    """Scores of maps without per-feature logs: phi_Q(q_t) . psi_j exp(mu_j - shift_t), one
    key shift per row (as ``favor_attention`` shifts them)."""
    phi_q = query_features(q, proj, f, stabilize)
    psi_k, mu = key_features(k, valid, proj, f, stabilize, floor, per_feature=False)
    mu = mu[:, 0]
    shift = jnp.max(jnp.where(allowed, mu[None, :], floor), axis=1, keepdims=True)
    factor = jnp.exp(jnp.where(allowed, mu[None, :] - shift, 0))
    # Selected, not multiplied by 0: a NaN in a masked or later key stays out of row t.
    return jnp.where(allowed, (phi_q @ psi_k.T) * factor, 0)
