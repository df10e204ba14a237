"""The Pallas kernels of fused FAVOR attention (``_fused``) for the maps with affine
log-features: one chunk (or a group of chunks) of one head per program, the affine feature map
computed from the rows inside the kernel, blocks of ``LOG_BLOCK`` positions read from the refs
(Triton cannot slice values), products accumulated in float32. The computation per chunk is
``_log_prefix``'s by blocks (each block's own keys per pair, or factored under
``diagonal_form="factored"``), or under ``diagonal_form="chunk"`` as the XLA form forms a
chunk (its tame keys as one product, ``_log_chunk.Tame``; ``_tame_sums``,
``_ChunkCotangents``);
see ``_fused`` for the passes (and ``_fused_hybrid`` for the angular hybrid's kernels, which
take the same arguments)."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rfjax.attention import _kernel_settings
from rfjax.attention._checks import log_floor
from rfjax.attention._log_chunk import factored_bound
from rfjax.attention._log_prefix import LOG_BLOCK

CHUNK = 64  # positions per chunk: 4 blocks of LOG_BLOCK
FEATURE_TILE = 32  # features per tile of a diagonal block's pairs (``_diagonal``), at most
# The same in the causal cotangent kernel (``_diagonal_cotangents``): 16, the smallest product
# dimension the kernels use (``_fused.MIN_WIDTH``); 8 spilled 976 bytes per thread on sm90
# against 1,452 (tools/triton_kernels.py), but makes products of width 8.
COTANGENT_TILE = 16
STATE_TILE = 64  # features per step of the causal output kernel's state read-out
PRODUCT_TILE = 64  # features per step of the output kernel's chunk form (``_tame_sums``)


def tile_width(width: int, most: int) -> int:
    """Features per tile when ``width`` features are formed in tiles of at most ``most`` (a
    power of two): the largest divisor of ``width`` that divides ``most``, so that every feature
    is in a whole tile (``most`` itself for Triton's widths, powers of two >= ``most``)."""
    return math.gcd(width, most)


@dataclasses.dataclass(frozen=True)
class AffineSpec:
    """How the kernels read an affine map l(x) = x W^T + b + g |x|^2 (FAVOR+, its antithetic
    variant, OPRF): parameters W ``(m, H)`` and b ``(1, m)``; features of width m, each key
    shifted by its own running maximum (``reference_width`` m)."""

    norm_weight: float

    @property
    def kernels(self) -> typing.Any:
        """The module of the kernels (this one)."""
        return sys.modules[__name__]

    def width(self, weights: jax.Array, aux: jax.Array) -> int:
        """The width of the states and summaries: m."""
        del aux
        return weights.shape[0]

    def reference_width(self, weights: jax.Array, aux: jax.Array) -> int:
        """The width of the key maxima (the references): one per feature."""
        return self.width(weights, aux)

    def operand_dtype(self, matmul_dtype: jnp.dtype) -> jnp.dtype:
        """The products' operand dtype: ``matmul_dtype`` (the inputs' for low-precision ones;
        the factors lie in [0, 1] and nothing cancels), accumulated in float32."""
        return matmul_dtype

    def padded_aux(self, aux: jax.Array, head_dim: int) -> jax.Array:
        """b ``(m,)`` -> ``(1, m)``, float32."""
        del head_dim
        return aux[None, :].astype(jnp.float32)

    def unpadded_aux(self, grad: jax.Array, aux: jax.Array) -> jax.Array:
        """db ``(1, m)`` -> ``(m,)`` in b's dtype."""
        return grad[0].astype(aux.dtype)


# ------------------------------------------------------------------------ in-kernel pieces


class _Form:
    """The affine log-features inside a kernel: l(x) = x W^T + b + g |x|^2 from refs."""

    def __init__(self, weights_ref, bias_ref, norm_weight: float, dtype):
        self.weights_ref, self.bias_ref = weights_ref, bias_ref
        self.weights = weights_ref[...].astype(dtype)
        self.bias = bias_ref[...].astype(dtype)  # (1, m)
        self.norm_weight = norm_weight
        self.dtype = dtype

    @property
    def width(self) -> int:
        """The number of features m."""
        return self.weights_ref.shape[0]

    def __call__(self, rows: jax.Array) -> jax.Array:
        return self._logs(rows, self.weights, self.bias)

    def tile(self, rows: jax.Array, features: typing.Any) -> jax.Array:
        """The columns ``features`` (a ``pl.ds`` of W's rows) of l(rows), read from the refs."""
        weights = self.weights_ref[features, :].astype(self.dtype)
        return self._logs(rows, weights, self.bias_ref[:, features].astype(self.dtype))

    def _logs(self, rows: jax.Array, weights: jax.Array, bias: jax.Array) -> jax.Array:
        rows = rows.astype(self.dtype)
        squared = jnp.sum(rows * rows, axis=1, keepdims=True)
        projected = jnp.dot(rows, weights.T, preferred_element_type=self.dtype)
        return projected + bias + self.norm_weight * squared

    def pullback(self, rows: jax.Array, grad_logs: jax.Array) -> jax.Array:
        """d/drows of sum(grad_logs * l(rows)): grad_logs W + 2 g (sum_i grad_logs_i) rows."""
        rows = rows.astype(self.dtype)
        total = jnp.sum(grad_logs, axis=1, keepdims=True)
        back = jnp.dot(grad_logs, self.weights, preferred_element_type=self.dtype)
        return back + 2.0 * self.norm_weight * total * rows


def _dot(a: jax.Array, b: jax.Array, matmul_dtype, *, transpose_b: bool = False) -> jax.Array:
    """a b (or a b^T) with operands in ``matmul_dtype``, accumulated in float32 (or wider)."""
    accumulate = jnp.promote_types(jnp.float32, a.dtype)
    b = b.T if transpose_b else b
    return jnp.dot(
        a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=accumulate
    )


def _causal_mask(block: int) -> jax.Array:
    rows = jax.lax.broadcasted_iota(jnp.int32, (block, block), 0)
    return (jax.lax.broadcasted_iota(jnp.int32, (block, block), 1) <= rows)[:, :, None]


def _block_weights(la: jax.Array, lb: jax.Array, row_shift: jax.Array) -> jax.Array:
    """exp(la_ti + lb_ji - M_t) for j <= t, 0 for j > t: ``(B, B, m)``."""
    pairs = la[:, None, :] + lb[None, :, :]
    return jnp.exp(jnp.where(_causal_mask(la.shape[0]), pairs, -jnp.inf) - row_shift[:, :, None])


def _pair_maximum(la: jax.Array, lb: jax.Array) -> jax.Array:
    """max_{j <= t, i} (la_ti + lb_ji) ``(B, 1)``."""
    pairs = jnp.where(_causal_mask(la.shape[0]), la[:, None, :] + lb[None, :, :], -jnp.inf)
    return jnp.max(jnp.max(pairs, axis=2), axis=1, keepdims=True)


def _row_shift(pair_maximum: jax.Array, la: jax.Array, block_start: jax.Array) -> jax.Array:
    """M_t ``(B, 1)``: max(max_i (la_ti + E_i), max_{j <= t, i} (la_ti + lb_ji)), given the
    second term (``_pair_maximum``)."""
    return jnp.maximum(pair_maximum, jnp.max(la + block_start, axis=1, keepdims=True))


class _Rows:
    """A block of ``LOG_BLOCK`` rows read from refs at row ``start`` (an int or traced),
    as queries (rows, log-features la, cotangents G, g of the numerator and denominator, row
    shifts M) or as keys (rows, log-features lb at the log floor for keys left out, values 0
    for them, the keys that count as a column and a row, the block's maximum per feature)."""

    def __init__(self, form: _Form, start, *, queries=None, keys=None):
        aligned = start if isinstance(start, int) else pl.multiple_of(start, LOG_BLOCK)
        self.index = pl.ds(aligned, LOG_BLOCK)
        if queries is not None:
            q_ref, grad_ref, grad_den_ref, shift_ref = queries
            self.rows = q_ref[self.index, :]
            self.logs = form(self.rows)
            self.grad = grad_ref[self.index, :].astype(jnp.float32)
            self.grad_den = grad_den_ref[self.index, :].astype(jnp.float32)
            self.shift = shift_ref[self.index, :]
        if keys is not None:
            k_ref, v_ref, valid_ref = keys
            self.valid = valid_ref[self.index, :] > 0
            self.rows = k_ref[self.index, :]
            self.logs = jnp.where(self.valid, form(self.rows), log_floor(form.dtype))
            self.v = jnp.where(self.valid, v_ref[self.index, :].astype(form.dtype), 0)
            self.ones = self.valid.astype(form.dtype).T  # (1, B)
            self.block_max = jnp.max(self.logs, axis=0, keepdims=True)

    def products(self, keys: _Rows, matmul_dtype=jnp.float32) -> jax.Array:
        """D_tj = G_t . v_j + g_t (1 for the keys that count) ``(B, B)``, these rows the
        queries."""
        return _dot(self.grad, keys.v, matmul_dtype, transpose_b=True) + self.grad_den * keys.ones

    def pulled_back(self, form: _Form, grad_logs, out_ref, totals):
        """Writes the rows' cotangents (``grad_logs`` pulled back through the map) to
        ``out_ref`` and adds the map's share to ``totals`` (dW, db)."""
        out_ref[self.index, :] = form.pullback(self.rows, grad_logs).astype(out_ref.dtype)
        grad_w, grad_b = totals
        grad_w = grad_w + jnp.dot(grad_logs.T, self.rows.astype(jnp.float32))
        return grad_w, grad_b + jnp.sum(grad_logs, axis=0, keepdims=True)


def _tile_logs(form: _Form, q: jax.Array, keys: _Rows, tile: int):
    """``logs(i)``: la and lb (the log floor for keys left out) of the i-th tile of ``tile``
    features of the rows ``q`` and of ``keys``."""
    floor = log_floor(form.dtype)

    def logs(i):
        features = pl.ds(pl.multiple_of(i * tile, tile), tile)
        return form.tile(q, features), jnp.where(keys.valid, form.tile(keys.rows, features), floor)

    return logs


def _block_row_shift(form: _Form, q: jax.Array, keys: _Rows, la: jax.Array, block_start):
    """A block's row shifts M_t ``(B, 1)`` (``_row_shift``), the pairs' maxima with its own keys
    formed ``FEATURE_TILE`` features at a time (``_diagonal``)."""
    tile = tile_width(form.width, FEATURE_TILE)
    logs = _tile_logs(form, q, keys, tile)

    def top(i, own):
        return jnp.maximum(own, _pair_maximum(*logs(i)))

    tiles = form.width // tile
    own = jax.lax.fori_loop(0, tiles, top, jnp.full((LOG_BLOCK, 1), -jnp.inf, form.dtype))
    return _row_shift(own, la, block_start)


def _diagonal(form: _Form, q, keys: _Rows, la, row_shift, matmul_dtype):
    """A block's weights against its own keys given its row shifts M ``(B, 1)``
    (``_block_row_shift``), sum_i exp(la_ti + lb_ji - M_t) for j <= t ``(B, B)``:
    ``_block_weights`` summed over the features, or under ``diagonal_form="factored"`` the
    products exp(la + e - M) exp(lb - e)^T (``_factors``) where ``_log_chunk.factored_bound``
    allows it (the row factors exp(la + e - M) within e^(L/2), the key factors <= 1); both
    formed ``FEATURE_TILE`` features at a time (the pairs of a tile are
    ``(B, B, FEATURE_TILE)`` values, those of all m features would not fit in registers; the
    factors of all m at once spilled 1,628 bytes per thread in the cotangent kernel at
    m = 256 on sm90 at 81e02d8, in tiles 1,396)."""
    tile = tile_width(form.width, FEATURE_TILE)
    logs = _tile_logs(form, q, keys, tile)
    tiles = form.width // tile

    def pair_step(i, weights):  # selected for j <= t already
        return weights + jnp.sum(_block_weights(*logs(i), row_shift), axis=2)

    def factored_step(i, scores):
        query, key = _factors(*logs(i), row_shift)
        return scores + _dot(query, key, matmul_dtype, transpose_b=True)

    zeros = jnp.zeros((LOG_BLOCK, LOG_BLOCK), form.dtype)

    def pairs():
        return jax.lax.fori_loop(0, tiles, pair_step, zeros)

    def factored():
        return _causal_part(jax.lax.fori_loop(0, tiles, factored_step, zeros))

    exponent = _query_exponent(la, keys.block_max, row_shift)
    return _factored_or_pairs(exponent, factored, pairs, matmul_dtype)


def _query_exponent(la: jax.Array, block_max: jax.Array, row_shift: jax.Array) -> jax.Array:
    """x = la + e - M ``(B, m)`` of the rows with a key that counts at or before them, -inf
    (a factor 0) for the rest: their M is at the log floor, so x would overflow, and every
    term of theirs is a left-out key's, whose value and count are 0 in either form."""
    counted = row_shift > 0.5 * log_floor(la.dtype)
    return jnp.where(counted, la + block_max - row_shift, -jnp.inf)


def _factors(la: jax.Array, lb: jax.Array, row_shift: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A block's factors against its own keys (``factored_bound``), ``(B, m)`` each: the rows'
    exp(x) (``_query_exponent``) and the keys' exp(lb - e), with e the keys' maximum per
    feature; sum_i of their products is the block's weights for j <= t."""
    block_max = jnp.max(lb, axis=0, keepdims=True)
    return jnp.exp(_query_exponent(la, block_max, row_shift)), jnp.exp(lb - block_max)


def _causal_part(scores: jax.Array) -> jax.Array:
    """``(B, B)`` scores for j <= t, 0 for j > t: the later keys' products (finite:
    exp(x) <= e^(L/2)) selected away, not multiplied by 0."""
    return jnp.where(_causal_mask(scores.shape[0])[:, :, 0], scores, 0)


def _factored_or_pairs(exponent: jax.Array, factored, pairs, matmul_dtype):
    """``pairs()`` under ``diagonal_form="pairs"`` (the default; ``fused_kernel_settings``)
    and ``"chunk"`` (whose blocks that are not tame go per pair);
    under ``"factored"``, ``factored()`` where every exponent x ``(B, m)`` is within
    ``factored_bound`` (a NaN is not), else ``pairs()``: one branch per block, taken by the
    whole program."""
    bound = factored_bound(exponent.shape[1], LOG_BLOCK, matmul_dtype)
    if _kernel_settings.IN_FORCE.diagonal_form != "factored" or bound == -math.inf:
        return pairs()
    return jax.lax.cond(jnp.max(exponent) <= bound, factored, pairs)


def _placed(tile_values: jax.Array, first: jax.Array, width: int) -> jax.Array:
    """``(rows, tile)`` values as columns ``first ...`` of ``(rows, width)`` zeros: a product
    with a 0/1 matrix (Triton cannot write into a value's columns), exact in float32."""
    tile = tile_values.shape[1]
    columns = jax.lax.broadcasted_iota(jnp.int32, (tile, width), 1)
    place = columns == jax.lax.broadcasted_iota(jnp.int32, (tile, width), 0) + first
    return jnp.dot(
        tile_values,
        place.astype(tile_values.dtype),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=tile_values.dtype,
    )


def _diagonal_cotangents(
    form: _Form, queries: _Rows, keys: _Rows, matmul_dtype, *, of_queries: bool
):
    """A block's cotangents against its own keys, with w_tji = exp(la_ti + lb_ji - M_t)
    (``_block_weights``) and D_tj = G_t . [v_j, 1] for j <= t (``_Rows.products``): the
    queries' log-features' sum_j w_tji D_tj ``(B, m)`` (``of_queries``), else the keys'
    sum_t w_tji D_tj ``(B, m)`` and sum_i w_tji ``(B, B)``. Per pair, or as ``_diagonal``
    forms the weights, with w_tji = a_ti b_ji as products of the factors (``_factors``) where
    ``factored_bound`` allows it; either way ``COTANGENT_TILE`` features at a time, each
    tile's cotangents placed in their columns."""
    tile = tile_width(form.width, COTANGENT_TILE)
    floor = log_floor(form.dtype)
    products = _causal_part(queries.products(keys))

    def tile_logs(i):  # the first feature, la and lb of the i-th tile of features
        first = pl.multiple_of(i * tile, tile)
        features = pl.ds(first, tile)
        lb = jnp.where(keys.valid, form.tile(keys.rows, features), floor)
        return first, form.tile(queries.rows, features), lb

    def query_tile(i, factored: bool):  # (first, sum_j w_tji D_tj (B, tile))
        first, la, lb = tile_logs(i)
        if factored:
            query, key = _factors(la, lb, queries.shift)
            return first, query * _dot(products, key, matmul_dtype)
        w = _block_weights(la, lb, queries.shift)
        return first, jnp.sum(w * products[:, :, None], axis=1)

    def key_tile(i, factored: bool):  # (first, sum_t w_tji D_tj (B, tile), sum_i w_tji (B, B))
        first, la, lb = tile_logs(i)
        if factored:  # the sums for j > t selected away below, in ``cotangents``
            query, key = _factors(la, lb, queries.shift)
            grad_lb = key * _dot(products.T, query, matmul_dtype)
            return first, grad_lb, _dot(query, key, matmul_dtype, transpose_b=True)
        w = _block_weights(la, lb, queries.shift)
        return first, jnp.sum(w * products[:, :, None], axis=0), jnp.sum(w, axis=2)

    def cotangents(factored: bool):
        def of_queries_step(i, grad_la):
            first, tile_la = query_tile(i, factored)
            return grad_la + _placed(tile_la, first, form.width)

        def of_keys_step(i, sums):
            first, tile_lb, total = key_tile(i, factored)
            return sums[0] + _placed(tile_lb, first, form.width), sums[1] + total

        logs = jnp.zeros((LOG_BLOCK, form.width), form.dtype)
        tiles = form.width // tile
        if of_queries:
            return jax.lax.fori_loop(0, tiles, of_queries_step, logs)
        total = jnp.zeros((LOG_BLOCK, LOG_BLOCK), form.dtype)
        grad_lb, total = jax.lax.fori_loop(0, tiles, of_keys_step, (logs, total))
        return grad_lb, _causal_part(total) if factored else total

    exponent = _query_exponent(queries.logs, keys.block_max, queries.shift)
    return _factored_or_pairs(
        exponent, lambda: cotangents(True), lambda: cotangents(False), matmul_dtype
    )


def _state_readout(form: _Form, q, la, row_shift, refs, sums, matmul_dtype):
    """``sums`` (numerator ``(B, P)``, denominator ``(B, 1)``) plus the rows' read-out of the
    earlier chunks' state, exp(la_t + E - M_t) [S, z] (the refs: E ``(1, m)``, S ``(m, P)``,
    z ``(1, m)``). Past ``STATE_TILE`` features, a tile at a time (a loop; the tile's la
    formed from the rows): all m rows of S as one operand spilled (at m = 256 on sm90, 2,536
    bytes per thread with the whole state, 1,524 with tiles of 64; unrolled tiles 2,532), and
    within one tile the rows' own la spill least (12 bytes at m = 64, 136 formed again)."""
    start_ref, state_ref, count_ref = refs

    def add(sums, la, features):
        num, den = sums
        query = jnp.exp(la + start_ref[:, features] - row_shift)
        num = num + _dot(query, state_ref[features, :], matmul_dtype)
        return num, den + jnp.sum(query * count_ref[:, features], axis=1, keepdims=True)

    if form.width <= STATE_TILE:
        return add(sums, la, slice(None))

    def step(i, sums):
        features = pl.ds(pl.multiple_of(i * STATE_TILE, STATE_TILE), STATE_TILE)
        return add(sums, form.tile(q, features), features)

    return jax.lax.fori_loop(0, form.width // STATE_TILE, step, sums)


# -------------------------------------------------------------------------------- kernels


def key_summary_kernel(
    k_ref, v_ref, valid_ref, w_ref, b_ref, max_ref, sum_ref, count_ref, *, spec, matmul_dtype
):
    """A chunk's key maximum d ``(1, m)``, sum_j exp(lb_j - d) v_j^T ``(m, P)`` and
    sum_j exp(lb_j - d) ``(1, m)``."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    valid = valid_ref[...] > 0
    lb = jnp.where(valid, form(k_ref[...]), log_floor(jnp.float32))
    top = jnp.max(lb, axis=0, keepdims=True)
    factors = jnp.where(valid, jnp.exp(lb - top), 0)
    values = jnp.where(valid, v_ref[...].astype(jnp.float32), 0)
    max_ref[...] = top
    sum_ref[...] = _dot(factors.T, values, matmul_dtype)
    count_ref[...] = jnp.sum(factors, axis=0, keepdims=True)


def output_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    start_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    shift_ref,
    *,
    spec,
    matmul_dtype,
):
    """One chunk's numerator ``(C, P)``, denominator ``(C, 1)`` and row shifts ``(C, 1)``, a
    block of ``LOG_BLOCK`` queries at a time: by blocks (``_block_sums``), or under
    ``diagonal_form="chunk"``, where every key up to the block's end is tame, against all of
    them and the state as products of the chunk's factors (``_tame_sums``)."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    key_refs, state_refs = (k_ref, v_ref, valid_ref), (start_ref, state_ref, count_ref)
    start = start_ref[...]
    bound = factored_bound(form.width, CHUNK, form.dtype, matmul_dtype)
    chunk_form = _kernel_settings.IN_FORCE.diagonal_form == "chunk" and bound > -math.inf
    block_start = start  # the keys' running maximum at the block's start
    for s in range(q_ref.shape[0] // LOG_BLOCK):
        rows = pl.ds(s * LOG_BLOCK, LOG_BLOCK)
        q = q_ref[rows, :]
        la = form(q)
        keys = _Rows(form, s * LOG_BLOCK, keys=key_refs)
        row_shift = _block_row_shift(form, q, keys, la, block_start)
        by_blocks = functools.partial(
            _block_sums, form, s, q, la, keys, row_shift, key_refs, state_refs, matmul_dtype
        )
        if chunk_form:
            if s == 0:
                reference, highest = _chunk_reference(start, keys.logs), -jnp.inf
            highest = jnp.maximum(highest, jnp.max(keys.logs - reference))
            num, den = jax.lax.cond(  # a NaN is not within the bound
                highest <= bound,
                functools.partial(
                    _tame_sums, form, s, q, row_shift, key_refs, state_refs, matmul_dtype, bound
                ),
                by_blocks,
            )
        else:
            num, den = by_blocks()
        num_ref[rows, :] = num
        den_ref[rows, :] = den
        shift_ref[rows, :] = row_shift
        block_start = jnp.maximum(block_start, keys.block_max)


def _chunk_reference(start: jax.Array, logs: jax.Array) -> jax.Array:
    """r = max(C^s, lb_0) ``(1, m)``: the running maximum at the chunk's start and its first
    key (the first row of ``logs``), positions at or before every row of the chunk."""
    first = jax.lax.broadcasted_iota(jnp.int32, logs.shape, 0) == 0
    return jnp.maximum(start, jnp.max(jnp.where(first, logs, -jnp.inf), axis=0, keepdims=True))


def _block_sums(form, s, q, la, keys, row_shift, key_refs, state_refs, matmul_dtype):
    """Block ``s``'s numerator ``(B, P)`` and denominator ``(B, 1)`` by blocks: against its own
    keys (``_diagonal``), each earlier block's (read again from the refs, relative to that
    block's maximum per feature) and the state of the chunks before (``_state_readout``)."""
    weights = _diagonal(form, q, keys, la, row_shift, matmul_dtype)
    num = jnp.dot(weights, keys.v, preferred_element_type=jnp.float32)
    den = jnp.sum(weights * keys.ones, axis=1, keepdims=True)
    for earlier in range(s):
        before = _Rows(form, earlier * LOG_BLOCK, keys=key_refs)
        query = jnp.exp(la + before.block_max - row_shift)
        key = jnp.exp(before.logs - before.block_max)
        scores = _dot(query, key, matmul_dtype, transpose_b=True)
        num = num + _dot(scores, before.v, matmul_dtype)
        den = den + jnp.sum(scores * before.ones, axis=1, keepdims=True)
    return _state_readout(form, q, la, row_shift, state_refs, (num, den), matmul_dtype)


def _key_span(s: int) -> int:
    """The keys block ``s`` reads in ``_tame_sums``: the chunk's first (s + 1) B, rounded up to
    a power of two (Triton's shapes; the later ones are selected away)."""
    return 1 << ((s + 1) * LOG_BLOCK - 1).bit_length()


def _tame_sums(form, s, q, row_shift, key_refs, state_refs, matmul_dtype, bound):
    """Block ``s``'s numerator ``(B, P)`` and denominator ``(B, 1)`` where every key up to its
    end is tame (``_log_chunk.Tame``): relative to r = max(C^s, lb_0), the rows' factors
    exp(la_t + r - M_t) <= 1 times the keys' exp(lb_j - r) <= e^``bound``, as one product
    with the chunk's keys j <= t, and times exp(C^s - r) <= 1 with the earlier chunks' state;
    ``PRODUCT_TILE`` features at a time."""
    k_ref, v_ref, valid_ref = key_refs
    start_ref, state_ref, count_ref = state_refs
    span = pl.ds(0, _key_span(s))
    tile = tile_width(form.width, PRODUCT_TILE)
    floor = log_floor(form.dtype)

    def step(i, sums):  # the keys read from the refs in each step: held, they spilled more
        scores, num, den = sums
        features = pl.ds(pl.multiple_of(i * tile, tile), tile)
        lb = jnp.where(valid_ref[span, :] > 0, form.tile(k_ref[span, :], features), floor)
        start = start_ref[:, features]
        reference = _chunk_reference(start, lb)
        query = jnp.exp(form.tile(q, features) + reference - row_shift)
        # Keys after the block's rows are not checked against the bound: clamped, and
        # selected away below.
        key = jnp.exp(jnp.minimum(lb - reference, bound))
        scores = scores + _dot(query, key, matmul_dtype, transpose_b=True)
        earlier = query * jnp.exp(start - reference)
        num = num + _dot(earlier, state_ref[features, :], matmul_dtype)
        den = den + jnp.sum(earlier * count_ref[:, features], axis=1, keepdims=True)
        return scores, num, den

    zeros = (
        jnp.zeros((LOG_BLOCK, _key_span(s)), jnp.float32),
        jnp.zeros((LOG_BLOCK, v_ref.shape[1]), jnp.float32),
        jnp.zeros((LOG_BLOCK, 1), jnp.float32),
    )
    scores, num, den = jax.lax.fori_loop(0, form.width // tile, step, zeros)
    valid = valid_ref[span, :] > 0
    values = jnp.where(valid, v_ref[span, :].astype(form.dtype), 0)
    rows = jax.lax.broadcasted_iota(jnp.int32, scores.shape, 0) + s * LOG_BLOCK
    scores = jnp.where(jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1) <= rows, scores, 0)
    num = num + _dot(scores, values, matmul_dtype)
    return num, den + jnp.sum(scores * valid.astype(form.dtype).T, axis=1, keepdims=True)


def query_summary_kernel(
    q_ref,
    w_ref,
    b_ref,
    reference_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    sum_ref,
    count_ref,
    *,
    spec,
    matmul_dtype,
):
    """sum_t exp(la_t + r - M_t) [G_t, g_t]^T over a chunk's rows, for a reference r ``(1, m)``:
    ``(m, P)`` and ``(1, m)``."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    factors = jnp.exp(form(q_ref[...]) + reference_ref[...] - shift_ref[...])
    sum_ref[...] = _dot(factors.T, grad_ref[...], matmul_dtype)
    count_ref[...] = jnp.sum(factors * grad_den_ref[...], axis=0, keepdims=True)


def cotangent_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    start_ref,
    end_ref,
    state_ref,
    count_ref,
    later_ref,
    later_count_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """The cotangents of a group of chunks: rows (dq, dk ``(C, H)``, dv ``(C, P)`` per chunk)
    and the map's (dW ``(m, H)``, db ``(1, m)`` summed over the group). Per chunk, a loop over
    its blocks of queries (each against its own keys, the earlier blocks' and the state), then
    one over its blocks of keys (against their own queries, the later blocks' and the later
    chunks' summary): each step completes one block's cotangents and writes them, so a step
    holds one block's (the pairs of the blocks are formed twice, once per loop; holding every
    block's cotangents for the chunk spilled 17,600 bytes per thread on sm90). Under
    ``diagonal_form="chunk"`` a block whose keys are tame (``_ChunkCotangents``) is formed
    against the whole chunk as products of the chunk's factors."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    blocks = CHUNK // LOG_BLOCK
    chunks = q_ref.shape[0] // CHUNK
    query_refs = (q_ref, grad_ref, grad_den_ref, shift_ref)
    key_refs = (k_ref, v_ref, valid_ref)
    bound = factored_bound(form.width, CHUNK, form.dtype, matmul_dtype)
    chunk_form = _kernel_settings.IN_FORCE.diagonal_form == "chunk" and bound > -math.inf

    def chunk_step(c, totals):
        offset = c * CHUNK
        refs = (start_ref, state_ref, count_ref)
        tame = _ChunkCotangents(form, c, offset, key_refs, query_refs, refs, bound, matmul_dtype)
        highest = tame.highest() if chunk_form else None

        def block_rows(s, **refs):
            return _Rows(form, offset + s * LOG_BLOCK, **refs)

        def query_block(s, totals):  # dla of a block of queries, complete
            x = block_rows(s, queries=query_refs)

            def by_blocks():
                own = block_rows(s, keys=key_refs)
                grad_la = _diagonal_cotangents(form, x, own, matmul_dtype, of_queries=True)

                def earlier(e, grad_la):  # the keys of an earlier block of the chunk
                    y = block_rows(e, keys=key_refs)
                    query = jnp.exp(x.logs + y.block_max - x.shift)
                    key = jnp.exp(y.logs - y.block_max)
                    return grad_la + query * _dot(x.products(y, matmul_dtype), key, matmul_dtype)

                grad_la = jax.lax.fori_loop(0, s, earlier, grad_la)
                query = jnp.exp(x.logs + start_ref[c] - x.shift)  # the chunks before: their state
                read = _dot(x.grad, state_ref[c], matmul_dtype, transpose_b=True)
                return grad_la + query * (read + x.grad_den * count_ref[c])

            if chunk_form:
                keys = jax.lax.broadcasted_iota(jnp.int32, highest.shape, 0) < (s + 1) * LOG_BLOCK
                most = jnp.max(jnp.where(keys, highest, -jnp.inf))
                grad_la = jax.lax.cond(most <= bound, lambda: tame.of_queries(s, x), by_blocks)
            else:
                grad_la = by_blocks()
            return x.pulled_back(form, grad_la, dq_ref, totals)

        def key_block(e, totals):  # dlb and dv of a block of keys, complete
            y = block_rows(e, keys=key_refs)

            def by_blocks():
                x = block_rows(e, queries=query_refs)
                grad_lb, weights = _diagonal_cotangents(form, x, y, matmul_dtype, of_queries=False)
                grad_v = _dot(weights.T, x.grad, jnp.float32)
                key = jnp.exp(y.logs - y.block_max)  # against every later block

                def later(s, sums):  # the queries of a later block of the chunk
                    grad_lb, grad_v = sums
                    x = block_rows(s, queries=query_refs)
                    query = jnp.exp(x.logs + y.block_max - x.shift)
                    products = x.products(y, matmul_dtype)
                    grad_lb = grad_lb + key * _dot(products.T, query, matmul_dtype)
                    scores = _dot(query, key, matmul_dtype, transpose_b=True)
                    return grad_lb, grad_v + _dot(scores.T, x.grad, matmul_dtype)

                return jax.lax.fori_loop(e + 1, blocks, later, (grad_lb, grad_v))

            if chunk_form:
                keys = jax.lax.broadcasted_iota(jnp.int32, highest.shape, 0) // LOG_BLOCK == e
                most = jnp.max(jnp.where(keys, highest, -jnp.inf))
                grad_lb, grad_v = jax.lax.cond(most <= bound, lambda: tame.of_keys(e, y), by_blocks)
            else:
                grad_lb, grad_v = by_blocks()
            after = jnp.exp(y.logs - end_ref[c])  # the chunks after: their queries' summary
            later_read = _dot(y.v, later_ref[c], matmul_dtype, transpose_b=True)
            grad_lb = grad_lb + after * (later_read + later_count_ref[c] * y.ones.T)
            grad_v = grad_v + _dot(after, later_ref[c], matmul_dtype)
            dv_ref[y.index, :] = jnp.where(y.valid, grad_v, 0).astype(dv_ref.dtype)
            return y.pulled_back(form, jnp.where(y.valid, grad_lb, 0), dk_ref, totals)

        totals = jax.lax.fori_loop(0, blocks, query_block, totals)
        return jax.lax.fori_loop(0, blocks, key_block, totals)

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    grad_w, grad_b = jax.lax.fori_loop(0, chunks, chunk_step, zeros)
    dw_ref[...] = grad_w
    db_ref[...] = grad_b


@dataclasses.dataclass(frozen=True)
class _ChunkCotangents:
    """The cotangent kernel's chunk form (``diagonal_form="chunk"``) for chunk ``c`` (rows from
    ``offset``): relative to r = max(C^s, lb_0), the rows' factors exp(la_t + r - M_t) <= 1
    and the tame keys' exp(lb_j - r) <= e^``bound``, w_tji = their product, formed
    ``COTANGENT_TILE`` features at a time against all C positions of the chunk (selected for
    j <= t) and placed in their columns (``_placed``)."""

    form: _Form
    c: typing.Any
    offset: typing.Any
    key_refs: tuple
    query_refs: tuple
    refs: tuple  # the earlier chunks' start C^s, state S and count z
    bound: float
    matmul_dtype: typing.Any

    def _tiles(self):
        tile = tile_width(self.form.width, COTANGENT_TILE)
        return tile, self.form.width // tile

    def _features(self, i, tile):
        first = pl.multiple_of(i * tile, tile)
        return first, pl.ds(first, tile)

    def _span(self, rows: int = CHUNK):
        """The chunk's first ``rows`` positions (all C by default)."""
        return pl.ds(pl.multiple_of(self.offset, CHUNK), rows)

    def _valid(self, rows: int = CHUNK) -> jax.Array:
        """Whether each of the chunk's first ``rows`` keys counts ``(rows, 1)``."""
        return self.key_refs[2][self._span(rows), :] > 0

    def _key_logs(self, features, rows: int = CHUNK):
        """lb ``(rows, tile)`` of the chunk's first ``rows`` keys (the log floor for those left
        out), C^s and r."""
        k = self.key_refs[0][self._span(rows), :]
        floor = log_floor(self.form.dtype)
        lb = jnp.where(self._valid(rows), self.form.tile(k, features), floor)
        start = self.refs[0][self.c, :, features]
        return lb, start, _chunk_reference(start, lb)

    def highest(self) -> jax.Array:
        """max_i (lb_ji - r_i) ``(C, 1)`` of each key of the chunk (tame: <= ``bound``)."""
        tile, tiles = self._tiles()

        def step(i, highest):
            lb, _, reference = self._key_logs(self._features(i, tile)[1])
            return jnp.maximum(highest, jnp.max(lb - reference, axis=1, keepdims=True))

        return jax.lax.fori_loop(0, tiles, step, jnp.full((CHUNK, 1), -jnp.inf, jnp.float32))

    def of_queries(self, s, x: _Rows) -> jax.Array:
        """dla ``(B, m)`` of block ``s``'s queries ``x``: sum_{j <= t} w_tji D_tj over the
        chunk's keys, and the earlier chunks' state, exp(la_t + C^s - M_t) (S G_t + z g_t)."""
        _, state_ref, count_ref = self.refs
        valid = self._valid()
        values = jnp.where(valid, self.key_refs[1][self._span(), :].astype(self.form.dtype), 0)
        products = _dot(x.grad, values, self.matmul_dtype, transpose_b=True)
        products = products + x.grad_den * valid.astype(self.form.dtype).T
        rows = jax.lax.broadcasted_iota(jnp.int32, products.shape, 0) + s * LOG_BLOCK
        causal = jax.lax.broadcasted_iota(jnp.int32, products.shape, 1) <= rows
        products = jnp.where(causal, products, 0)
        tile, tiles = self._tiles()

        def step(i, grad_la):
            first, features = self._features(i, tile)
            lb, start, reference = self._key_logs(features)
            query = jnp.exp(self.form.tile(x.rows, features) + reference - x.shift)
            key = jnp.exp(jnp.minimum(lb - reference, self.bound))  # later keys selected away
            own = query * _dot(products, key, self.matmul_dtype)
            read = _dot(x.grad, state_ref[self.c, features, :], self.matmul_dtype, transpose_b=True)
            read = read + x.grad_den * count_ref[self.c, :, features]
            earlier = query * jnp.exp(start - reference) * read
            return grad_la + _placed(own + earlier, first, self.form.width)

        zeros = jnp.zeros((LOG_BLOCK, self.form.width), jnp.float32)
        return jax.lax.fori_loop(0, tiles, step, zeros)

    def of_keys(self, e, y: _Rows) -> tuple[jax.Array, jax.Array]:
        """(dlb ``(B, m)``, dv ``(B, P)``) of block ``e``'s keys ``y`` against the chunk's
        queries t >= j: sum_t w_tji D_tj and sum_t (sum_i w_tji) G_t."""
        q_ref, grad_ref, grad_den_ref, shift_ref = self.query_refs
        span = self._span()
        q, grad, shift = q_ref[span, :], grad_ref[span, :].astype(jnp.float32), shift_ref[span, :]
        products = _dot(grad, y.v, self.matmul_dtype, transpose_b=True)
        products = products + grad_den_ref[span, :].astype(jnp.float32) * y.ones
        keys = jax.lax.broadcasted_iota(jnp.int32, products.shape, 1) + e * LOG_BLOCK
        causal = jax.lax.broadcasted_iota(jnp.int32, products.shape, 0) >= keys
        products = jnp.where(causal, products, 0)
        tile, tiles = self._tiles()

        def step(i, sums):
            grad_lb, scores = sums
            first, features = self._features(i, tile)
            _, _, reference = self._key_logs(features, LOG_BLOCK)  # r needs the first key only
            lb = jnp.where(y.valid, self.form.tile(y.rows, features), log_floor(self.form.dtype))
            query = jnp.exp(self.form.tile(q, features) + reference - shift)
            key = jnp.exp(lb - reference)
            own = key * _dot(products.T, query, self.matmul_dtype)
            scores = scores + _dot(query, key, self.matmul_dtype, transpose_b=True)
            return grad_lb + _placed(own, first, self.form.width), scores

        zeros = (
            jnp.zeros((LOG_BLOCK, self.form.width), jnp.float32),
            jnp.zeros((CHUNK, LOG_BLOCK), jnp.float32),
        )
        grad_lb, scores = jax.lax.fori_loop(0, tiles, step, zeros)
        scores = jnp.where(causal, scores, 0)
        return grad_lb, _dot(scores.T, grad, self.matmul_dtype)


def readout_kernel(
    q_ref,
    w_ref,
    b_ref,
    shift_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    row_shift_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional read-out of a chunk of queries against the keys' state ``(m, P)``,
    ``(1, m)`` relative to their per-feature maximum c ``(1, m)``: numerator, denominator and
    row shifts M_t = max_i (la_ti + c_i)."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    logs = form(q_ref[...]) + shift_ref[...]
    row_shift = jnp.max(logs, axis=1, keepdims=True)
    query = jnp.exp(logs - row_shift)
    num_ref[...] = _dot(query, state_ref[...], matmul_dtype)
    den_ref[...] = jnp.sum(query * count_ref[...], axis=1, keepdims=True)
    row_shift_ref[...] = row_shift


def query_cotangent_kernel(
    q_ref,
    w_ref,
    b_ref,
    shift_ref,
    state_ref,
    count_ref,
    row_shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional queries' cotangents over a group of chunks: dla_t = exp(la_t + c - M_t)
    (S G_t + z g_t), pulled back to dq, and dW, db summed over the group."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    shift, state, count = shift_ref[...], state_ref[...], count_ref[...]

    def chunk_step(c, totals):
        rows = pl.ds(c * CHUNK, CHUNK)
        q = q_ref[rows, :]
        query = jnp.exp(form(q) + shift - row_shift_ref[rows, :])
        grad, grad_den = grad_ref[rows, :], grad_den_ref[rows, :]
        read = _dot(grad, state, matmul_dtype, transpose_b=True) + grad_den * count
        grad_la = query * read
        dq_ref[rows, :] = form.pullback(q, grad_la).astype(dq_ref.dtype)
        grad_w, grad_b = totals
        grad_w = grad_w + jnp.dot(grad_la.T, q.astype(jnp.float32))
        return grad_w, grad_b + jnp.sum(grad_la, axis=0, keepdims=True)

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    dw_ref[...], db_ref[...] = jax.lax.fori_loop(0, q_ref.shape[0] // CHUNK, chunk_step, zeros)


def key_cotangent_kernel(
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    shift_ref,
    grad_state_ref,
    grad_count_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional keys' cotangents over a group of chunks, from the state's (dS ``(m, P)``,
    dz ``(1, m)``): dlb_j = exp(lb_j - c) (dS v_j + dz), dv_j = dS^T exp(lb_j - c), pulled
    back to dk, and dW, db summed over the group."""
    form = _Form(w_ref, b_ref, spec.norm_weight, jnp.float32)
    shift, grad_state, grad_count = shift_ref[...], grad_state_ref[...], grad_count_ref[...]

    def chunk_step(c, totals):
        rows = pl.ds(c * CHUNK, CHUNK)
        k, valid = k_ref[rows, :], valid_ref[rows, :] > 0
        key = jnp.where(valid, jnp.exp(form(k) - shift), 0)
        values = jnp.where(valid, v_ref[rows, :].astype(jnp.float32), 0)
        read = _dot(values, grad_state, matmul_dtype, transpose_b=True) + grad_count
        # Selected, not multiplied by the keys' zero factors: rows whose denominator is floored
        # at the smallest normal number (no key counts) can make dS infinite, and 0 * inf = NaN.
        grad_lb = jnp.where(valid, key * read, 0)
        dk_ref[rows, :] = form.pullback(k, grad_lb).astype(dk_ref.dtype)
        grad_v = jnp.where(valid, _dot(key, grad_state, matmul_dtype), 0)
        dv_ref[rows, :] = grad_v.astype(dv_ref.dtype)
        grad_w, grad_b = totals
        grad_w = grad_w + jnp.dot(grad_lb.T, k.astype(jnp.float32))
        return grad_w, grad_b + jnp.sum(grad_lb, axis=0, keepdims=True)

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    dw_ref[...], db_ref[...] = jax.lax.fori_loop(0, k_ref.shape[0] // CHUNK, chunk_step, zeros)
