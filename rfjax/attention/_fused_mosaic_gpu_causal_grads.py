"""The backward pass of causal FAVOR in Mosaic GPU's idiom (``_fused_mosaic_gpu_causal``'s
forward pass, with the same references u_c at each chunk's end and the forward's row shifts
S_t).

One head; rows t and keys j of chunk c, features i; the query factors a_ti =
exp(la_ti + u_ci - S_t), the key factors b_ji = exp(lb_ji - u_ci) (0 for keys that do not
count), the cotangents G_t of the numerator and g_t of the denominator, and
D_tj = G_t . v_j + g_t for j <= t in the chunk:

* ``query_summaries`` (``_fused_mosaic_gpu_grads``'s, with the chunks' references): per chunk
  Q_c = sum_t a_t G_t^T and q_c = sum_t a_t g_t; then, by a reversed scan in XLA, the later
  chunks' L_c = sum_{c' > c} exp(u_c - u_c') Q_c' (and l_c likewise), every factor <= 1;
* the queries' kernel: dla_ti = a_ti (S_c[i] . G_t + z_c[i] g_t + sum_j b_ji D_tj), S_c and
  z_c the earlier keys' state and count relative to u_c (the forward's ``references``);
* the keys' kernel: dlb_ji = b_ji (L_c[i] . v_j + l_c[i] + sum_{t >= j} a_ti D_tj) and
  dv_j = sum_i b_ji L_c[i] + sum_{t >= j} (sum_i a_ti b_ji) G_t.

Each kernel holds the chunk's queries and keys (the factors of both enter either), features as
rows as in ``_fused_mosaic_gpu_grads``, whose pullback through the affine map it shares
(``pulled_back``: dx = dl W + 2 g (sum_i dl_i) x, the last term in XLA; dW and db per chunk).
Where the forward's sums are exact (the head is tame: ``_fused_mosaic_gpu_causal``), every term
that counts keeps both factors above e^-L here too, and the cotangents are those of the
stabilised form, to the bfloat16 operands' rounding (the factors, G, the states, D).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rfjax.attention._fused_mosaic_gpu import (
    _COLUMN,
    _ROW,
    CHUNK,
    FEATURE_TILE,
    _launch,
    _load,
    _products,
    _smem,
    augmented_weights,
    key_summaries,
    projection,
)
from rfjax.attention._fused_mosaic_gpu_causal import References, chunk_states_at_ends, references
from rfjax.attention._fused_mosaic_gpu_grads import (
    _Layout,
    finished_cotangents,
    operands,
    pulled_back,
    query_summaries,
    store_parameters,
    store_rows,
)


def _tile_factors(s, w_gmem, per_chunk, at, shift: jax.Array, valid: jax.Array):
    """One tile's query factors a^T and key factors b^T ``(FEATURE_TILE, CHUNK)`` (features as
    rows) from the chunk's queries ``s["q"]``, keys ``s["k"]`` and the tile of W_aug, loaded
    with the chunk's tiles ``per_chunk`` (``(global, name)``, the references u first) at
    ``at`` (head, chunk, features)."""
    loads = [(source.at[at], s[name]) for source, name in per_chunk]
    _load([(w_gmem.at[at[2]], s["w"]), *loads], s["barriers"])
    shape = (FEATURE_TILE, CHUNK)
    reference = lax.broadcast_in_dim(plgpu.load(s["end"], layout=_ROW), shape, [0])
    query_logs = _products(projection(s["q"], s["w"], features_first=True), shape)
    query = jnp.exp(query_logs + reference - lax.broadcast_in_dim(shift, shape, [1]))
    key_logs = _products(projection(s["k"], s["w"], features_first=True), shape)
    counts = lax.broadcast_in_dim(valid, shape, [1])
    return query, jnp.where(counts, jnp.exp(key_logs - reference), 0)


# The kernels' first operands, the chunk's rows, by the names of their buffers.
_ROW_OPERANDS = ("q", "k", "v", "valid", "grad", "den", "shift")


def _rows_in(s, refs, at, names: tuple[str, ...]) -> None:
    """The chunk's rows ``names`` (of ``_ROW_OPERANDS``) at ``at`` (head, rows) into their
    buffers."""
    _load([(refs[_ROW_OPERANDS.index(name)].at[at], s[name]) for name in names], s["barriers"])


def _columns(s) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(S, g and the valid keys) as columns, from their buffers."""
    valid = plgpu.load(s["valid"], layout=_COLUMN) > 0
    shift = plgpu.load(s["shift"], layout=_COLUMN)
    return shift, plgpu.load(s["den"], layout=_COLUMN), valid


def _score_cotangents(s, grad_den: jax.Array) -> None:
    """D^T ``(CHUNK keys, CHUNK rows)``, D_tj = G_t . v_j + g_t for j <= t (0 elsewhere), into
    ``s["scores"]`` as bfloat16, from the chunk's values and G in their buffers. Keys that do
    not count are not masked here (a broadcast of the mask along the rows fails the layout
    inference): their factors are 0 wherever D enters, and their D_tj = g_t (their values are
    0) is finite."""
    shape = (CHUNK, CHUNK)
    scores = _products([(s["v"], s["grad"].transpose((1, 0)))], shape)
    scores = scores + lax.broadcast_in_dim(grad_den, shape, [1])
    key = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
    row = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
    s["scores"][...] = jnp.where(key <= row, scores, 0).astype(jnp.bfloat16)
    plgpu.commit_smem()


def _query_kernel(*refs, layout: _Layout, scopes, **s):
    """One chunk of one head: the queries' dla per tile of features, pulled back (dx without
    the norm term, the row sums of dla, dW and db per chunk). The values enter only the
    chunk's scores D, so their buffer is scoped to those, and dW's staging buffer to the tiles
    (``scopes``): the two share their shared memory."""
    at = (lax.axis_index("heads"), pl.ds(lax.axis_index("chunks") * CHUNK, CHUNK))
    _rows_in(s, refs, at, ("q", "k", "valid", "grad", "den", "shift"))
    columns = _columns(s)

    def scores(**values):
        _rows_in(s | values, refs, at, ("v",))
        _score_cotangents(s | values, columns[1])

    pl.run_scoped(scores, **scopes["values"])
    pl.run_scoped(lambda **t: _query_tiles(refs, layout, s | t, columns), **scopes["tiles"])


def _query_tiles(refs, layout: _Layout, s, columns) -> None:
    """The query kernel's loop over the tiles of features (dW and db stored per tile), then
    its dx and row sums stored."""
    shift, grad_den, valid = columns
    w_gmem, end_gmem, state_gmem, count_gmem = refs[7:11]
    dx_gmem, rowsum_gmem, dw_gmem, db_gmem = refs[11:]
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    shape = (FEATURE_TILE, CHUNK)
    sums = [
        plgpu.layout_cast(jnp.zeros(x, jnp.float32), plgpu.Layout.WGMMA)
        for x in ((CHUNK, layout.block), (CHUNK, FEATURE_TILE))
    ]
    for tile in range(w_gmem.shape[0] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        per_chunk = [(end_gmem, "end"), (state_gmem, "state"), (count_gmem, "count")]
        query, key = _tile_factors(s, w_gmem, per_chunk, (head, chunk, features), shift, valid)
        s["key_factors"][...] = key.astype(jnp.bfloat16)
        plgpu.commit_smem()
        read = _products(
            [(s["state"], s["grad"].transpose((1, 0))), (s["key_factors"], s["scores"])], shape
        )
        count = lax.broadcast_in_dim(plgpu.load(s["count"], layout=_ROW), shape, [0])
        grads = query * (read + count * lax.broadcast_in_dim(grad_den, shape, [1]))
        tile_sums = pulled_back(grads, layout, s | {"x": s["q"]})
        sums = [a + b for a, b in zip(sums, tile_sums, strict=True)]
        store_parameters(
            grads, layout, s | {"x": s["q"]}, db_gmem, dw_gmem, (head, chunk, features)
        )
    dx, rowsum = sums
    store_rows(s, dx, rowsum, (dx_gmem, rowsum_gmem), (head, pl.ds(chunk * CHUNK, CHUNK)))


def _key_kernel(*refs, layout: _Layout, scopes, **s):
    """One chunk of one head: the keys' dlb per tile of features, pulled back (dx without the
    norm term, the row sums of dlb, dW and db per chunk), and dv, in phases whose buffers are
    scoped to them (``scopes``), so that they share the shared memory: the values and the
    chunk's scores D (``"rows"``), within them G for D (``"scores"``) and then the tiles'
    buffers (``"tiles"``); after them G again and the staging of dx and dv (``"end"``)."""
    at = (lax.axis_index("heads"), pl.ds(lax.axis_index("chunks") * CHUNK, CHUNK))
    _rows_in(s, refs, at, ("valid", "den", "shift"))
    columns = _columns(s)

    def rows(**values_and_scores):
        t = s | values_and_scores
        _rows_in(t, refs, at, ("v",))

        def scores(**grad):
            _rows_in(t | grad, refs, at, ("grad",))
            _score_cotangents(t | grad, columns[1])

        pl.run_scoped(scores, **scopes["scores"])
        return pl.run_scoped(
            lambda **u: _key_tiles(refs, layout, t | u, columns), **scopes["tiles"]
        )

    dx, rowsum, dv, scores = pl.run_scoped(rows, **scopes["rows"])
    key = plgpu.broadcasted_iota(jnp.int32, scores.shape, 0, layout=plgpu.Layout.WGMMA)
    row = plgpu.broadcasted_iota(jnp.int32, scores.shape, 1, layout=plgpu.Layout.WGMMA)
    s["query_factors"][...] = jnp.where(key <= row, scores, 0).astype(jnp.bfloat16)
    plgpu.commit_smem()
    dx_gmem, rowsum_gmem, dv_gmem = refs[11:14]

    def end(**t):
        _rows_in(s | t, refs, at, ("grad",))
        full = dv + _products([(s["query_factors"], t["grad"])], dv.shape)
        others = [(t["dv"], full, dv_gmem.at[at])]
        store_rows(s | t, dx, rowsum, (dx_gmem, rowsum_gmem), at, others)

    pl.run_scoped(end, **scopes["end"])


def _key_tiles(refs, layout: _Layout, s, columns):
    """The key kernel's loop over the tiles of features: (dx, the row sums, dv without the
    chunk's own scores' term, the chunk's scores A^T (keys, rows)), dW and db stored per
    tile."""
    shift, _, valid = columns
    w_gmem, end_gmem, later_gmem, later_count_gmem = refs[7:11]
    dw_gmem, db_gmem = refs[14:]
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    _rows_in(s, refs, (head, pl.ds(chunk * CHUNK, CHUNK)), ("q", "k"))
    shape, width = (FEATURE_TILE, CHUNK), refs[13].shape[-1]
    sums = [
        plgpu.layout_cast(jnp.zeros(x, jnp.float32), plgpu.Layout.WGMMA)
        for x in ((CHUNK, layout.block), (CHUNK, FEATURE_TILE), (CHUNK, width), (CHUNK, CHUNK))
    ]
    for tile in range(w_gmem.shape[0] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        per_chunk = [(end_gmem, "end"), (later_gmem, "later"), (later_count_gmem, "count")]
        query, key = _tile_factors(s, w_gmem, per_chunk, (head, chunk, features), shift, valid)
        s["query_factors"][...] = query.astype(jnp.bfloat16)
        s["key_factors"][...] = key.astype(jnp.bfloat16)
        plgpu.commit_smem()
        read = _products(
            [
                (s["later"], s["v"].transpose((1, 0))),
                (s["query_factors"], s["scores"].transpose((1, 0))),
            ],
            shape,
        )
        count = lax.broadcast_in_dim(plgpu.load(s["count"], layout=_ROW), shape, [0])
        grads = jnp.where(lax.broadcast_in_dim(valid, shape, [1]), key * (read + count), 0)
        keys = s["key_factors"].transpose((1, 0))
        values = _products([(keys, s["later"])], (CHUNK, width))
        scores = _products([(keys, s["query_factors"])], (CHUNK, CHUNK))
        tile_sums = (*pulled_back(grads, layout, s | {"x": s["k"]}), values, scores)
        sums = [a + b for a, b in zip(sums, tile_sums, strict=True)]
        store_parameters(
            grads, layout, s | {"x": s["k"]}, db_gmem, dw_gmem, (head, chunk, features)
        )
    # The last tile's dW and db are read out of buffers whose memory the next phase reuses.
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    return tuple(sums)


def _scratch(rows_width: int, weights_width: int, value_width: int, block: int, *, keys: bool):
    """The shared memory of either kernel: (the whole kernel's, the buffers scoped to a phase
    of it, ``{phase: {name: type}}``: ``_query_kernel``, ``_key_kernel``)."""
    rows = _smem((CHUNK, rows_width), jnp.bfloat16)
    values = _smem((CHUNK, value_width), jnp.bfloat16)
    grad = _smem((CHUNK, value_width), jnp.bfloat16)
    state = _smem((FEATURE_TILE, value_width), jnp.bfloat16)
    dw = plgpu.SMEM((FEATURE_TILE, block), jnp.float32)
    tiles = dict(
        q=rows,
        k=rows,
        w=_smem((FEATURE_TILE, weights_width), jnp.bfloat16),
        end=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        key_factors=_smem((FEATURE_TILE, CHUNK), jnp.bfloat16),
        grads=_smem((3, FEATURE_TILE, CHUNK), jnp.bfloat16),
        db=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
    )
    kernel = dict(
        valid=plgpu.SMEM((CHUNK,), jnp.float32),
        den=plgpu.SMEM((CHUNK,), jnp.float32),
        shift=plgpu.SMEM((CHUNK,), jnp.float32),
        rowsum=plgpu.SMEM((CHUNK,), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=6),
    )
    scores = _smem((CHUNK, CHUNK), jnp.bfloat16)
    if not keys:
        kernel |= tiles | dict(grad=grad, scores=scores, state=state)
        return kernel, dict(values=dict(v=values), tiles=dict(dw=dw))
    kernel |= dict(query_factors=_smem((FEATURE_TILE, CHUNK), jnp.bfloat16))
    scopes = dict(
        rows=dict(v=values, scores=scores),
        scores=dict(grad=grad),
        tiles=tiles | dict(later=state, dw=dw),
        end=dict(grad=grad, dw=dw, dv=plgpu.SMEM((CHUNK, value_width), jnp.float32)),
    )
    return kernel, scopes


@functools.partial(jax.jit, static_argnames=("norm_weight", "interpret"))
def causal_cotangents(
    weights,
    bias,
    query,
    key,
    value,
    valid,
    row_shift,
    grad,
    grad_den,
    *,
    norm_weight: float,
    interpret: bool = False,
):
    """The cotangents of ``_fused_mosaic_gpu_causal.causal_sums`` for N heads, from those of its
    numerator ``grad`` ``(N, T, P)`` and denominator ``grad_den`` ``(N, T)`` and its row shifts
    ``row_shift`` ``(N, T)``: (dW ``(N, m, H)``, db ``(N, m)``, dq, dk, dv), float32, exact
    where the head is tame. The arguments as ``causal_sums`` takes them."""
    layout, queries, keys, values, grads, keep = operands(
        query, key, value, valid, grad, norm_weight
    )
    augmented = augmented_weights(weights, bias)
    summaries = key_summaries(keys, values, keep, augmented, interpret=interpret)
    chunks = references(summaries, key, valid, weights, bias, norm_weight)
    heads = query.shape[0]
    per_head = jnp.broadcast_to(augmented, (heads, *augmented.shape))
    sums, counts = query_summaries(
        queries, per_head, grads, row_shift, grad_den, chunks.end, interpret=interpret
    )
    later, later_counts = _later(chunks, sums, counts)
    rows = (queries, keys, values, keep, grads, grad_den, row_shift)
    of_queries = _run(
        _query_kernel,
        (*rows, augmented, chunks.end, chunks.state, chunks.counts),
        layout,
        keys=False,
        interpret=interpret,
    )
    of_keys = _run(
        _key_kernel,
        (*rows, augmented, chunks.end, later.astype(jnp.bfloat16), later_counts),
        layout,
        keys=True,
        interpret=interpret,
    )
    return finished_cotangents(of_queries, of_keys, query, key, value, valid, norm_weight)


def _later(chunks: References, sums, counts):
    """(L ``(N, n, m, P)``, l ``(N, n, m)``): per chunk c the later chunks' query summaries,
    sum_{c' > c} exp(u_c - u_c') Q_c', relative to u_c (factors <= 1), by the reversed scan
    (``chunk_states_at_ends``; each chunk's summary taken to its start)."""
    decays = jnp.exp(chunks.earlier - chunks.end)
    summaries = jnp.concatenate([sums, counts[..., None]], axis=-1) * decays[..., None]
    later, _ = chunk_states_at_ends(summaries, chunks.earlier, chunks.end, reverse=True)
    return later[..., :-1], later[..., -1]


def _run(kernel, operands, layout: _Layout, *, keys: bool, interpret: bool):
    """``kernel`` (the queries' or the keys' one) over every (head, chunk): dx ``(N, T, Hb)``,
    the row sums ``(N, T)``, (keys) dv ``(N, T, P)``, dW ``(N, n, m, Hb)``, db ``(N, n, m)``."""
    queries, _, values, *_ = operands
    weights = operands[7]
    heads, length, width = queries.shape
    features, value_width = weights.shape[0], values.shape[-1]
    chunks = length // CHUNK
    shapes = [(heads, length, layout.block), (heads, length)]
    shapes += [(heads, length, value_width)] if keys else []
    shapes += [(heads, chunks, features, layout.block), (heads, chunks, features)]
    scratch, scopes = _scratch(width, weights.shape[-1], value_width, layout.block, keys=keys)
    return _launch(
        functools.partial(kernel, layout=layout, scopes=scopes),
        operands,
        shapes,
        scratch,
        heads=heads,
        chunks=chunks,
        interpret=interpret,
    )
