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


def factored_bound(width: int, block: int, *dtypes: Any) -> float:
    """The largest exponent y at which a term exp(x + y) of a row's own block, x <= 0, is formed
    as the product exp(x) exp(y) of two factors in ``dtypes`` (the factors' and the products'
    operands'); -inf where none is (float16).

    The row's largest term is 1. With y <= L / 2, L = -ln of the narrowest dtype's smallest
    normal number, a term above e^(-L/2) has x = ln(term) - y > -L, so neither factor
    underflows (nor overflows: exp(y) <= e^(L/2)) and the product carries the term to the
    dtype's rounding. The terms below weigh at most ``block`` ``width`` e^(-L/2) together, which
    must be below the dtype's epsilon: float32 and bfloat16, L / 2 = 43.7 and 4.6e-16 at
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

    query: exp(la_t + r - M_t) ``(s, b, m)``, each <= 1 (M_t >= la_ti + c_ti >= la_ti + r_i);
    key: exp(lb_j - r) ``(s, b, m)`` of the keys within the bound (``tame``), 0 for the others;
    tame: ``(s, b)``, the keys with max_i (lb_ji - r_i) <= ``factored_bound``: nearly every key
    (not: keys far above the chunk's start and first key, e.g. in a sequence's first chunk,
    which no earlier key references, at |k| ~ 30);
    any_wild: ``()`` bool, whether some key of the chunk is not tame: only then are those keys
    formed by blocks (in ``_only_if``'s loop: ``chunk_output``, ``_wild_cotangents``).

    Whether a key is tame depends on positions <= it only, and a tame key's weight on the row
    and the key only, so row t's output stays bit-identical whatever later positions hold."""

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
    return Tame(query, key, tame, jnp.any(~tame))


class Chunk(NamedTuple):
    """One chunk's factors given its row shifts M: its tame keys' and their rows' (``Tame``);
    for the other keys, formed by blocks, the keys' (``Keys``), the queries' exp(la_t + E - M_t)
    ``(s, b, m)`` (each <= 1), la, lb and M."""

    tame: Tame
    keys: Keys
    query: jax.Array
    la: jax.Array
    lb: jax.Array
    row_shift: jax.Array

    def earlier_chunks_query(self, start: jax.Array) -> jax.Array:
        """exp(la_t + C^s - M_t) ``(s, b, m)``: the queries' factor of the earlier chunks'
        state (relative to the chunk's start)."""
        return self.query * jnp.exp(start - self.keys.block_start)[:, None]

    def earlier_block(self, offset: int, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
        """For the query blocks s >= ``offset`` and the key blocks s - ``offset``:
        (exp(la_t + e_{s-offset} - M_t), exp(lb_j - e_{s-offset}) of the ``keys`` ``(s, b)``,
        0 for the others) ``(s - offset, b, m)``."""
        blocks = self.query.shape[0]
        rescale = jnp.exp(self.keys.block_max[: blocks - offset] - self.keys.block_start[offset:])
        key = jnp.where(keys[: blocks - offset, :, None], self.keys.factor[: blocks - offset], 0)
        return self.query[offset:] * rescale[:, None], key

    def own_pairs(self, keys: jax.Array) -> jax.Array:
        """exp(la_ti + lb_ji - M_t) ``(s, b, b, m)`` within each block for the ``keys`` j <= t,
        0 for the rest."""
        return jnp.exp(_block_pairs(self.la, self.lb, keys) - self.row_shift[..., None, None])

    def tame_weights(self, matmul_dtype) -> jax.Array:
        """sum_i w_tji ``(C, C)`` over the chunk's rows, of the tame keys j <= t, 0 for the others
        and for j > t: the factors' products (the later keys' selected away, not multiplied by
        0)."""
        query, key = (_rows(x) for x in (self.tame.query, self.tame.key))
        scores = dot("im,jm->ij", query, key, matmul_dtype)
        return jnp.where(_causal(scores), scores, 0)

    def anchored(self, zero: jax.Array) -> Chunk:
        """The chunk with ``zero`` (``_only_if``'s) folded into the factors the blocks read (and
        into ``tame``: with zero != 0, every key is, and the blocks form nothing)."""
        tame = self.tame._replace(tame=self.tame.tame | (zero != 0))
        keys = self.keys._replace(factor=self.keys.factor + zero)
        return self._replace(tame=tame, keys=keys, query=self.query + zero, la=self.la + zero)


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
    query = jnp.exp(la + keys.block_start[:, None] - row_shift[..., None])
    tame = _tame(la, lb, start, row_shift, matmul_dtype or la.dtype)
    return Chunk(tame, keys, query, la, lb, row_shift), row_shift


def chunk_output(chunk: Chunk, v, start, state, matmul_dtype) -> jax.Array:
    """One chunk's Y ``(s, b, p)`` given the earlier chunks' state ``(m, p)`` (relative to
    ``start``; ``None`` where there are none): its tame keys, its other keys (by blocks, only
    if there are any), the earlier chunks."""
    weights = chunk.tame_weights(matmul_dtype)
    out = dot("ij,jp->ip", weights, _rows(v), matmul_dtype).reshape(*v.shape[:2], -1)

    def wild(zero):  # the keys that are not tame: their blocks' pieces
        anchored, values = chunk.anchored(zero), v + zero
        keys = ~anchored.tame.tame
        pairs = jnp.sum(anchored.own_pairs(keys), axis=-1)
        wild_out = jnp.einsum("sij,sjp->sip", pairs, values.astype(pairs.dtype))
        blocks = v.shape[0]
        for offset in range(1, blocks):
            query, key = anchored.earlier_block(offset, keys)
            scores = dot("sim,sjm->sij", query, key, matmul_dtype)
            wild_out = wild_out.at[offset:].add(
                dot("sij,sjp->sip", scores, values[: blocks - offset], matmul_dtype)
            )
        return wild_out

    out = out + _only_if(chunk.tame.any_wild, wild, jnp.zeros_like(out))
    if state is None:
        return out
    return out + dot("sim,mp->sip", chunk.earlier_chunks_query(start), state, matmul_dtype)


def _wild_cotangents(chunk: Chunk, v, grad, matmul_dtype):
    """(dla, dlb, dv) ``(s, b, .)`` of the keys that are not tame, by blocks: their own blocks'
    (B, B, m) forms, their later blocks' B x B products."""
    keys = ~chunk.tame.tame
    pairs = chunk.own_pairs(keys)
    products = dot("sip,sjp->sij", grad, v, matmul_dtype)
    weighted = pairs * jnp.where(_causal(products), products, 0)[..., None]
    grad_la, grad_lb = jnp.sum(weighted, axis=2), jnp.sum(weighted, axis=1)
    weights = jnp.sum(pairs, axis=-1)
    grad_v = jnp.einsum("sij,sip->sjp", weights, grad.astype(weights.dtype))
    blocks = v.shape[0]
    for offset in range(1, blocks):
        query, key = chunk.earlier_block(offset, keys)
        values, grads = v[: blocks - offset], grad[offset:]
        products = dot("sip,sjp->sij", grads, values, matmul_dtype)
        scores = dot("sim,sjm->sij", query, key, matmul_dtype)
        grad_la = grad_la.at[offset:].add(query * dot("sij,sjm->sim", products, key, matmul_dtype))
        grad_lb = grad_lb.at[: blocks - offset].add(
            key * dot("sij,sim->sjm", products, query, matmul_dtype)
        )
        grad_v = grad_v.at[: blocks - offset].add(dot("sij,sip->sjp", scores, grads, matmul_dtype))
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
        key = chunk.keys.relative_to(end)
        grad_lb = grad_lb + key * dot("mp,sjp->sjm", later, v, matmul_dtype)
        grad_v = grad_v + dot("sjm,mp->sjp", key, later, matmul_dtype)
    return grad_la, grad_lb, grad_v
