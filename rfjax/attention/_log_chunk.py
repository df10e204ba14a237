"""One chunk of one head in ``_log_prefix``'s chunk algorithm (see its module docstring): the
chunk's factors given its row shifts, its output from the earlier chunks' state, and its
cotangents, each as three pieces (the blocks' own keys as a (B, B, m) form, the earlier blocks
of the chunk as B x B products, the earlier chunks through the state).

Shapes: the chunk's s blocks of b positions, m features, p value columns; log-features la, lb
``(s, b, m)``, values ``(s, b, p)``, states ``(m, p)``, per-feature shifts ``(m,)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


def dot(spec: str, a: jax.Array, b: jax.Array, matmul_dtype: Any) -> jax.Array:
    """``einsum`` with operands in ``matmul_dtype``, accumulated in (at least) float32."""
    accumulate = jnp.result_type(jnp.float32, a.dtype, b.dtype)
    return jnp.einsum(
        spec, a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=accumulate
    )


class Keys(NamedTuple):
    """One chunk's key factors and per-feature references (constants):

    factor: exp(lb_j - e_s) ``(s, b, m)``, each <= 1, with e_s the maximum of block s;
    block_max: e ``(s, m)``;
    block_start: E ``(s, m)``, the running maximum at each block's start (earlier chunks, from
    the chunk's start C^s, and earlier blocks).
    """

    factor: jax.Array
    block_max: jax.Array
    block_start: jax.Array

    def relative_to(self, end: jax.Array) -> jax.Array:
        """exp(lb_j - C^e) ``(s, b, m)``: relative to the running maximum at the chunk's end."""
        return self.factor * jnp.exp(self.block_max - end)[:, None]


def _keys(lb: jax.Array, start: jax.Array) -> Keys:
    block_max = jax.lax.stop_gradient(jnp.max(lb, axis=1))
    block_end = jnp.maximum(jax.lax.cummax(block_max, axis=0), start)
    block_start = jnp.concatenate([start[None], block_end[:-1]])
    return Keys(jnp.exp(lb - block_max[:, None]), block_max, block_start)


def _block_pairs(la: jax.Array, lb: jax.Array) -> jax.Array:
    """la_ti + lb_ji within each block for j <= t, -inf (selected, not added) for j > t:
    ``(s, b, b, m)``."""
    block = la.shape[1]
    causal = jnp.tril(jnp.ones((block, block), dtype=bool))[:, :, None]
    return jnp.where(causal, la[:, :, None, :] + lb[:, None, :, :], -jnp.inf)


def _row_shift(la: jax.Array, lb: jax.Array, keys: Keys) -> jax.Array:
    """M_t = max(max_i (la_ti + E_i), max_{j <= t in t's block, i} (la_ti + lb_ji)) ``(s, b)``:
    the row's largest exponent, from positions <= t only. Formed as max_i (la_ti + c_ti) with
    c_ti = max(E_i, max_{j <= t} lb_ji), the running maximum (b m values per block, not the
    pairs' b b m): the same number, since rounding is monotone (fl(a + max_j b_j) =
    max_j fl(a + b_j))."""
    running = jnp.maximum(jax.lax.cummax(lb, axis=1), keys.block_start[:, None, :])
    return jax.lax.stop_gradient(jnp.max(la + running, axis=-1))


class Chunk(NamedTuple):
    """One chunk's factors given its row shifts M: the keys', the queries' exp(la_t + E - M_t)
    ``(s, b, m)`` (each <= 1), and the blocks' own forms exp(la_ti + lb_ji - M_t) for j <= t,
    0 for j > t ``(s, b, b, m)``."""

    keys: Keys
    query: jax.Array
    block_weights: jax.Array

    def earlier_chunks_query(self, start: jax.Array) -> jax.Array:
        """exp(la_t + C^s - M_t) ``(s, b, m)``: the queries' factor of the earlier chunks'
        state (relative to the chunk's start)."""
        return self.query * jnp.exp(start - self.keys.block_start)[:, None]

    def earlier_block(self, offset: int) -> tuple[jax.Array, jax.Array]:
        """For the query blocks s >= ``offset`` and the key blocks s - ``offset``:
        (exp(la_t + e_{s-offset} - M_t), exp(lb_j - e_{s-offset})) ``(s - offset, b, m)``."""
        blocks = self.query.shape[0]
        keys = self.keys
        rescale = jnp.exp(keys.block_max[: blocks - offset] - keys.block_start[offset:])
        return self.query[offset:] * rescale[:, None], keys.factor[: blocks - offset]


def chunk_factors(la, lb, start, row_shift=None) -> tuple[Chunk, jax.Array]:
    """(``Chunk``, M): one chunk's factors, with its row shifts (formed unless given)."""
    keys = _keys(lb, start)
    if row_shift is None:
        row_shift = _row_shift(la, lb, keys)
    query = jnp.exp(la + keys.block_start[:, None] - row_shift[..., None])
    weights = jnp.exp(_block_pairs(la, lb) - row_shift[..., None, None])
    return Chunk(keys, query, weights), row_shift


def chunk_output(chunk: Chunk, v, start, state, matmul_dtype) -> jax.Array:
    """One chunk's Y ``(s, b, p)`` given the earlier chunks' state ``(m, p)`` (relative to
    ``start``; ``None`` where there are none): its blocks' own keys, its earlier blocks, the
    earlier chunks."""
    weights = jnp.sum(chunk.block_weights, axis=-1)
    out = jnp.einsum("sij,sjp->sip", weights, v.astype(weights.dtype))
    blocks = v.shape[0]
    for offset in range(1, blocks):
        query, key = chunk.earlier_block(offset)
        scores = dot("sim,sjm->sij", query, key, matmul_dtype)
        out = out.at[offset:].add(dot("sij,sjp->sip", scores, v[: blocks - offset], matmul_dtype))
    if state is None:
        return out
    return out + dot("sim,mp->sip", chunk.earlier_chunks_query(start), state, matmul_dtype)


def chunk_cotangents(chunk: Chunk, v, start, end, state, later, grad, matmul_dtype):
    """(dla, dlb, dv) ``(s, b, .)`` of one chunk: its blocks' own forms, its earlier blocks,
    the earlier chunks (``state``, relative to ``start``) and the later queries (``later``,
    relative to ``end``; ``None`` where there are none, a one-chunk sequence's backward pass;
    ``state`` ``None`` where no keys come before the chunk,
    ``_log_prefix._one_chunk_without_state``)."""
    weights = chunk.block_weights
    # D_tj within each block, selected for j <= t: a later key's product (huge or inf, e.g. the
    # floored normaliser's cotangent G / eps of a row without keys) never meets its 0 weight.
    products = dot("sip,sjp->sij", grad, v, matmul_dtype)
    causal = jnp.tril(jnp.ones(products.shape[-2:], dtype=bool))
    products = jnp.where(causal, products, 0)[..., None]
    grad_la = jnp.sum(weights * products, axis=2)
    grad_lb = jnp.sum(weights * products, axis=1)
    grad_v = jnp.einsum("sij,sip->sjp", jnp.sum(weights, axis=-1), grad.astype(weights.dtype))
    blocks = v.shape[0]
    for offset in range(1, blocks):
        query, key = chunk.earlier_block(offset)
        values, grads = v[: blocks - offset], grad[offset:]
        products = dot("sip,sjp->sij", grads, values, matmul_dtype)
        scores = dot("sim,sjm->sij", query, key, matmul_dtype)
        grad_la = grad_la.at[offset:].add(query * dot("sij,sjm->sim", products, key, matmul_dtype))
        grad_lb = grad_lb.at[: blocks - offset].add(
            key * dot("sij,sim->sjm", products, query, matmul_dtype)
        )
        grad_v = grad_v.at[: blocks - offset].add(dot("sij,sip->sjp", scores, grads, matmul_dtype))
    if state is not None:
        query = chunk.earlier_chunks_query(start)
        grad_la = grad_la + query * dot("mp,sip->sim", state, grad, matmul_dtype)
    if later is not None:
        key = chunk.keys.relative_to(end)
        grad_lb = grad_lb + key * dot("mp,sjp->sjm", later, v, matmul_dtype)
        grad_v = grad_v + dot("sjm,mp->sjp", key, later, matmul_dtype)
    return grad_la, grad_lb, grad_v
