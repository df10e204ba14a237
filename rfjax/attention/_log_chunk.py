"""One chunk of one head in ``_log_prefix``'s chunk algorithm (see its module docstring): the
chunk's factors given its row shifts, its output from the earlier chunks' state, and its
cotangents: its tame keys as one C x C product of factors relative to the chunk's start and
first key (``Tame``), the other keys by blocks (within their block a (B, B, m) form, for the
later blocks B x B products), the earlier chunks through the state.

Shapes: the chunk's s blocks of b positions, m features, p value columns; log-features la, lb
``(s, b, m)``, values ``(s, b, p)``, states ``(m, p)``, per-feature shifts ``(m,)``.
"""

from __future__ import annotations

import math
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
    """One chunk's per-feature key references (constants):

    block_max: e ``(s, m)``, each block's maximum;
    block_start: E ``(s, m)``, the running maximum at each block's start (earlier chunks, from
    the chunk's start C^s, and earlier blocks).
    """

    block_max: jax.Array
    block_start: jax.Array


def _keys(lb: jax.Array, start: jax.Array) -> Keys:
    block_max = jax.lax.stop_gradient(jnp.max(lb, axis=1))
    block_end = jnp.maximum(jax.lax.cummax(block_max, axis=0), start)
    return Keys(block_max, jnp.concatenate([start[None], block_end[:-1]]))


def factored_bound(width: int, block: int, *dtypes: Any) -> float:
    """The largest exponent y at which a term exp(x + y) of a row's own block, x <= 0, is formed
    as the product exp(x) exp(y) of two factors in ``dtypes`` (the factors' and the products'
    operands'); -inf where none is (float16).

    The row's largest term is 1. With y <= L / 2, L = -ln of the narrowest dtype's smallest
    normal number, a term above e^(-L/2) has x = ln(term) - y > -L, so neither factor
    underflows (nor overflows: exp(y) <= e^(L/2)) and the product carries the term to the
    dtype's rounding. The terms below weigh at most ``block`` ``width`` e^(-L/2) together, which
    must be below the dtype's epsilon: float32 and bfloat16, L / 2 = 43.7 and 4.4e-16 at
    16 x 256; float16, L / 2 = 4.9: never."""
    bounds = []
    for dtype in dtypes:
        info = jnp.finfo(dtype)
        half = -math.log(float(info.tiny)) / 2
        too_small = block * width * math.exp(-half) > float(info.eps)
        bounds.append(-math.inf if too_small else half)
    return min(bounds)


def _block_pairs(la: jax.Array, lb: jax.Array, keys: jax.Array) -> jax.Array:
    """la_ti + lb_ji within each block for the ``keys`` ``(s, b)`` j <= t, -inf (selected, not
    added) elsewhere: ``(s, b, b, m)``."""
    block = la.shape[1]
    selected = jnp.tril(jnp.ones((block, block), dtype=bool))[None] & keys[:, None, :]
    return jnp.where(selected[..., None], la[:, :, None, :] + lb[:, None, :, :], -jnp.inf)


def _row_shift(la: jax.Array, lb: jax.Array, keys: Keys) -> jax.Array:
    """M_t = max(max_i (la_ti + E_i), max_{j <= t in t's block, i} (la_ti + lb_ji)) ``(s, b)``:
    the row's largest exponent, from positions <= t only. Formed as max_i (la_ti + c_ti) with
    c_ti = max(E_i, max_{j <= t} lb_ji), the running maximum (b m values per block, not the
    pairs' b b m): the same number, since rounding is monotone (fl(a + max_j b_j) =
    max_j fl(a + b_j))."""
    running = jnp.maximum(jax.lax.cummax(lb, axis=1), keys.block_start[:, None, :])
    return jax.lax.stop_gradient(jnp.max(la + running, axis=-1))


class Tame(NamedTuple):
    """The chunk's weights w_tji = exp(la_ti + lb_ji - M_t), j <= t, as products of two factors
    relative to r = max(C^s, lb_0) (the chunk's start and its first key: positions <= every
    row of the chunk), exact where ``factored_bound`` allows:

    reference: r ``(m,)``;
    query: exp(la_t + r - M_t) ``(s, b, m)``, each <= 1 (M_t >= la_ti + c_ti >= la_ti + r_i);
    key: exp(lb_j - r) ``(s, b, m)`` of the keys within the bound (``tame``), 0 for the others;
    tame: ``(s, b)``, the keys with max_i (lb_ji - r_i) <= ``factored_bound``: nearly every key
    (not: keys far above the chunk's start and first key, e.g. in a sequence's first chunk,
    which no earlier key references, at |k| ~ 30);
    any_wild: ``()`` bool, whether some key of the chunk is not tame: only then are those keys
    formed by blocks (in ``_only_if``'s loop: ``chunk_output``, ``_wild_cotangents``).

    The forward pass forms no other exponentials of (s, b, m) for a chunk: the earlier
    chunks' read-out and the keys' summary take these rescaled (``Chunk``); the backward pass
    forms exp(lb_j - C^e) once more (``Chunk.keys_relative_to``).

    Whether a key is tame depends on positions <= it only, and a tame key's weight on the row
    and the key only, so row t's output stays bit-identical whatever later positions hold."""

    reference: jax.Array
    query: jax.Array
    key: jax.Array
    tame: jax.Array
    any_wild: jax.Array


def _tame(la, lb, start, row_shift, matmul_dtype) -> Tame:
    reference = jnp.maximum(start, lb[0, 0])
    bound = factored_bound(lb.shape[-1], lb.shape[0] * lb.shape[1], lb.dtype, matmul_dtype)
    exponent = lb - reference
    tame = jnp.max(exponent, axis=-1) <= bound  # a NaN is not
    query = jnp.exp(la + reference - row_shift[..., None])
    key = jnp.where(tame[..., None], jnp.exp(jnp.minimum(exponent, bound)), 0)
    return Tame(reference, query, key, tame, jnp.any(~tame))


class Blocks(NamedTuple):
    """The factors of the keys formed by blocks, relative to each block's maximum e_b (formed
    only inside ``_only_if``'s loop):

    query: exp(la_t + E - M_t) ``(s, b, m)``, each <= 1 (relative to the row's block start);
    key: exp(lb_j - e) ``(s, b, m)`` of the keys formed by blocks, each <= 1, 0 for the others;
    keys: ``Keys``, the references e and E.
    """

    query: jax.Array
    key: jax.Array
    keys: Keys

    def earlier_block(self, offset: int) -> tuple[jax.Array, jax.Array]:
        """For the query blocks s >= ``offset`` and the key blocks s - ``offset``:
        (exp(la_t + e_{s-offset} - M_t), exp(lb_j - e_{s-offset})) ``(s - offset, b, m)``."""
        blocks = self.query.shape[0]
        start, top = self.keys.block_start[offset:], self.keys.block_max[: blocks - offset]
        return self.query[offset:] * jnp.exp(top - start)[:, None], self.key[: blocks - offset]


class Chunk(NamedTuple):
    """One chunk's factors given its row shifts M: its tame keys' and their rows' (``Tame``),
    the per-feature references of the keys formed by blocks (``Keys``), la, lb and M."""

    tame: Tame
    keys: Keys
    la: jax.Array
    lb: jax.Array
    row_shift: jax.Array

    def earlier_chunks_query(self, start: jax.Array) -> jax.Array:
        """exp(la_t + C^s - M_t) ``(s, b, m)``: the queries' factor of the earlier chunks'
        state (relative to the chunk's start), as exp(la_t + r - M_t) exp(C^s - r), both
        <= 1."""
        return self.tame.query * jnp.exp(start - self.tame.reference)

    def tame_keys_relative_to(self, end: jax.Array) -> jax.Array:
        """exp(lb_j - C^e) ``(s, b, m)`` of the tame keys, relative to the running maximum at the
        chunk's end (>= r), as exp(lb_j - r) exp(r - C^e); 0 for the others. Exact as the tame
        products are: a term above e^(-L/2) of the largest, 1, has both factors normal."""
        return self.tame.key * jnp.exp(self.tame.reference - end)

    def wild_keys_relative_to(self, end: jax.Array) -> jax.Array:
        """exp(lb_j - C^e) ``(s, b, m)`` of the keys that are not tame, 0 for the others."""
        return jnp.where(self.tame.tame[..., None], 0, jnp.exp(self.lb - end))

    def keys_relative_to(self, end: jax.Array) -> jax.Array:
        """exp(lb_j - C^e) ``(s, b, m)`` of every key: the tame keys' from their factors
        (``tame_keys_relative_to``), the others' formed directly (selected)."""
        tame = self.tame_keys_relative_to(end)
        return jnp.where(self.tame.tame[..., None], tame, jnp.exp(self.lb - end))

    def blocks(self) -> Blocks:
        """The factors of the keys that are not tame, by blocks."""
        query = jnp.exp(self.la + self.keys.block_start[:, None] - self.row_shift[..., None])
        key = jnp.exp(self.lb - self.keys.block_max[:, None])
        return Blocks(query, jnp.where(self.tame.tame[..., None], 0, key), self.keys)

    def own_pairs(self) -> jax.Array:
        """exp(la_ti + lb_ji - M_t) ``(s, b, b, m)`` within each block for the keys j <= t that
        are not tame, 0 for the rest."""
        pairs = _block_pairs(self.la, self.lb, ~self.tame.tame)
        return jnp.exp(pairs - self.row_shift[..., None, None])

    def tame_weights(self, matmul_dtype) -> jax.Array:
        """sum_i w_tji ``(C, C)`` over the chunk's rows, of the tame keys j <= t, 0 for the others
        and for j > t: the factors' products (the later keys' selected away, not multiplied by
        0)."""
        query, key = (_rows(x) for x in (self.tame.query, self.tame.key))
        scores = dot("im,jm->ij", query, key, matmul_dtype)
        return jnp.where(_causal(scores), scores, 0)

    def anchored(self, zero: jax.Array) -> Chunk:
        """The chunk with ``zero`` (``_only_if``'s) folded into what the blocks read: la, lb
        (and ``tame``: with zero != 0, every key is, and the blocks form nothing)."""
        tame = self.tame._replace(tame=self.tame.tame | (zero != 0))
        return self._replace(tame=tame, la=self.la + zero, lb=self.lb + zero)


def _rows(x: jax.Array) -> jax.Array:
    """``(s, b, .)`` -> ``(C, .)``."""
    return x.reshape(-1, x.shape[-1])


def _only_if(condition: jax.Array, formed, zeros):
    """``formed(zero)`` where ``condition`` holds, else ``zeros``: a loop of at most one step,
    not ``lax.cond``, whose predicate under ``jax.vmap`` (over heads, chunks, the batch) becomes
    a select of both branches. A batched loop steps while any element's condition holds, so the
    branch is formed once if some element needs it, and never otherwise. ``zero`` is 0.0 read
    from the loop's state, for ``formed`` to fold into its operands (``Chunk.anchored``): work
    that reads only loop invariants XLA hoists out of the loop (and runs always)."""

    def step(carry):
        running, _ = carry
        zero = jnp.where(running, 0.0, 1.0)
        return jnp.zeros_like(running), formed(zero)

    return jax.lax.while_loop(lambda carry: carry[0], step, (condition, zeros))[1]


def _causal(scores: jax.Array) -> jax.Array:
    """j <= t for ``(..., n, n)`` scores, broadcast."""
    return jnp.tril(jnp.ones(scores.shape[-2:], dtype=bool))


def chunk_factors(la, lb, start, row_shift=None, matmul_dtype=None) -> tuple[Chunk, jax.Array]:
    """(``Chunk``, M): one chunk's factors, with its row shifts (formed unless given);
    ``matmul_dtype``: the products' operands' (default: la's)."""
    keys = _keys(lb, start)
    if row_shift is None:
        row_shift = _row_shift(la, lb, keys)
    tame = _tame(la, lb, start, row_shift, matmul_dtype or la.dtype)
    return Chunk(tame, keys, la, lb, row_shift), row_shift


def chunk_output(chunk: Chunk, v, start, state, matmul_dtype, end=None):
    """One chunk's Y ``(s, b, p)`` given the earlier chunks' state ``(m, p)`` (relative to
    ``start``; ``None`` where there are none): its tame keys, its other keys (by blocks, only
    if there are any), the earlier chunks; and, given ``end``, its keys' summary
    sum_j exp(lb_j - C^e) v_j^T ``(m, p)`` relative to it (else ``None``): the tame keys' from
    their factors, the others' in the same loop as their blocks (a second loop cost the CPU
    schedule's step 8% at T = 4k)."""
    weights = chunk.tame_weights(matmul_dtype)
    out = dot("ij,jp->ip", weights, _rows(v), matmul_dtype).reshape(*v.shape[:2], -1)
    summary = None
    if end is not None:
        summary = dot("sjm,sjp->mp", chunk.tame_keys_relative_to(end), v, matmul_dtype)

    def wild(zero):  # the keys that are not tame: their blocks' pieces
        anchored, values = chunk.anchored(zero), v + zero
        pairs = jnp.sum(anchored.own_pairs(), axis=-1)
        wild_out = jnp.einsum("sij,sjp->sip", pairs, values.astype(pairs.dtype))
        blocks, count = anchored.blocks(), v.shape[0]
        for offset in range(1, count):
            query, key = blocks.earlier_block(offset)
            scores = dot("sim,sjm->sij", query, key, matmul_dtype)
            wild_out = wild_out.at[offset:].add(
                dot("sij,sjp->sip", scores, values[: count - offset], matmul_dtype)
            )
        if end is None:
            return wild_out, None
        key = anchored.wild_keys_relative_to(end)
        return wild_out, dot("sjm,sjp->mp", key, values, matmul_dtype)

    zeros = jax.tree.map(jnp.zeros_like, (out, summary))
    wild_out, wild_summary = _only_if(chunk.tame.any_wild, wild, zeros)
    out = out + wild_out
    if summary is not None:
        summary = summary + wild_summary
    if state is not None:
        out = out + dot("sim,mp->sip", chunk.earlier_chunks_query(start), state, matmul_dtype)
    return out, summary


def _wild_cotangents(chunk: Chunk, v, grad, matmul_dtype):
    """(dla, dlb, dv) ``(s, b, .)`` of the keys that are not tame, by blocks: their own blocks'
    (B, B, m) forms, their later blocks' B x B products."""
    pairs = chunk.own_pairs()
    products = dot("sip,sjp->sij", grad, v, matmul_dtype)
    weighted = pairs * jnp.where(_causal(products), products, 0)[..., None]
    grad_la, grad_lb = jnp.sum(weighted, axis=2), jnp.sum(weighted, axis=1)
    weights = jnp.sum(pairs, axis=-1)
    grad_v = jnp.einsum("sij,sip->sjp", weights, grad.astype(weights.dtype))
    blocks, count = chunk.blocks(), v.shape[0]
    for offset in range(1, count):
        query, key = blocks.earlier_block(offset)
        values, grads = v[: count - offset], grad[offset:]
        products = dot("sip,sjp->sij", grads, values, matmul_dtype)
        scores = dot("sim,sjm->sij", query, key, matmul_dtype)
        grad_la = grad_la.at[offset:].add(query * dot("sij,sjm->sim", products, key, matmul_dtype))
        grad_lb = grad_lb.at[: count - offset].add(
            key * dot("sij,sim->sjm", products, query, matmul_dtype)
        )
        grad_v = grad_v.at[: count - offset].add(dot("sij,sip->sjp", scores, grads, matmul_dtype))
    return grad_la, grad_lb, grad_v


def chunk_cotangents(chunk: Chunk, v, start, end, state, later, grad, matmul_dtype):
    """(dla, dlb, dv) ``(s, b, .)`` of one chunk: its tame keys, its other keys (by blocks,
    only if there are any), the earlier chunks (``state``, relative to ``start``) and the later
    queries (``later``, relative to ``end``; ``None`` where there are none, a one-chunk
    sequence's backward pass; ``state`` ``None`` where no keys come before the chunk,
    ``_log_prefix._one_chunk_without_state``)."""
    # D_tj selected for j <= t: a later key's product (huge or inf, e.g. the floored
    # normaliser's cotangent G / eps of a row without keys) never meets its 0 weight.
    rows_grad, rows_v = _rows(grad), _rows(v)
    products = dot("ip,jp->ij", rows_grad, rows_v, matmul_dtype)
    products = jnp.where(_causal(products), products, 0)
    query, key = (_rows(x) for x in (chunk.tame.query, chunk.tame.key))
    grad_la = query * dot("ij,jm->im", products, key, matmul_dtype)
    grad_lb = key * dot("ij,im->jm", products, query, matmul_dtype)
    grad_v = dot("ij,ip->jp", chunk.tame_weights(matmul_dtype), rows_grad, matmul_dtype)
    shape = v.shape[:2]
    grad_la, grad_lb, grad_v = (x.reshape(*shape, -1) for x in (grad_la, grad_lb, grad_v))

    zeros = tuple(map(jnp.zeros_like, (grad_la, grad_lb, grad_v)))
    wild = _only_if(
        chunk.tame.any_wild,
        lambda zero: _wild_cotangents(chunk.anchored(zero), v + zero, grad + zero, matmul_dtype),
        zeros,
    )
    grad_la, grad_lb, grad_v = (
        a + b for a, b in zip((grad_la, grad_lb, grad_v), wild, strict=True)
    )
    if state is not None:
        query = chunk.earlier_chunks_query(start)
        grad_la = grad_la + query * dot("mp,sip->sim", state, grad, matmul_dtype)
    if later is not None:
        key = chunk.keys_relative_to(end)
        grad_lb = grad_lb + key * dot("mp,sjp->sjm", later, v, matmul_dtype)
        grad_v = grad_v + dot("sjm,mp->sjp", key, later, matmul_dtype)
    return grad_la, grad_lb, grad_v
