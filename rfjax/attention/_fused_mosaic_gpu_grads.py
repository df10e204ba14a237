"""The backward pass of bidirectional FAVOR in Mosaic GPU's idiom (``_fused_mosaic_gpu``'s
forward pass; ``_fused._bidirectional_backward`` under ``implementation="pallas_mosaic_gpu"``).

With the keys' per-feature maximum c, state S and count z (the forward's key summaries again)
and the forward's row shifts M_t, for the cotangents G_t of the numerator and g_t of the
denominator (one head; ``_fused_kernels``' ``query_summary_kernel``,
``query_cotangent_kernel`` and ``key_cotangent_kernel`` compute the same):

* ``query_summaries``: per chunk of queries, dS = sum_t exp(la_t + c - M_t) G_t^T and
  dz = sum_t exp(la_t + c - M_t) g_t (summed over the chunks in XLA);
* ``cotangents`` of the queries: dla_t = exp(la_t + c - M_t) (S G_t + z g_t);
* ``cotangents`` of the keys: dlb_j = exp(lb_j - c) (dS v_j + dz) for the valid keys, and
  dv_j = dS^T exp(lb_j - c).

Both cotangent passes run in one kernel, the features as rows (l^T = W_aug X_aug^T per tile of
64 features, as in the key summaries), the shift c folded into the bias of W_aug (b + c for
the queries, b - c for the keys). Each pulls its log-features' cotangents dl back through the
affine map: dW += dl^T x and db += sum_rows dl per chunk, dx = dl W + 2 g (sum_i dl_i) x, the
last term formed in XLA from the row sums the kernel returns. dl (float32) enters those
products as three bfloat16 parts, with x (bfloat16) and W's parts (the blocks of x_aug and W_aug)
in the pairs whose orders add up to at most 2, as the forward's projection: float32 accuracy
on the tensor cores. The factors and the state or the values enter the others in bfloat16, as
the generic kernels take them under a bfloat16 ``matmul_dtype``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rfjax._tensor_cores import bfloat16_parts
from rfjax.attention._fused_mosaic_gpu import (
    _COLUMN,
    _COLUMNS,
    _ROW,
    CHUNK,
    FEATURE_TILE,
    ONES_COLUMN,
    _block_width,
    _launch,
    _load,
    _padded_columns,
    _products,
    _smem,
    _store,
    augmented_rows,
    augmented_weights,
    check_rows,
    keys_state,
    projection,
)


def _query_summary_kernel(q_gmem, w_gmem, reference_gmem, grad_gmem, shift_gmem, grad_den_gmem,
                          sums_gmem, counts_gmem, **s):  # fmt: skip
    """One chunk of one head's queries: per tile of features, exp(l(Q)^T + r - M) (r the
    chunk's reference per feature) and its products with the cotangents G (the sums) and g
    (the counts)."""
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    rows = pl.ds(chunk * CHUNK, CHUNK)
    copies = [(q_gmem, "q"), (grad_gmem, "grad"), (shift_gmem, "shift"), (grad_den_gmem, "den")]
    _load([(source.at[head, rows], s[name]) for source, name in copies], s["barriers"])
    shift = plgpu.load(s["shift"], layout=_COLUMN)
    grad_den = plgpu.load(s["den"], layout=_COLUMN)
    for tile in range(w_gmem.shape[1] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        copies = [(w_gmem.at[head, features], s["w"])]
        copies += [(reference_gmem.at[head, chunk, features], s["reference"])]
        _load(copies, s["barriers"], 4)
        logs = _products(projection(s["q"], s["w"], features_first=True), (FEATURE_TILE, CHUNK))
        reference = plgpu.load(s["reference"], layout=_ROW)
        logs = logs + lax.broadcast_in_dim(reference, logs.shape, [0])
        factors = jnp.exp(logs - lax.broadcast_in_dim(shift, logs.shape, [1]))
        s["factors"][...] = factors.astype(jnp.bfloat16)
        plgpu.commit_smem()
        sums = _products([(s["factors"], s["grad"])], (FEATURE_TILE, grad_gmem.shape[-1]))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last tile's copies are out
        counts = jnp.sum(factors * lax.broadcast_in_dim(grad_den, logs.shape, [1]), axis=1)
        out = (head, chunk, features)
        _store([(s["count"], counts, counts_gmem.at[out]), (s["sums"], sums, sums_gmem.at[out])])
    plgpu.wait_smem_to_gmem(0)


class _Layout:
    """Where the cotangent kernel finds the parts: x in block 0 of x_aug, W part j in block j
    of W_aug (``augmented_rows``, ``augmented_weights``), and the products dl_i W_j it sums."""

    def __init__(self, head_dim: int):
        self.block = _block_width(head_dim)
        self.weight_products = [(i, j) for i in range(3) for j in range(3) if i + j <= 2]

    def columns(self, block: int):
        return pl.ds(block * self.block, self.block)

    def last_columns(self):
        """W_aug's last block: b's parts and the ones (``ONES_COLUMN``)."""
        return pl.ds(3 * self.block, _COLUMNS)


def _cotangent_kernel(*refs, layout: _Layout, with_values: bool, scopes, **s):
    """One chunk of one head's rows (queries or keys): per tile of features, the cotangents dl
    of the log-features, their sums dW and db over the chunk, and over the tiles dx (without
    the norm term), the row sums of dl and (keys) dv. The tiles' buffers and dv's staging are
    scoped apart (``scopes``), so that they share their shared memory."""
    (x_gmem, w_gmem, state_gmem, count_gmem, values_gmem, weight_gmem, shift_gmem, keep_gmem,
     dx_gmem, rowsum_gmem, *dv_gmem, dw_gmem, db_gmem) = refs  # fmt: skip
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    rows = pl.ds(chunk * CHUNK, CHUNK)
    copies = [(weight_gmem, "weight"), (shift_gmem, "shift"), (keep_gmem, "keep")]
    _load([(source.at[head, rows], s[name]) for source, name in copies], s["barriers"])
    columns = {name: plgpu.load(s[name], layout=_COLUMN) for name in ("weight", "shift", "keep")}

    def tiles(**t):
        t = s | t
        _load(
            [(x_gmem.at[head, rows], t["x"]), (values_gmem.at[head, rows], t["values"])],
            s["barriers"],
        )
        shapes = [(CHUNK, layout.block), (CHUNK, _COLUMNS)]  # dx, the row sums
        shapes += [(CHUNK, values_gmem.shape[-1])] if with_values else []  # dv
        sums = [plgpu.layout_cast(jnp.zeros(x, jnp.float32), plgpu.Layout.WGMMA) for x in shapes]
        for tile in range(w_gmem.shape[1] // FEATURE_TILE):
            features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
            copies = [(w_gmem, "w"), (state_gmem, "state"), (count_gmem, "count")]
            _load([(x.at[head, features], t[name]) for x, name in copies], s["barriers"])
            grads, tile_sums = _tile_cotangents(columns, layout, with_values, t)
            sums = [a + b for a, b in zip(sums, tile_sums, strict=True)]
            store_parameters(grads, layout, t, db_gmem, dw_gmem, (head, chunk, features))
        # The last tile's dW and db are read out of buffers whose memory the next phase reuses.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        return sums

    dx, rowsum, *dv = pl.run_scoped(tiles, **scopes["tiles"])

    def end(**staging):
        others = [
            (staging["dv"], x, out.at[head, rows]) for x, out in zip(dv, dv_gmem, strict=True)
        ]
        store_rows(s, dx, rowsum, (dx_gmem, rowsum_gmem), (head, rows), others)

    pl.run_scoped(end, **scopes["end"])


def _tile_cotangents(columns, layout: _Layout, with_values: bool, s):
    """One tile of features: dl^T ``(FEATURE_TILE, CHUNK)`` (its parts stored for the
    products), and its terms of dx, of the row sums (every column) and (keys) of dv."""
    shape = (FEATURE_TILE, CHUNK)
    logs = _products(projection(s["x"], s["w"], features_first=True), shape)
    kept = lax.broadcast_in_dim(columns["keep"] > 0, shape, [1])
    shift = lax.broadcast_in_dim(columns["shift"], shape, [1])
    factors = jnp.where(kept, jnp.exp(logs - shift), 0)
    read = _products([(s["state"], s["values"].transpose((1, 0)))], shape)
    count = plgpu.load(s["count"], layout=_ROW)
    weight = lax.broadcast_in_dim(columns["weight"], shape, [1])
    read = read + lax.broadcast_in_dim(count, shape, [0]) * weight
    # Selected, not multiplied by the zero factors of masked keys: dS may be infinite where no
    # key counts, and 0 * inf = NaN (as the generic kernels select).
    grads = jnp.where(kept, factors * read, 0)
    if with_values:
        s["factors"][...] = factors.astype(jnp.bfloat16)
    dx, rowsum = pulled_back(grads, layout, s)
    if not with_values:
        return grads, (dx, rowsum)
    dv = _products([(s["factors"].transpose((1, 0)), s["state"])], (CHUNK, s["values"].shape[1]))
    return grads, (dx, rowsum, dv)


def pulled_back(grads: jax.Array, layout: _Layout, s) -> tuple[jax.Array, jax.Array]:
    """dl^T ``(FEATURE_TILE, CHUNK)`` of one tile pulled back through W: its three bfloat16
    parts stored (``s["grads"]``) and committed with what the caller stored before, then the
    tile's terms of dx ``(CHUNK, Hb)`` (without the norm term: sum_ij dl_i W_j) and of the
    row sums of dl (in column ``ONES_COLUMN`` of the products with W_aug's last block)."""
    for i, part in enumerate(bfloat16_parts(grads)):
        s["grads"][i] = part
    plgpu.commit_smem()
    transposed = [s["grads"].at[i].transpose((1, 0)) for i in range(3)]
    weight_parts = [
        (transposed[i], s["w"].at[:, layout.columns(j)]) for i, j in layout.weight_products
    ]
    dx = _products(weight_parts, (CHUNK, layout.block))
    ones = s["w"].at[:, layout.last_columns()]
    rowsum = _products([(t, ones) for t in transposed], (CHUNK, _COLUMNS))
    return dx, rowsum


def store_parameters(grads: jax.Array, layout: _Layout, s, db_gmem, dw_gmem, at) -> None:
    """One tile's db (the row sums of dl^T) and dW over the chunk (``_dw``, from the parts
    ``pulled_back`` stored and the rows ``s["x"]``) out to ``db_gmem.at[at]`` and
    ``dw_gmem.at[at]``, once the last tile's copies are out."""
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    _store(
        [
            (s["db"], jnp.sum(grads, axis=1), db_gmem.at[at]),
            (s["dw"], _dw(layout, s), dw_gmem.at[at]),
        ]
    )


def store_rows(s, dx, rowsum, targets, at, others=()) -> None:
    """The chunk's dx (through dW's staging buffer: FEATURE_TILE = CHUNK rows) and row sums
    (column ``ONES_COLUMN`` of ``rowsum``) out to ``targets`` (dx, row sums) ``.at[at]``, with
    ``others`` (``(shared, value, global)``), and the wait for all of them."""
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    dx_gmem, rowsum_gmem = targets
    column = plgpu.broadcasted_iota(jnp.int32, rowsum.shape, 1, layout=plgpu.Layout.WGMMA)
    outputs = [
        (s["dw"], dx, dx_gmem.at[at]),
        (
            s["rowsum"],
            jnp.sum(jnp.where(column == ONES_COLUMN, rowsum, 0), axis=1),
            rowsum_gmem.at[at],
        ),
        *others,
    ]
    _store(outputs)
    plgpu.wait_smem_to_gmem(0)


def _dw(layout: _Layout, s) -> jax.Array:
    """dW of the tile over the chunk: sum_i dl_i^T x from the stored parts of dl^T."""
    pairs = [(s["grads"].at[i], s["x"].at[:, layout.columns(0)]) for i in range(3)]
    return _products(pairs, (FEATURE_TILE, layout.block))


def query_summaries(
    queries, weights, grad, shift, grad_den, reference=None, *, interpret: bool = False
):
    """Per head and chunk: sum_t exp(la_t + c + r - M_t) G_t^T ``(N, n, m, P)`` and
    sum_t exp(la_t + c + r - M_t) g_t ``(N, n, m)``, from x_aug of the queries ``(N, T, K)``,
    W_aug with b + c ``(N, m, K)``, G ``(N, T, P)`` bfloat16, M and g ``(N, T)`` float32, and
    the chunks' references r ``(N, n, m)`` (``None``: 0)."""
    heads, length, width = queries.shape
    count, value_width = weights.shape[1], grad.shape[-1]
    scratch = dict(
        q=_smem((CHUNK, width), jnp.bfloat16),
        grad=_smem((CHUNK, value_width), jnp.bfloat16),
        shift=plgpu.SMEM((CHUNK,), jnp.float32),
        den=plgpu.SMEM((CHUNK,), jnp.float32),
        w=_smem((FEATURE_TILE, weights.shape[-1]), jnp.bfloat16),
        reference=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        factors=_smem((FEATURE_TILE, CHUNK), jnp.bfloat16),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        sums=plgpu.SMEM((FEATURE_TILE, value_width), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=6),
    )
    chunks = length // CHUNK
    if reference is None:
        reference = jnp.zeros((heads, chunks, count), jnp.float32)
    shapes = [(heads, chunks, count, value_width), (heads, chunks, count)]
    return _launch(
        _query_summary_kernel,
        (queries, weights, reference, grad, shift, grad_den),
        shapes,
        scratch,
        heads=heads,
        chunks=chunks,
        interpret=interpret,
    )


def cotangents(
    rows, weights, state, count, values, weight, shift, keep, *, layout, with_values, interpret
):
    """Per head: dx without the norm term ``(N, T, Hb)``, the row sums of dl ``(N, T)``,
    (``with_values``) dv ``(N, T, P)``, and per chunk dW ``(N, n, m, Hb)`` and db
    ``(N, n, m)`` (Hb: H rounded up to 64)."""
    heads, length, width = rows.shape
    count_features, value_width, block = weights.shape[1], values.shape[-1], layout.block
    scratch = dict(
        weight=plgpu.SMEM((CHUNK,), jnp.float32),
        shift=plgpu.SMEM((CHUNK,), jnp.float32),
        keep=plgpu.SMEM((CHUNK,), jnp.float32),
        dw=plgpu.SMEM((FEATURE_TILE, block), jnp.float32),
        rowsum=plgpu.SMEM((CHUNK,), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=3),
    )
    tiles = dict(
        x=_smem((CHUNK, width), jnp.bfloat16),
        values=_smem((CHUNK, value_width), jnp.bfloat16),
        w=_smem((FEATURE_TILE, weights.shape[-1]), jnp.bfloat16),
        state=_smem((FEATURE_TILE, value_width), jnp.bfloat16),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        grads=_smem((3, FEATURE_TILE, CHUNK), jnp.bfloat16),
        db=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
    )
    end = {}
    if with_values:
        tiles["factors"] = _smem((FEATURE_TILE, CHUNK), jnp.bfloat16)
        end["dv"] = plgpu.SMEM((CHUNK, value_width), jnp.float32)
    chunks = length // CHUNK
    shapes = [(heads, length, block), (heads, length)]
    shapes += [(heads, length, value_width)] if with_values else []
    shapes += [(heads, chunks, count_features, block), (heads, chunks, count_features)]
    kernel = functools.partial(
        _cotangent_kernel,
        layout=layout,
        with_values=with_values,
        scopes=dict(tiles=tiles, end=end),
    )
    return _launch(
        kernel,
        (rows, weights, state, count, values, weight, shift, keep),
        shapes,
        scratch,
        heads=heads,
        chunks=chunks,
        interpret=interpret,
    )


@functools.partial(jax.jit, static_argnames=("norm_weight", "interpret"))
def bidirectional_cotangents(
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
    """The cotangents of ``bidirectional_sums`` for N heads, from those of its numerator
    ``grad`` ``(N, T, P)`` and denominator ``grad_den`` ``(N, T)`` and its row shifts
    ``row_shift`` ``(N, T)``: (dW ``(N, m, H)``, db ``(N, m)``, dq, dk, dv), float32.
    The arguments as ``bidirectional_sums`` takes them."""
    layout, queries, keys, values, grads, keep = operands(
        query, key, value, valid, grad, norm_weight
    )
    top, state, count = keys_state(keys, values, keep, weights, bias, interpret=interpret)
    query_weights = augmented_weights(weights, bias + top)
    sums, counts = query_summaries(
        queries, query_weights, grads, row_shift, grad_den, interpret=interpret
    )
    run = functools.partial(cotangents, layout=layout, interpret=interpret)
    of_queries = run(
        queries,
        query_weights,
        state.astype(jnp.bfloat16),
        count,
        grads,
        grad_den,
        row_shift,
        jnp.ones_like(row_shift),
        with_values=False,
    )
    of_keys = run(
        keys,
        augmented_weights(weights, bias - top),
        jnp.sum(sums, axis=1).astype(jnp.bfloat16),
        jnp.sum(counts, axis=1),
        values,
        keep,
        jnp.zeros_like(keep),
        keep,
        with_values=True,
    )
    return finished_cotangents(of_queries, of_keys, query, key, value, valid, norm_weight)


class Operands(NamedTuple):
    """What both directions' cotangent kernels take of the rows: the layout of the parts, x_aug
    of the queries and keys (``augmented_rows``), the values and G as bfloat16 padded to 64
    columns, and the valid keys as float32."""

    layout: _Layout
    queries: jax.Array
    keys: jax.Array
    values: jax.Array
    grads: jax.Array
    keep: jax.Array


def operands(query, key, value, valid, grad, norm_weight: float) -> Operands:
    """The rows as the cotangent kernels take them (``Operands``), checked first
    (``check_rows``)."""
    check_rows(query, key, value.shape[-1])
    return Operands(
        _Layout(query.shape[-1]),
        augmented_rows(query, norm_weight),
        augmented_rows(key, norm_weight),
        _padded_columns(value.astype(jnp.bfloat16)),
        _padded_columns(grad.astype(jnp.bfloat16)),
        valid.astype(jnp.float32),
    )


def finished_cotangents(of_queries, of_keys, query, key, value, valid, norm_weight: float):
    """(dW, db, dq, dk, dv) from the queries' kernel's (dx, row sums, dW, db per chunk) and the
    keys' (dx, row sums, dv, dW, db per chunk): the norm term 2 g (sum_i dl_i) x added to dx,
    the padding dropped, dv 0 for the keys that do not count, dW and db summed over the
    chunks."""
    dq, q_sums, dw_q, db_q = of_queries
    dk, k_sums, dv, dw_k, db_k = of_keys
    head_dim, norm = query.shape[-1], 2.0 * norm_weight
    dq = dq[..., :head_dim] + norm * q_sums[..., None] * query.astype(jnp.float32)
    dk = dk[..., :head_dim] + norm * k_sums[..., None] * key.astype(jnp.float32)
    dv = jnp.where(valid[..., None], dv[..., : value.shape[-1]], 0)
    dw = jnp.sum(dw_q, axis=1) + jnp.sum(dw_k, axis=1)
    return dw[..., :head_dim], jnp.sum(db_q, axis=1) + jnp.sum(db_k, axis=1), dq, dk, dv
