"""One chunk of one head in ``_log_prefix``'s chunk algorithm (see its module docstring): the
chunk's factors given its row shifts, its output from the earlier chunks' state, and its
cotangents, each as three pieces (the blocks' own keys as B x B products of factors relative to
a reference of positions before them, those far above it as a (B, B, m) form: ``OwnKeys``; the
earlier blocks of the chunk as B x B products; the earlier chunks through the state).

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


def _block_pairs(la: jax.Array, lb: jax.Array, keys: jax.Array | None = None) -> jax.Array:
    """la_ti + lb_ji within each block for j <= t (and ``keys`` ``(s, b)`` j, if given), -inf
    (selected, not added) elsewhere: ``(s, b, b, m)``."""
    block = la.shape[1]
    selected = jnp.tril(jnp.ones((block, block), dtype=bool))[None]
    if keys is not None:
        selected = selected & keys[:, None, :]
    return jnp.where(selected[..., None], la[:, :, None, :] + lb[:, None, :, :], -jnp.inf)


def _row_shift(la: jax.Array, lb: jax.Array, keys: Keys) -> jax.Array:
    """M_t = max(max_i (la_ti + E_i), max_{j <= t in t's block, i} (la_ti + lb_ji)) ``(s, b)``:
    the row's largest exponent, from positions <= t only. Formed as max_i (la_ti + c_ti) with
    c_ti = max(E_i, max_{j <= t} lb_ji), the running maximum (b m values per block, not the
    pairs' b b m): the same number, since rounding is monotone (fl(a + max_j b_j) =
    max_j fl(a + b_j))."""
    running = jnp.maximum(jax.lax.cummax(lb, axis=1), keys.block_start[:, None, :])
    return jax.lax.stop_gradient(jnp.max(la + running, axis=-1))


class OwnKeys(NamedTuple):
    """Each block's weights against its own keys, w_tji = exp(la_ti + lb_ji - M_t) for j <= t,
    as products of two factors relative to r = max(E, lb_first) (the block's start and its
    first key: positions <= every row of the block), exact where ``factored_bound`` allows:

    query: exp(la_t + r - M_t) ``(s, b, m)``, each <= 1 (M_t >= la_ti + c_ti >= la_ti + r_i);
    key: exp(lb_j - r) ``(s, b, m)`` of the keys within the bound (``tame``), 0 for the others;
    tame: ``(s, b)``, the keys with max_i (lb_ji - r_i) <= ``factored_bound``: nearly every
    key (not: keys far above their block's start and first key, e.g. in a sequence's first
    block, which no earlier key references, from |k| ~ 30);
    any_wild: ``()`` bool, whether some key of the chunk is not tame: only then are the other
    keys' weights formed per pair (``_only_if``).

    Whether a key is tame depends on positions <= it only, and a tame key's weight on the row
    and the key only, so row t's output stays bit-identical whatever later positions hold."""

    query: jax.Array
    key: jax.Array
    tame: jax.Array
    any_wild: jax.Array


def _own_keys(la, lb, row_shift, keys: Keys, matmul_dtype) -> OwnKeys:
    reference = jnp.maximum(keys.block_start, lb[:, 0])
    bound = factored_bound(lb.shape[-1], lb.shape[1], lb.dtype, matmul_dtype)
    exponent = lb - reference[:, None]
    tame = jnp.max(exponent, axis=-1) <= bound  # a NaN is not
    query = jnp.exp(la + reference[:, None] - row_shift[..., None])
    key = jnp.where(tame[..., None], jnp.exp(jnp.minimum(exponent, bound)), 0)
    return OwnKeys(query, key, tame, jnp.any(~tame))


class Chunk(NamedTuple):
    """One chunk's factors given its row shifts M: the keys', the queries' exp(la_t + E - M_t)
    ``(s, b, m)`` (each <= 1), and the blocks' own keys' (``OwnKeys``), with la, lb and M for
    the keys formed per pair."""

    keys: Keys
    query: jax.Array
    own: OwnKeys
    la: jax.Array
    lb: jax.Array
    row_shift: jax.Array

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

    def wild_pairs(self, zero: jax.Array) -> jax.Array:
        """exp(la_ti + lb_ji - M_t) ``(s, b, b, m)`` for the keys j <= t that are not tame, 0
        for the rest (``zero``: ``_only_if``'s)."""
        wild = ~self.own.tame & (zero == 0)
        pairs = _block_pairs(self.la + zero.astype(self.la.dtype), self.lb, wild)
        return jnp.exp(pairs - self.row_shift[..., None, None])

    def tame_weights(self, matmul_dtype) -> jax.Array:
        """sum_i w_tji ``(s, b, b)`` of the tame keys j <= t, 0 for the others and for j > t:
        the factors' products (the later keys' selected away, not multiplied by 0)."""
        scores = dot("sim,sjm->sij", self.own.query, self.own.key, matmul_dtype)
        return jnp.where(_causal(scores), scores, 0)

    def own_weights(self, matmul_dtype) -> jax.Array:
        """sum_i w_tji ``(s, b, b)`` for j <= t, 0 for j > t: the tame keys' products plus the
        other keys' pairs (formed only if there are any)."""
        weights = self.tame_weights(matmul_dtype)
        pairs = _only_if(
            self.own.any_wild,
            lambda zero: jnp.sum(self.wild_pairs(zero), axis=-1),
            jnp.zeros_like(weights),
        )
        return weights + pairs


def _only_if(condition: jax.Array, formed, zeros):
    """``formed(zero)`` where ``condition`` holds, else ``zeros``: a loop of at most one step,
    not ``lax.cond``, whose predicate under ``jax.vmap`` (over heads, chunks, the batch) becomes
    a select of both branches. A batched loop steps while any element's condition holds, so the
    branch is formed once if some element needs it, and never otherwise. ``zero`` is 0.0 read
    from the loop's state, for ``formed`` to fold into its operands: work that reads only loop
    invariants XLA hoists out of the loop (and runs always)."""

    def step(carry):
        running, _ = carry
        zero = jnp.where(running, 0.0, 1.0)
        return jnp.zeros_like(running), formed(zero)

    return jax.lax.while_loop(lambda carry: carry[0], step, (condition, zeros))[1]


def _causal(scores: jax.Array) -> jax.Array:
    """j <= t for ``(..., b, b)`` scores, broadcast."""
    return jnp.tril(jnp.ones(scores.shape[-2:], dtype=bool))


def chunk_factors(la, lb, start, row_shift=None, matmul_dtype=None) -> tuple[Chunk, jax.Array]:
    """(``Chunk``, M): one chunk's factors, with its row shifts (formed unless given);
    ``matmul_dtype``: the products' operands' (default: la's)."""
    keys = _keys(lb, start)
    if row_shift is None:
        row_shift = _row_shift(la, lb, keys)
    query = jnp.exp(la + keys.block_start[:, None] - row_shift[..., None])
    own = _own_keys(la, lb, row_shift, keys, matmul_dtype or la.dtype)
    return Chunk(keys, query, own, la, lb, row_shift), row_shift


def chunk_output(chunk: Chunk, v, start, state, matmul_dtype) -> jax.Array:
    """One chunk's Y ``(s, b, p)`` given the earlier chunks' state ``(m, p)`` (relative to
    ``start``; ``None`` where there are none): its blocks' own keys, its earlier blocks, the
    earlier chunks."""
    weights = chunk.own_weights(matmul_dtype)
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
    # D_tj within each block, selected for j <= t: a later key's product (huge or inf, e.g. the
    # floored normaliser's cotangent G / eps of a row without keys) never meets its 0 weight.
    products = dot("sip,sjp->sij", grad, v, matmul_dtype)
    products = jnp.where(_causal(products), products, 0)
    own = chunk.own
    grad_la = own.query * dot("sij,sjm->sim", products, own.key, matmul_dtype)
    grad_lb = own.key * dot("sij,sim->sjm", products, own.query, matmul_dtype)
    weights = chunk.tame_weights(matmul_dtype)

    def wild_pairs(zero):  # the keys that are not tame, per pair
        pairs = chunk.wild_pairs(zero)
        weighted = pairs * products[..., None]
        return jnp.sum(weighted, axis=2), jnp.sum(weighted, axis=1), jnp.sum(pairs, axis=-1)

    zeros = tuple(map(jnp.zeros_like, (grad_la, grad_lb, weights)))
    pairs_la, pairs_lb, pairs_weights = _only_if(own.any_wild, wild_pairs, zeros)
    grad_la, grad_lb, weights = grad_la + pairs_la, grad_lb + pairs_lb, weights + pairs_weights
    grad_v = jnp.einsum("sij,sip->sjp", weights, grad.astype(weights.dtype))
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
