"""Bidirectional FAVOR: phi_Q(Q) (phi_K(K)^T [V, 1]) over blocks of positions, with the key
stabiliser's running maximum (per feature for exponential maps) reached online."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax.attention._checks import HeadAxes, log_floor, vary_like
from rfjax.attention._head_features import (
    FeatureLogs,
    feature_logs,
    finite_key_features,
    finite_query_features,
    floored_ratio,
    has_feature_logs,
    rowwise,
)
from rfjax.attention._sequence_parallel import psum_summary
from rfjax.features import FeatureMap
from rfjax.projections import Projection

# Positions per block (keys and queries); see bidirectional_attention.
BIDIRECTIONAL_BLOCK = 512
# Up to this many blocks the passes are unrolled and keep their features for the backward pass;
# over more, the backward pass forms each block's features again (see bidirectional_attention).
STORED_BLOCKS = 2


def in_blocks(x: jax.Array, block: int, fill: object = 0) -> jax.Array:
    """(B, T, ...) -> (T'/block, B, block, ...), T padded with ``fill`` to a multiple T'."""
    batch, length = x.shape[:2]
    padded = -(-length // block) * block
    widths = [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, widths, constant_values=fill)
    return x.reshape(batch, padded // block, block, *x.shape[2:]).swapaxes(0, 1)


def key_value_summary(
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    block: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(S (B, N, m, H_v), z (B, N, m), c (B, N, w), bad (B, N)), one block of keys at a time (a
    scan), so each block's features are contracted while they are in cache; ``bad`` flags the
    heads with an unmasked key or value that is not finite (``finite_key_features``: such keys
    are left out of the sums).

    With phi_K(k_j) = f_j exp(g_j) entrywise (``FeatureLogs``: for exponential maps f = 1 and
    g = the log-features, w = m; otherwise f = psi and g = mu, the per-key log-scale, w = 1),
    S_i = sum_j f_ji exp(g_ji - c_i) v_j^T and z_i = sum_j f_ji exp(g_ji - c_i), where c is the
    running maximum of g over the keys seen so far (per batch, head and, for w = m, feature; a
    constant under differentiation). When c grows, the carried sums are rescaled by
    exp(c_old - c_new) <= 1, as in online softmax. At the end c is the maximum over all unmasked
    keys: for w = 1 the Performer's global key shift; for w = m each feature's own, so no
    feature of any key is lost to underflow (the largest term of every feature is 1). Masked
    keys get f = 0, so garbage padding cannot create NaNs.
    """
    batch, _, heads, _ = key.shape
    floor = log_floor(key.dtype)
    per_feature = has_feature_logs(fmap)

    def logs(k: jax.Array) -> FeatureLogs:
        return rowwise(
            lambda x, p, f: feature_logs(x, p, f, stabilize, per_feature, "key"),
            k,
            projection,
            fmap,
            axes,
        )

    def step(carry, blocks):
        kv, k_sum, shift, bad = carry
        k, v, valid = blocks
        valid = jnp.broadcast_to(valid[:, :, None], k.shape[:3])  # the same for every head
        (factor, log), v, bad_block = finite_key_features(k, v, valid, logs, floor)
        new_shift = jax.lax.stop_gradient(jnp.maximum(shift, jnp.max(log, axis=1)))
        rescale = jnp.exp(shift - new_shift)
        kv, k_sum = kv * rescale[..., None], k_sum * rescale
        terms = factor * jnp.exp(log - new_shift[:, None])
        kv = kv + jnp.einsum("bcnm,bcnh->bnmh", terms, v)
        bad = bad | jnp.any(bad_block, axis=1)
        return (kv, k_sum + jnp.sum(terms, axis=1), new_shift, bad), None

    factor_shape, log_shape = jax.eval_shape(logs, key[:, :1])
    width = max(factor_shape.shape[-1], log_shape.shape[-1])
    init = tuple(
        vary_like(x, key, value, mask, projection, fmap)
        for x in (
            jnp.zeros((batch, heads, width, value.shape[-1]), key.dtype),
            jnp.zeros((batch, heads, width), key.dtype),
            jnp.full((batch, heads, log_shape.shape[-1]), floor, key.dtype),
            jnp.zeros((batch, heads), bool),
        )
    )
    xs = (in_blocks(key, block), in_blocks(value, block), in_blocks(mask, block, False))
    # Up to STORED_BLOCKS blocks: unrolled, so no loop is compiled, and the features kept for
    # the backward pass. More: differentiated, each block's features are formed again in the
    # backward pass (``jax.checkpoint``) rather than kept for every block.
    stored = len(xs[0]) <= STORED_BLOCKS
    step = step if stored else jax.checkpoint(step)
    (kv, k_sum, shift, bad), _ = jax.lax.scan(step, init, xs, unroll=stored)
    return kv, k_sum, shift, bad


def bidirectional_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    eps: float,
    block: int,
    sequence_axis: str | None = None,
) -> jax.Array:
    """All heads, BTNH in and out: phi_Q(Q) (psi_K(K)^T V) / phi_Q(Q) (psi_K(K)^T 1).

    Keys and queries are processed in blocks of ``block`` positions (the key sums by a scan,
    see ``key_value_summary``; the read-out by ``lax.map`` over query blocks), contracting in
    BTNH layout: on CPU this keeps each block's features in cache instead of streaming (T, N, m)
    tensors through memory three times. With more than ``STORED_BLOCKS`` blocks, under
    differentiation both passes form each block's features again in the backward pass
    (``jax.checkpoint``; the causal op's backward likewise recomputes) rather than keeping them
    for every block: forward + backward temporaries at T = 64k (B = 1, 4 heads of 64, m = 128)
    went from 1,099 to 198 MiB, 1.55x one (B, T, N, m) feature tensor instead of 8.6x; on CPU
    the time went down from T = 4k (0.80x at 4k, 0.85x at 16k: the stored features' fresh pages
    had cost more than forming them again). Up to ``STORED_BLOCKS`` blocks the passes are
    unrolled and keep the features: at T = 1k, forward + backward, 0.66x the time of a loop
    over two recomputed blocks, with 11.2 against 11.9 MiB of temporaries
    (``benchmarks/results/attention_against_f41641b``). With ``sequence_axis`` (inside
    ``shard_map``), the key sums (and non-finite key flags) of all devices along it are
    combined (``_sequence_parallel.psum_summary``).
    """
    kv, k_sum, shift, bad_key = key_value_summary(
        key, value, mask, projection, fmap, axes=axes, stabilize=stabilize, block=block
    )
    if sequence_axis is not None:
        kv, k_sum = psum_summary(kv, k_sum, shift, sequence_axis)
        shift = jax.lax.pmax(shift, sequence_axis)  # the sums are now relative to it
        bad_key = jax.lax.pmax(bad_key.astype(jnp.int32), sequence_axis) > 0

    def read_out(q):
        (factor, log), bad_query = rowwise(
            lambda x, p, f: finite_query_features(x, p, f, stabilize, has_feature_logs(fmap)),
            q,
            projection,
            fmap,
            axes,
        )
        # phi_Q(q_t) e^c = factor e^{log + c}, over its row maximum M_t (it cancels).
        log = log + shift[:, None]
        phi_q = factor * jnp.exp(log - jax.lax.stop_gradient(jnp.max(log, -1, keepdims=True)))
        numerator = jnp.einsum("btnm,bnmh->btnh", phi_q, kv)
        denominator = jnp.einsum("btnm,bnm->btn", phi_q, k_sum)
        out = floored_ratio(numerator, denominator[..., None], eps)
        poisoned = bad_query | bad_key[:, None]
        return jnp.where(poisoned[..., None], jnp.nan, out)

    batch, length = query.shape[:2]
    query_blocks = in_blocks(query, block)
    if len(query_blocks) <= STORED_BLOCKS:  # no loop to compile, the features kept
        out = jnp.stack([read_out(q) for q in query_blocks])
    else:
        out = jax.lax.map(jax.checkpoint(read_out), query_blocks)
    return out.swapaxes(0, 1).reshape(batch, -1, *out.shape[3:])[:, :length]
