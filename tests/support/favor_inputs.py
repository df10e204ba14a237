"""Shared inputs and float64 NumPy references of the tests of FAVOR attention (``rfjax.attention``):
BTNH queries, keys and values, a shared and a per-head projection (cached), the features and the
quadratic linear attention they should equal, the float32 tolerance of a sum, and the operands of
the causal prefix op."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import attention, projections

BATCH, LENGTH, HEADS, HEAD_DIM, VALUE_DIM = 2, 24, 3, 16, 8


NUM_FEATURES = 32


CHUNK = 8  # LENGTH / CHUNK = 3 chunks


EPS32 = float(np.finfo(np.float32).eps)


def make_inputs(seed, *, scale=0.5, length=LENGTH, key_length=None, dtype=jnp.float32):
    """query, key, value (BTNH) from three independent keys (never q == k)."""
    key_length = length if key_length is None else key_length
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    query = scale * jax.random.normal(kq, (BATCH, length, HEADS, HEAD_DIM), dtype)
    key = scale * jax.random.normal(kk, (BATCH, key_length, HEADS, HEAD_DIM), dtype)
    value = jax.random.normal(kv, (BATCH, key_length, HEADS, VALUE_DIM), dtype)
    return query, key, value


@functools.cache
def shared_projection():
    return projections.gaussian(jax.random.key(100), HEAD_DIM, NUM_FEATURES)


@functools.cache
def per_head_projection():
    return attention.draw_projection(
        jax.random.key(101), HEAD_DIM, NUM_FEATURES, coupling="gaussian", num_heads=HEADS
    )


def reference_features(name, x, weights):
    """Feature maps written out in float64 from W: x (..., H), W (m, H)."""
    x = np.asarray(x, np.float64) * HEAD_DIM**-0.25
    weights = np.asarray(weights, np.float64)
    projected = x @ weights.T
    m = weights.shape[0]
    if name == "positive":
        return np.exp(projected - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(m)
    if name == "positive_antithetic":
        both = np.concatenate([projected, -projected], -1)
        return np.exp(both - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(2 * m)
    if name == "relu":
        return (np.maximum(projected, 0) + 1e-3) / math.sqrt(m)
    raise ValueError(name)


def reference_linear_attention(phi_q, phi_k, value, *, causal, mask=None):
    """Quadratic-form linear attention per (b, n): phi_q (B,T,N,m), phi_k (B,S,N,m)."""
    scores = np.einsum("btnm,bsnm->bnts", phi_q, phi_k)
    allowed = np.ones(scores.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(scores.shape[-2:], bool))
    if mask is not None:
        allowed &= np.asarray(mask)[:, None, None, :]
    scores = np.where(allowed, scores, 0.0)
    den = scores.sum(-1, keepdims=True)
    weights = np.divide(scores, den, out=np.zeros_like(scores), where=den > 0)
    return np.einsum("bnts,bsnh->btnh", weights, np.asarray(value, np.float64))


def reference_for(name, query, key, value, weights, **kwargs):
    if weights.ndim == 2:
        phi_q = reference_features(name, query, weights)
        phi_k = reference_features(name, key, weights)
    else:  # per head: weights (N, m, H)
        phi_q = np.stack(
            [reference_features(name, query[:, :, n], weights[n]) for n in range(HEADS)], 2
        )
        phi_k = np.stack(
            [reference_features(name, key[:, :, n], weights[n]) for n in range(HEADS)], 2
        )
    return reference_linear_attention(phi_q, phi_k, value, **kwargs)


def float32_tolerance(num_terms, value):
    """Accumulated float32 rounding: ~num_terms unit roundoffs of the largest value."""
    return num_terms * EPS32 * float(np.max(np.abs(value)))


def prefix_inputs(seed, length=11, width=4, value_width=3):
    """Arguments of the prefix op in float64, with the stabiliser's log-scales."""
    ka, kb, kv, km = jax.random.split(jax.random.key(seed), 4)
    a = jnp.exp(jax.random.normal(ka, (length, width), jnp.float64))
    b = jnp.exp(jax.random.normal(kb, (length, width), jnp.float64))
    v = jax.random.normal(kv, (length, value_width), jnp.float64)
    alpha = 3.0 * jax.random.normal(km, (length,), jnp.float64)
    beta = jax.lax.cummax(alpha)
    return a, b, v, alpha, beta
