"""The per-head draws of ``PerformerAttention`` (a projection and the feature map's random
parameters per head) and the draw a decode cache keeps between tokens."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax.attention import PerHead, draw_projection
from rfjax.features import FeatureMap
from rfjax.nn._attention_arguments import feature_map_template
from rfjax.projections import Projection


def draw_heads(
    projection_key: jax.Array,
    feature_map_key: jax.Array,
    *,
    head_dim: int,
    num_heads: int,
    num_features: int,
    coupling: str,
    feature_map: str | FeatureMap,
) -> tuple[PerHead[Projection], FeatureMap]:
    """One projection per head from ``projection_key`` and the feature map's random parameters
    per head (its ``init``) from ``feature_map_key``; the map is stacked over the heads (axis 0),
    its fitted fields still at their ``init`` values (the module supplies them)."""
    projection = draw_projection(
        projection_key, head_dim, num_features, coupling=coupling, num_heads=num_heads
    )
    template = feature_map_template(feature_map)
    keys = jax.random.split(feature_map_key, num_heads)
    return projection, jax.vmap(lambda k: template.init(k, head_dim))(keys)


type HeadsDraw = tuple[PerHead[Projection], FeatureMap]


def draw_keys_data(*keys: jax.Array) -> jax.Array:
    """The raw data of the keys a draw comes from, stacked (what a decode cache compares)."""
    return jnp.stack([jax.random.key_data(key) for key in keys])


def kept_draw(
    kept: HeadsDraw, kept_keys: jax.Array, keys: jax.Array, draw: Callable[[], HeadsDraw]
) -> HeadsDraw:
    """The draw a decode cache keeps: ``kept`` while this call's keys (``draw_keys_data``) are
    the ones it came from (``kept_keys``), else ``draw()``, in a ``lax.cond``: a generated token
    draws nothing (the orthogonal coupling's QR decompositions and the random draws) unless its
    projection step starts a new redraw period. Redrawing per token made FAVOR's decoding 6-11x
    slower than a key/value cache on an H200 (``benchmarks/gpu_runs/2026-11-27-h200``)."""
    return jax.lax.cond(jnp.array_equal(kept_keys, keys), lambda: kept, draw)
