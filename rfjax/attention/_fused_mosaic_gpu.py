"""Bidirectional fused FAVOR kernels in Pallas' Mosaic GPU idiom (sm90+; ``_fused``'s forward
pass under ``implementation="pallas_mosaic_gpu"``).

The generic kernels of ``_fused_kernels`` (``pl.pallas_call`` with block specs, ``jnp.dot`` on
values) compile for Triton and Mosaic TPU, not for Mosaic GPU: there a kernel copies its tiles
to shared memory itself (TMA), multiplies on the tensor cores by warpgroup MMAs (``plgpu.wgmma``,
64 rows, bfloat16 operands accumulated in float32) and broadcasts per-row and per-column vectors
in the MMA's register layout. These two kernels compute what ``key_summary_kernel`` and
``readout_kernel`` do, for the affine maps l(x) = x W^T + b + g |x|^2 (FAVOR+, its antithetic
variant, OPRF), one program per (head, chunk of ``CHUNK`` rows), over tiles of ``FEATURE_TILE``
features:

* ``key_summaries``: a chunk's per-feature key maximum d, sum_j exp(lb_j - d) v_j^T and
  sum_j exp(lb_j - d); the features as rows (l(K)^T = W_aug K_aug^T per tile), so that
  the per-feature maximum is a row maximum;
* ``readout``: with the per-feature maximum c of all keys, the numerator sum_i exp(la_ti + c_i -
  M_t) S_i, the denominator sum_i exp(la_ti + c_i - M_t) z_i and the row shift M_t =
  max_i (la_ti + c_i), the features of a tile at a time with a running maximum (as flash
  attention runs over keys).

The affine map is one sum of MMAs: its bias and norm term are folded into the product (a
broadcast of g |x|^2 breaks Mosaic GPU's layout inference). Rows become x_aug = [x, 1, 1, 1,
t1, t2, t3, 0...] and the weights W_aug = [W parts, b1, b2, b3, 1, 1, 1, 0...], where the
parts of each float32 number are bfloat16 numbers summing exactly to it (``bfloat16_parts``:
W1 + W2 + W3 = W, b1 + b2 + b3 = b, t1 + t2 + t3 = g |x|^2). The rows are bfloat16 (the kernels
take nothing else: ``check_rows``): ``favor_attention`` passes bfloat16 inputs' rows unscaled
and folds the data normaliser into the map instead, l(s x) = x (s W)^T + b + s^2 g |x|^2 with
s = H^-1/4 (``_fused._head_rows``), because s x needs three bfloat16 parts where x is one:
less than half the rows' shared memory, half the products with W. l(x) is the sum of the
products of x's block with each W part's block and of the two last blocks (``projection``: the
operands are slices of the shared-memory tiles). Every product is exact and the sum is in
float32, so l(x) has float32's accuracy on any GPU (a bfloat16 W would put an error of 2^-9
|x||w| into each log-feature, 0.2 at norm 100). Each block is H rounded up to 64 columns (a
128-byte swizzle tile: every block may be an MMA operand of its own), and the bias and norm
term take a last block of 64; the values are padded to a multiple of 64 columns too (narrower
ones fail the layout inference). The read-out's weights carry b + c in place of b, so M_t is
the maximum of the augmented product's row.

Operands of the second products: the key factors exp(lb - d), the query factors and the state
S enter them in bfloat16, as ``_fused_kernels._dot`` casts them under a bfloat16
``matmul_dtype``; the denominators are float32 sums of the float32 factors. What the kernels
take (bfloat16 inputs, the affine maps, m a multiple of 64) is checked
before anything is traced for them (``_fused.check_fusable``), and the rows and widths before
the kernels are (``check_rows``). The backward pass's kernels, from the row shifts M_t of this
forward: ``_fused_mosaic_gpu_grads``.

Causal attention: ``_fused_mosaic_gpu_causal`` (forward) and ``_fused_mosaic_gpu_causal_grads``
(backward). They cannot take the Triton kernels' row shifts M_t (``_fused_kernels._row_shift``:
the row's largest exponent over the keys j <= t, a maximum running along a chunk's keys):
Mosaic GPU lowers no scan (``lax.cummax``,
``jnp.cumsum``: "Unimplemented primitive in Pallas Mosaic GPU lowering ... Warpgroup", JAX
0.12.0.1), and a loop over the chunk's keys with a masked row maximum fails the layout
inference once each key's log-features are read from a row of shared memory as a vector over
the features (in a ``fori_loop`` and unrolled alike). They take references at each chunk's
end instead, and say where those are exact.

Testing: on CPU in Mosaic GPU's interpret mode (``plgpu.InterpretGPUParams``) against the
generic kernels and the float64 reference, and lowered for an abstract H100
(``lowering_platforms=("cuda",)``), which runs the Mosaic GPU lowering and layout inference.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rfjax._tensor_cores import bfloat16_parts, mma_transforms
from rfjax.attention._checks import log_floor, vary_like

CHUNK = 64  # rows per program: the M of one warpgroup MMA
FEATURE_TILE = 64  # features per MMA (the keys' M, the queries' N)
_COLUMNS = 64  # the augmented rows' width is a multiple of this (a 128-byte swizzle of bf16)
# The widest heads and values the kernels take together, (H, P): at these every program of
# bidirectional and causal attention, both passes, fits an sm90 block's 227 KiB of shared
# memory; at (128, 256) the causal ones and at (256, 64) the backward's exceed it (Mosaic GPU's
# lowering says so, 2026-12-01).
FITTING_WIDTHS = ((64, 256), (128, 128))
_ROW = plgpu.Layout.WGMMA.reduce(1)  # a vector with one entry per row of an MMA's result
_COLUMN = plgpu.Layout.WGMMA.reduce(0)  # one entry per column


def _block_width(head_dim: int) -> int:
    """The columns of x's block of x_aug and of a W part's block of W_aug: H rounded up to a
    multiple of 64, so that every block starts on a swizzle tile and a kernel may take it as
    an MMA operand of its own."""
    return -(-head_dim // _COLUMNS) * _COLUMNS


def augmented_width(head_dim: int, parts: int) -> int:
    """The width of x_aug (``parts = 1``) and of W_aug (``parts = 3``): a block per part and 64
    columns for the bias and the norm term."""
    return parts * _block_width(head_dim) + _COLUMNS


def _blocks(parts: list[jax.Array], width: int) -> list[jax.Array]:
    """Each of ``parts`` padded with zeros to ``width`` columns."""
    return [jnp.pad(p, [(0, 0)] * (p.ndim - 1) + [(0, width - p.shape[-1])]) for p in parts]


def _joined(columns: list[jax.Array], width: int) -> jax.Array:
    joined = jnp.concatenate(columns, axis=-1)
    return jnp.pad(joined, [(0, 0)] * (joined.ndim - 1) + [(0, width - joined.shape[-1])])


def augmented_rows(x: jax.Array, norm_weight: float) -> jax.Array:
    """x ``(..., T, H)`` bfloat16 -> x_aug ``(..., T, K)`` bfloat16: x (a block), then 1, 1,
    1, the parts of g |x|^2 and zeros."""
    squared = jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    ones = jnp.ones_like(squared, jnp.bfloat16)
    columns = [*_blocks([x], _block_width(x.shape[-1])), ones, ones, ones]
    columns += bfloat16_parts(norm_weight * squared)
    return _joined(columns, augmented_width(x.shape[-1], 1))


def augmented_weights(weights: jax.Array, bias: jax.Array) -> jax.Array:
    """W ``(m, H)``, b ``(..., m)`` -> W_aug ``(..., m, K)`` bfloat16: W's three parts (a
    block each), then b's parts, 1, 1, 1 and zeros (a leading axis of b, e.g. heads, is
    W_aug's)."""
    weights = jnp.broadcast_to(weights.astype(jnp.float32), (*bias.shape[:-1], *weights.shape))
    bias = bias.astype(jnp.float32)[..., None]
    ones = jnp.ones_like(bias, jnp.bfloat16)
    parts = _blocks(bfloat16_parts(weights), _block_width(weights.shape[-1]))
    columns = [*parts, *bfloat16_parts(bias), ones, ones, ones]
    return _joined(columns, augmented_width(weights.shape[-1], 3))


# W_aug's last block holds b's three parts, then three columns of ones (the norm term's): the
# product of a tile with that block has the tile's row sums in this column.
ONES_COLUMN = 3


def projection_blocks(weights_width: int) -> list[tuple[int, int, int]]:
    """(x_aug's first column, W_aug's first column, width) of the blocks whose products sum to
    x_aug W_aug^T: x's block with each W part's, and the bias and norm blocks; the blocks'
    width read from W_aug's (``augmented_width``)."""
    block = (weights_width - _COLUMNS) // 3
    return [*[(0, j * block, block) for j in range(3)], (block, 3 * block, _COLUMNS)]


def projection(rows, weights, *, features_first: bool = False) -> list:
    """The (lhs, rhs) pairs of shared-memory operands whose products sum to l = x_aug W_aug^T
    ``(rows, features)``, or to l^T ``(features, rows)`` with ``features_first``: slices of
    the ``rows`` and ``weights`` refs (``projection_blocks``)."""
    slices = [
        (rows.at[:, pl.ds(row, width)], weights.at[:, pl.ds(weight, width)])
        for row, weight, width in projection_blocks(weights.shape[-1])
    ]
    if features_first:
        return [(w, x.transpose((1, 0))) for x, w in slices]
    return [(x, w.transpose((1, 0))) for x, w in slices]


def check_rows(query: jax.Array, key: jax.Array, value_width: int) -> None:
    """``ValueError``, before anything is compiled, for rows other than bfloat16 (x_aug holds
    one bfloat16 part of x: ``augmented_rows``) and for a head and value width past every pair
    of ``FITTING_WIDTHS``: the widths whose programs fit an sm90 block's shared memory, as
    Mosaic GPU's lowering found (wider ones exceed it: ``test_fused_mosaic_gpu``)."""
    for name, rows in (("query", query), ("key", key)):
        if rows.dtype != jnp.bfloat16:
            raise ValueError(
                f"the Mosaic GPU kernels take bfloat16 rows; got {name} of {rows.dtype} "
                f"(favor_attention folds H^-1/4 into the map: _fused._head_rows)"
            )
    check_widths(query.shape[-1], value_width)


def check_widths(head_dim: int, value_width: int) -> None:
    """``ValueError``, before anything is traced, for a head and value width past every pair of
    ``FITTING_WIDTHS`` (``check_rows``; ``_fused.check_fusable`` asks it from the inputs'
    shapes, so that ``"auto"`` keeps the XLA form for such a call). ``head_dim``: before or after
    the kernels' padding to a power of two, which leaves it within the same (power-of-two)
    bounds."""
    if not any(head_dim <= most_h and value_width <= most_p for most_h, most_p in FITTING_WIDTHS):
        fitting = " or ".join(f"(H, P) = ({h}, {p})" for h, p in FITTING_WIDTHS)
        raise ValueError(
            f"the Mosaic GPU kernels (implementation='pallas_mosaic_gpu', and its interpret "
            f"mode) take heads of H dimensions and values of P at most {fitting} (their "
            f"programs' shared memory on sm90); got head_dim = "
            f"{head_dim} (favor_attention pads H to a power of two) and value width "
            f"{value_width}: use implementation='pallas_triton' or 'xla'"
        )


def _smem(shape: tuple[int, ...], dtype) -> Any:
    """A shared-memory MMA operand, tiled and swizzled for its minor width."""
    return plgpu.SMEM(shape, dtype, transforms=mma_transforms(shape[-1], dtype))


def _products(pairs, shape: tuple[int, int]) -> jax.Array:
    """The sum of lhs @ rhs over ``pairs`` of shared-memory refs, in one float32 accumulator."""

    def run(acc_ref):
        for lhs, rhs in pairs:
            plgpu.wgmma(acc_ref, lhs, rhs)
        plgpu.wgmma_wait(0)
        return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _load(copies, barriers, first: int = 0) -> None:
    """The TMA copies ``(global, shared)`` of ``copies`` on barriers ``first``, ``first + 1``...,
    then the waits for all of them."""
    for i, (source, target) in enumerate(copies):
        plgpu.copy_gmem_to_smem(source, target, barriers.at[first + i])
    for i in range(len(copies)):
        plgpu.barrier_wait(barriers.at[first + i])


def _store(values) -> None:
    """``(shared, value, global)`` of ``values``: each value into its shared buffer, then the
    TMA copies of the buffers out (the caller waits for them before reusing the buffers)."""
    for target, value, _ in values:
        target[...] = value
    plgpu.commit_smem()
    for source, _, target in values:
        plgpu.copy_smem_to_gmem(source, target)


def _key_kernel(k_gmem, v_gmem, valid_gmem, w_gmem, top_gmem, sums_gmem, counts_gmem, **s):
    """One chunk of one head's keys: per tile of features, l(K)^T, its row maxima d, the
    factors exp(l - d) of the valid keys, their row sums and their product with the values."""
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    rows = pl.ds(chunk * CHUNK, CHUNK)
    copies = [(k_gmem, s["k"]), (v_gmem, s["v"]), (valid_gmem, s["valid"])]
    _load([(source.at[head, rows], target) for source, target in copies], s["barriers"])
    valid = plgpu.load(s["valid"], layout=_COLUMN) > 0
    for tile in range(w_gmem.shape[0] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        _load([(w_gmem.at[features], s["w"])], s["barriers"], 3)
        logs = _products(projection(s["k"], s["w"], features_first=True), (FEATURE_TILE, CHUNK))
        keep = lax.broadcast_in_dim(valid, logs.shape, [1])
        logs = jnp.where(keep, logs, log_floor(jnp.float32))
        top = jnp.max(logs, axis=1)
        factors = jnp.where(keep, jnp.exp(logs - lax.broadcast_in_dim(top, logs.shape, [0])), 0)
        s["factors"][...] = factors.astype(jnp.bfloat16)
        plgpu.commit_smem()
        sums = _products([(s["factors"], s["v"])], (FEATURE_TILE, v_gmem.shape[-1]))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last tile's copies are out
        out = (head, chunk, features)
        _store(
            [
                (s["top"], top, top_gmem.at[out]),
                (s["count"], jnp.sum(factors, axis=1), counts_gmem.at[out]),
                (s["sums"], sums, sums_gmem.at[out]),
            ]
        )
    plgpu.wait_smem_to_gmem(0)


def _readout_kernel(q_gmem, w_gmem, state_gmem, count_gmem, num_gmem, den_gmem, shift_gmem, **s):
    """One chunk of one head's queries against the keys' state, a tile of features at a time:
    the running row maximum M, and the numerator and denominator rescaled to it."""
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    rows = pl.ds(chunk * CHUNK, CHUNK)
    _load([(q_gmem.at[head, rows], s["q"])], s["barriers"])
    width = num_gmem.shape[-1]
    shift = plgpu.layout_cast(jnp.full((CHUNK,), -jnp.inf, jnp.float32), _ROW)
    den = plgpu.layout_cast(jnp.zeros((CHUNK,), jnp.float32), _ROW)
    num = plgpu.layout_cast(jnp.zeros((CHUNK, width), jnp.float32), plgpu.Layout.WGMMA)
    for tile in range(w_gmem.shape[1] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        copies = [(w_gmem, s["w"]), (state_gmem, s["state"]), (count_gmem, s["count"])]
        _load([(source.at[head, features], target) for source, target in copies], s["barriers"], 1)
        logs = _products(projection(s["q"], s["w"]), (CHUNK, FEATURE_TILE))
        new_shift = jnp.maximum(shift, jnp.max(logs, axis=1))
        rescale = jnp.exp(shift - new_shift)
        factors = jnp.exp(logs - lax.broadcast_in_dim(new_shift, logs.shape, [0]))
        count = plgpu.load(s["count"], layout=_COLUMN)
        weighted = factors * lax.broadcast_in_dim(count, logs.shape, [1])
        den = den * rescale + jnp.sum(weighted, axis=1)
        num = num * lax.broadcast_in_dim(rescale, num.shape, [0])
        s["factors"][...] = factors.astype(jnp.bfloat16)
        plgpu.commit_smem()
        num = num + _products([(s["factors"], s["state"])], num.shape)
        shift = new_shift
    outputs = [(num, "num", num_gmem), (den, "den", den_gmem), (shift, "shift", shift_gmem)]
    _store([(s[name], value, target.at[head, rows]) for value, name, target in outputs])
    plgpu.wait_smem_to_gmem(0)


def _launch(body, operands, out_shapes, scratch, *, heads: int, chunks: int, interpret: bool):
    """``body`` over a grid of (head, chunk) programs, with float32 outputs of ``out_shapes``.
    Inside ``shard_map`` the outputs are cast to vary over the mesh axes the operands vary over
    (``plgpu.kernel`` drops that type from its outputs; ``_fused.Backend.call`` gives it to the
    generic kernels'): a cotangent must have its primal's type."""
    outputs = plgpu.kernel(
        body,
        out_type=[jax.ShapeDtypeStruct(shape, jnp.float32) for shape in out_shapes],
        grid=(heads, chunks),
        grid_names=("heads", "chunks"),
        scratch_types=scratch,
        interpret=plgpu.InterpretGPUParams() if interpret else False,
    )(*operands)
    return [vary_like(x, operands) for x in outputs]


def key_summaries(keys, values, valid, weights, *, interpret: bool = False):
    """Per head and chunk: the key maxima d ``(N, n, m)``, sum_j exp(lb_j - d) v_j^T
    ``(N, n, m, P)`` and sum_j exp(lb_j - d) ``(N, n, m)``.

    Args:
      keys: x_aug of the keys ``(N, S, K)`` bfloat16 (``augmented_rows``), S a multiple of
        ``CHUNK``.
      values: ``(N, S, P)`` bfloat16, zero where not valid.
      valid: ``(N, S)`` float32, 1 for the keys that count.
      weights: W_aug ``(m, K)`` bfloat16 (``augmented_weights``), m a multiple of
        ``FEATURE_TILE``.
      interpret: run in Mosaic GPU's interpret mode.
    """
    heads, length, width = keys.shape
    count, value_width = weights.shape[0], values.shape[-1]
    chunks = length // CHUNK
    scratch = dict(
        k=_smem((CHUNK, width), jnp.bfloat16),
        v=_smem((CHUNK, value_width), jnp.bfloat16),
        valid=plgpu.SMEM((CHUNK,), jnp.float32),
        w=_smem((FEATURE_TILE, weights.shape[-1]), jnp.bfloat16),
        factors=_smem((FEATURE_TILE, CHUNK), jnp.bfloat16),
        top=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        sums=plgpu.SMEM((FEATURE_TILE, value_width), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=4),
    )
    shapes = [(heads, chunks, count), (heads, chunks, count, value_width), (heads, chunks, count)]
    return _launch(
        _key_kernel,
        (keys, values, valid, weights),
        shapes,
        scratch,
        heads=heads,
        chunks=chunks,
        interpret=interpret,
    )


def readout(queries, weights, state, count, *, interpret: bool = False):
    """Per head: the numerator ``(N, T, P)``, denominator ``(N, T)`` and row shifts ``(N, T)``
    of the queries against the keys' state.

    Args:
      queries: x_aug of the queries ``(N, T, K)`` bfloat16, T a multiple of ``CHUNK``.
      weights: W_aug with b + c in place of b, per head ``(N, m, K)`` bfloat16.
      state: S ``(N, m, P)`` bfloat16, relative to the keys' per-feature maximum c.
      count: z ``(N, m)`` float32, likewise.
      interpret: run in Mosaic GPU's interpret mode.
    """
    heads, length, width = queries.shape
    value_width = state.shape[-1]
    scratch = dict(
        q=_smem((CHUNK, width), jnp.bfloat16),
        w=_smem((FEATURE_TILE, weights.shape[-1]), jnp.bfloat16),
        state=_smem((FEATURE_TILE, value_width), jnp.bfloat16),
        factors=_smem((CHUNK, FEATURE_TILE), jnp.bfloat16),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        num=plgpu.SMEM((CHUNK, value_width), jnp.float32),
        den=plgpu.SMEM((CHUNK,), jnp.float32),
        shift=plgpu.SMEM((CHUNK,), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=4),
    )
    shapes = [(heads, length, value_width), (heads, length), (heads, length)]
    return _launch(
        _readout_kernel,
        (queries, weights, state, count),
        shapes,
        scratch,
        heads=heads,
        chunks=length // CHUNK,
        interpret=interpret,
    )


def keys_state(keys, values, valid, weights, bias, *, interpret: bool):
    """(c ``(N, m)``, S ``(N, m, P)``, z ``(N, m)``): every key's state relative to the
    per-feature maximum c, from the chunks' key summaries (``key_summaries``) combined in XLA.
    ``keys`` x_aug ``(N, S, K)``, ``values`` ``(N, S, P)`` bfloat16 (P a multiple of 64),
    ``valid`` ``(N, S)`` float32."""
    tops, sums, counts = key_summaries(
        keys, values, valid, augmented_weights(weights, bias), interpret=interpret
    )
    top = jnp.max(tops, axis=1)
    rescale = jnp.exp(tops - top[:, None])
    return top, jnp.sum(sums * rescale[..., None], axis=1), jnp.sum(counts * rescale, axis=1)


@functools.partial(jax.jit, static_argnames=("norm_weight", "interpret"))
def bidirectional_sums(
    weights, bias, query, key, value, valid, *, norm_weight: float, interpret: bool = False
):
    """FAVOR's bidirectional sums for N heads through the two kernels: (numerator ``(N, T, P)``,
    denominator ``(N, T)``, row shifts ``(N, T)``), as ``_fused._bidirectional_forward`` forms
    them per head. T and S multiples of ``CHUNK``, m of ``FEATURE_TILE``; query and key
    bfloat16 (``check_rows``); values, zero where not valid, enter as bfloat16; valid
    ``(N, S)`` bool."""
    value_width = value.shape[-1]
    check_rows(query, key, value_width)
    keys = augmented_rows(key, norm_weight)
    values = _padded_columns(value.astype(jnp.bfloat16))
    valid = valid.astype(jnp.float32)
    top, state, count = keys_state(keys, values, valid, weights, bias, interpret=interpret)
    query_weights = augmented_weights(weights, bias + top)
    queries = augmented_rows(query, norm_weight)
    num, den, shift = readout(
        queries, query_weights, state.astype(jnp.bfloat16), count, interpret=interpret
    )
    return num[..., :value_width], den, shift


def _padded_width(width: int) -> int:
    """A value width padded to a multiple of 64 (narrower values fail Mosaic GPU's layout
    inference, as of JAX 0.12)."""
    return -(-width // _COLUMNS) * _COLUMNS


def _padded_columns(x: jax.Array) -> jax.Array:
    """Columns padded with zeros to ``_padded_width``."""
    width = _padded_width(x.shape[-1])
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])
