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
    floored_ratio,
    has_signed_features,
    key_features,
    normalise,
    query_features,
)
from rfjax.features import FeatureMap
from rfjax.projections import Projection


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
    0, with the same features and stabiliser as ``favor_attention`` (the key shift of row t is
    the maximum over A(t)). O(T S) memory: for analysis and tests (``favor_attention(q, k, v)``
    equals ``A @ v`` up to rounding).

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
    dtype = compute_dtype(query, key)
    # OPRF/DERF without statistics: fitted as favor_attention fits them (_data_fitted).
    fmap, map_axis = fit_if_unfitted(fmap, map_axis, query, key, mask, causal=causal, dtype=dtype)
    return _favor_attention_weights(
        query,
        key,
        mask,
        projection,
        fmap,
        axes=(projection_axis, map_axis),
        stabilize=resolve_stabilize(stabilize, fmap),
        causal=causal,
        eps=default_eps(eps, dtype, signed=has_signed_features(fmap)),
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
    dtype = compute_dtype(query, key)
    floor = log_floor(dtype)

    def head(q, k, valid, proj, f):
        phi_q = query_features(q, proj, f, stabilize)
        psi_k, mu = key_features(k, valid, proj, f, stabilize, floor, per_feature=False)
        mu = mu[:, 0]
        allowed = jnp.broadcast_to(valid[None, :], (q.shape[0], k.shape[0]))
        if causal:
            allowed = allowed & jnp.tril(jnp.ones(allowed.shape, dtype=bool))
        shift = jnp.max(jnp.where(allowed, mu[None, :], floor), axis=1, keepdims=True)
        factor = jnp.exp(jnp.where(allowed, mu[None, :] - shift, 0))
        # Selected, not multiplied by 0: a NaN in a masked or later key stays out of row t.
        scores = jnp.where(allowed, (phi_q @ psi_k.T) * factor, 0)
        return floored_ratio(scores, jnp.sum(scores, axis=1, keepdims=True), eps)

    over_heads = jax.vmap(head, in_axes=(1, 1, None, *axes))
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, None, None))
    query, key = normalise(query.astype(dtype)), normalise(key.astype(dtype))
    return over_batch(query, key, mask, projection, fmap)
