"""Patch importance of an implicit-attention policy: column sums of a self-attention matrix.

For T patches with queries q_t and keys k_j (rows of ``(T, d)`` arrays), the row-normalised
attention matrix is A_tj = K(q_t, k_j) / sum_l K(q_t, k_l) and the importance of patch j is its
column sum c_j = sum_t A_tj: how much attention patch j receives from all patches (Tang et al.,
arXiv:2003.08165; Choromanski et al., IAP, arXiv:2102.04353, Sec. 3). With exact softmax
attention this costs O(T^2 d). With random features K(q, k) ~ phi(q).psi(k) of width w it is
linear in T (IAP Sec. 3.1):

  s = sum_l psi(k_l),  D_t = phi(q_t).s,  u = sum_t phi(q_t) / D_t,  c_j = psi(k_j).u,

O(T w) after the features, and the T x T matrix is never formed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rfjax._validation import check_real
from rfjax.attention import data_normalizer
from rfjax.features import SIDES, FeatureMap, Side, exponential_side
from rfjax.projections import Projection


def _check_queries_keys(query: object, key: object) -> tuple[jax.Array, jax.Array]:
    query, key = jnp.asarray(query), jnp.asarray(key)
    for name, x in (("query", query), ("key", key)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array, got dtype {x.dtype}")
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape (..., T, d), got {x.shape}")
    if query.shape != key.shape:
        raise ValueError(
            f"query and key must have the same shape (..., T, d) (self-attention over the "
            f"patches); got {query.shape} and {key.shape}"
        )
    return query, key


def _features(
    x: jax.Array, projection: Projection, feature_map: FeatureMap, *, side: Side
) -> jax.Array:
    """phi(x') (..., T, w) of x' = H^{-1/4} x, stabilised by the map's log-space form with shifts
    that cancel in A.

    Queries: the per-row scale exp(s(q_t)) is dropped (it cancels in row t of A). Keys:
    psi_j exp(s(k_j) - max_l s(k_l)), one factor for all keys of an image that cancels in every
    row. The shifts are constants under differentiation.
    """
    x = x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)
    psi, log_scale = feature_map.scaled_features(x, projection, side=side)
    if side == "query":
        return psi
    shift = jax.lax.stop_gradient(jnp.max(log_scale, axis=-1, keepdims=True))
    return psi * jnp.exp(log_scale - shift)[..., None]


def _shifted_log_features(
    query: jax.Array, key: jax.Array, projection: Projection, feature_map: FeatureMap
) -> tuple[jax.Array, jax.Array]:
    """(phi, psi) ``(..., T, w)`` of an exponential map, A's factors with shifts that cancel:
    phi_tf = exp(l_f(q'_t) + c_f - M_t) and psi_jf = exp(l_f(k'_j) - c_f), with c_f the
    largest key log-feature f of the image and M_t the largest l_f(q'_t) + c_f. Each entry is
    at most 1 and row t's largest term phi_t . psi_j is 1, so D_t >= 1 (as
    ``rfjax.attention.favor_attention`` shifts bidirectional keys). The shifts are constants
    under differentiation."""
    scale = data_normalizer(query.shape[-1])
    log_q, log_k = (
        exponential_side(feature_map, side).log_features(  # type: ignore[union-attr]
            x * jnp.asarray(scale, x.dtype), projection, side=side
        )
        for x, side in zip((query, key), SIDES, strict=True)
    )
    shift = jax.lax.stop_gradient(jnp.max(log_k, axis=-2, keepdims=True))  # (..., 1, w)
    top = jax.lax.stop_gradient(jnp.max(log_q + shift, axis=-1, keepdims=True))  # (..., T, 1)
    return jnp.exp(log_q + shift - top), jnp.exp(log_k - shift)


def random_feature_importance(
    query: jax.Array,
    key: jax.Array,
    projection: Projection,
    *,
    feature_map: FeatureMap,
    eps: float,
) -> jax.Array:
    """Column sums of the random-feature attention matrix, in O(T w) (no T x T matrix).

    With the query features phi and key features psi of ``feature_map`` applied to
    x' = H^{-1/4} x (as in ``rfjax.attention.favor_attention``),
    A_tj = phi(q_t).psi(k_j) / max(phi(q_t).sum_l psi(k_l), eps) (the row normaliser is
    floored at ``eps`` as in ``rfjax.attention.favor_attention``; signed maps can estimate it
    as <= 0) and

      c_j = sum_t A_tj = psi(k_j) . sum_t phi(q_t) / max(D_t, eps).

    It equals the column sums of ``rfjax.attention.favor_attention_weights`` for the same
    features and projection, up to rounding: exponential maps (phi = exp(l)) are shifted per
    feature in log space as attention shifts them, so no row's normaliser underflows at large
    norms (one shift for all keys, before 2026-11-29, lost 1 of 16 rows' mass at |x'| ~ 10
    and 9 of 16 at |x'| ~ 17 in float32); other maps by their per-row log-space form.

    Args:
      query: ``(..., T, d)``, floating.
      key: ``(..., T, d)``.
      projection: a drawn projection with ``dim == d``.
      feature_map: an ``rfjax.features.FeatureMap`` with its parameters, e.g.
        ``features.get("positive")()`` or ``features.get("angular_hybrid")().init(key, d)``.
      eps: floor of the row normalisers, > 0.

    Returns:
      Importances ``(..., T)`` (they sum to T when no normaliser is floored).

    Examples:
      >>> import jax
      >>> from rfjax import features, projections
      >>> q, k = jax.random.normal(jax.random.key(0), (2, 16, 4))
      >>> w = projections.orthogonal(jax.random.key(1), 4, 64)
      >>> c = random_feature_importance(
      ...     q, k, w, feature_map=features.get("positive")(), eps=1e-6)
      >>> c.shape, round(float(c.sum()), 3)
      ((16,), 16.0)

    References:
      Choromanski et al., "Unlocking Pixels for Reinforcement Learning via Implicit Attention",
      arXiv:2102.04353, Sec. 3.
    """
    query, key = _check_queries_keys(query, key)
    eps = check_real("eps", eps, positive=True)
    if all(exponential_side(feature_map, side) is not None for side in SIDES):
        phi, psi = _shifted_log_features(query, key, projection, feature_map)
    else:
        phi = _features(query, projection, feature_map, side="query")
        psi = _features(key, projection, feature_map, side="key")
    key_sum = jnp.sum(psi, axis=-2)  # (..., w)
    normaliser = jnp.einsum("...tw,...w->...t", phi, key_sum)
    weighted = jnp.einsum("...tw,...t->...w", phi, 1.0 / jnp.maximum(normaliser, eps))
    return jnp.einsum("...jw,...w->...j", psi, weighted)


def softmax_importance(query: jax.Array, key: jax.Array) -> jax.Array:
    """Column sums of exact softmax attention softmax(q k^T / sqrt(d)), in O(T^2 d).

    Args:
      query: ``(..., T, d)``, floating.
      key: ``(..., T, d)``.

    Returns:
      Importances ``(..., T)``, summing to T.

    Examples:
      >>> import jax.numpy as jnp
      >>> softmax_importance(jnp.zeros((3, 2)), jnp.zeros((3, 2))).tolist()
      [1.0, 1.0, 1.0]
    """
    query, key = _check_queries_keys(query, key)
    logits = jnp.einsum("...td,...jd->...tj", query, key) / math.sqrt(query.shape[-1])
    return jnp.sum(jax.nn.softmax(logits, axis=-1), axis=-2)
