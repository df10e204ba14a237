"""What attention adds to a feature map: the data normaliser H^{-1/4}, the stabiliser (the maps'
log-space form, per-query scales dropped and per-key scales kept as log-scales), and the layout
(rows of BTNH arrays, shared or per-head projections and maps)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax.attention._checks import HeadAxes
from rfjax.features import FeatureMap
from rfjax.projections import Projection


def data_normalizer(head_dim: int) -> float:
    """H^{-1/4}: with q, k scaled by it, exp(q'.k') = exp(q.k / sqrt(H)) (EQUATIONS Eq. 5).

    ``favor_attention`` scales queries and keys by it before the feature map, so a map of the
    softmax kernel exp(x.y) estimates the attention kernel exp(q.k / sqrt(H)).
    """
    return head_dim**-0.25


def normalise(x: jax.Array) -> jax.Array:
    """x H^{-1/4} for ``x`` of shape ``(..., H)``."""
    return x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)


def query_features(
    query: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool
) -> jax.Array:
    """phi_Q(q) (T, width); stabilised, its per-row scale is dropped (it cancels)."""
    if stabilize:
        return fmap.scaled_features(query, projection, side="query").features
    return fmap.features(query, projection, side="query")


def scaled_key_features(
    key: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool
) -> tuple[jax.Array, jax.Array]:
    """(psi (S, width), mu (S,)) with phi_K(k_j) = psi_j exp(mu_j).

    Stabilised, (psi, mu) is the map's log-space form (mu a constant under differentiation; for
    exponential maps mu_j = max_i l_i(k_j), so the largest entry of psi_j is 1); otherwise
    psi = phi and mu = 0.
    """
    if stabilize:
        return tuple(fmap.scaled_features(key, projection, side="key"))
    psi = fmap.features(key, projection, side="key")
    return psi, jnp.zeros(psi.shape[:-1], psi.dtype)


def key_features(
    key: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    stabilize: bool,
    floor: float,
) -> tuple[jax.Array, jax.Array]:
    """``scaled_key_features`` of keys ``(S, H)`` with a mask ``valid (S,)``: masked keys get
    psi = 0 and mu = floor. They are zeroed before the map, so padding holding garbage cannot
    create NaNs (not even in gradients)."""
    key = jnp.where(valid[..., None], key, 0)
    psi, mu = scaled_key_features(key, projection, fmap, stabilize)
    return jnp.where(valid[..., None], psi, 0), jnp.where(valid, mu, floor)


def rowwise(
    fn: Callable[[jax.Array, Projection, FeatureMap], object],
    x: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    axes: HeadAxes,
):
    """fn (rows, H) -> pytree of (rows, ...) on BTNH ``x`` without leaving its layout: one call
    on the flattened rows (shared projection and map) or one per head (vmapped over N).
    Returns the pytree with leaves of shape ``(B, T, N, ...)``."""
    batch, length, heads, dim = x.shape
    if axes == (None, None):
        out = fn(x.reshape(-1, dim), projection, fmap)
        return jax.tree.map(lambda y: y.reshape(batch, length, heads, *y.shape[1:]), out)
    per_head = jax.vmap(fn, in_axes=(1, *axes), out_axes=1)
    out = per_head(x.reshape(-1, heads, dim), projection, fmap)
    return jax.tree.map(lambda y: y.reshape(batch, length, heads, *y.shape[2:]), out)
