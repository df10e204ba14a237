"""The query, key and value heads as attention receives them: unit queries and keys scaled by a
learned temperature (``query_key_norm``), grouped key/value heads repeated to the query heads,
rotary position embeddings applied per head."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp


def cosine_scores(
    query: jax.Array, key: jax.Array, log_temperature: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Unit query and key per head ``(..., N, H)``, scaled so that q.k / sqrt(H) = tau q^.k^
    with tau = exp(log_temperature) of shape ``(N,)`` (``query_key_norm``)."""
    head_dim = query.shape[-1]
    scale = jnp.sqrt(jnp.exp(log_temperature) * math.sqrt(head_dim))[:, None]

    def unit(x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)

    return unit(query) * scale.astype(query.dtype), unit(key) * scale.astype(key.dtype)


def repeat_kv_heads(key: jax.Array, value: jax.Array, num_heads: int) -> tuple[jax.Array, ...]:
    """Grouped key/value heads ``(..., N_kv, H)`` repeated to the N query heads (query head i
    reads key/value head i // (N / N_kv), as Flax's ``dot_product_attention`` groups them)."""
    groups = num_heads // key.shape[-2]
    if groups == 1:
        return key, value
    return jnp.repeat(key, groups, axis=-2), jnp.repeat(value, groups, axis=-2)


def rotate(rope: Callable[..., jax.Array], x: jax.Array, positions: jax.Array | None) -> jax.Array:
    """``nnx.RoPE`` applied per head to ``(..., L, N, H)`` (as
    ``nnx.dot_product_attention_with_rope`` applies it)."""
    if positions is None:
        return jax.vmap(rope, in_axes=-2, out_axes=-2)(x)
    return jax.vmap(rope, in_axes=(-2, None), out_axes=-2)(x, positions)
