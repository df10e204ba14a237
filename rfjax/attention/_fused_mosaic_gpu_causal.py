"""Causal FAVOR's forward pass in Pallas' Mosaic GPU idiom (sm90+; ``_fused.fused_attention``
under ``implementation="pallas_mosaic_gpu"`` with ``causal=True``), for the affine maps
l(x) = x W^T + b + g |x|^2 (FAVOR+, its antithetic variant, OPRF).

References at each chunk's end. The Triton kernels shift each row by M_t, the row's largest
exponent over its keys j <= t, a maximum running along a chunk's keys that Mosaic GPU cannot
form (``_fused_mosaic_gpu``'s docstring). Here every chunk c of ``CHUNK`` positions takes the
per-feature maximum u_c of all the valid keys up to its end (earlier chunks' and its own: the
running maximum of the key summaries' maxima d), and the kernel, one program per (head,
chunk), forms for its rows t and keys j, a tile of ``FEATURE_TILE`` features at a time:

* the query factors exp(la_t + u_c - S_t) and the key factors exp(lb_j - u_c), both <= 1, with
  S_t = max_i (la_ti + u_ci) kept as a running maximum over the tiles (as the bidirectional
  read-out does);
* the earlier chunks' part: the factors times the state of their keys relative to u_c
  (sum_j exp(lb_j - u_c) v_j, and the count), from a scan over the key summaries in XLA;
* the chunk's own part: the scores, the query factors times the key factors, masked to j <= t
  and to the valid keys, times the values.

So S_t >= M_t (no exponential overflows). The kernel also forms a lower bound on M_t,
R_t = max_i (la_ti + r_ti), r the per-feature maximum of keys the row certainly attends to:
the earlier chunks' (u of the chunk before) and, for the rows at or after it, the chunk's first
valid key (its log-features in float32 in XLA, ``references``). Where S_t - R_t is at most
``_log_chunk.factored_bound`` (43.7 in float32 and bfloat16: L / 2, L = -ln of the smallest
normal number) on every row that attends to a key, a term of at least e^-43.7 of its row's
largest (the others weigh less than float32's epsilon together, up to T m = 10^12) has both
factors above e^-L: nothing that counts underflows, and the sums are exact to the products'
rounding. Such a head is "tame" (rows of |x'| = |x| H^-1/4 up to about 8 are; at 40 they are
not: ``test_fused_mosaic_gpu_causal``); where a head is not, the whole call runs the generic
kernels (``_fused._mosaic_gpu_causal``: one ``lax.cond`` over every head, decided outside
their ``vmap`` so that only one branch runs), forward and backward.

Gradients: ``_fused_mosaic_gpu_causal_grads``, from the same references, at every width the
forward takes. The forward kernel fits an sm90 block's shared memory at every width
``_fused_mosaic_gpu.FITTING_WIDTHS`` allows (its scores reuse the query factors' buffer, its
lower bounds the flags').

Testing: interpret mode against the float64 reference and the XLA form, the fallback at
norm 120, and the lowering for an abstract H100 (``test_fused_mosaic_gpu_causal``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rfjax.attention._checks import log_floor
from rfjax.attention._chunks import chunk_states
from rfjax.attention._fused_mosaic_gpu import (
    _COLUMN,
    _ROW,
    CHUNK,
    FEATURE_TILE,
    _launch,
    _load,
    _padded_columns,
    _products,
    _smem,
    _store,
    augmented_rows,
    augmented_weights,
    check_rows,
    key_summaries,
    projection,
)
from rfjax.attention._log_chunk import factored_bound


def _causal_kernel(q_gmem, k_gmem, v_gmem, valid_gmem, after_gmem, w_gmem, end_gmem, state_gmem,
                   count_gmem, earlier_gmem, first_gmem, num_gmem, den_gmem, shift_gmem,
                   lower_gmem, **s):  # fmt: skip
    """One chunk of one head: the numerator, denominator and row shifts S of its rows against
    the earlier chunks' state and its own keys, all relative to the chunk's references u, and
    the rows' lower bounds R on their largest exponents (``_lower_bound``)."""
    head, chunk = lax.axis_index("heads"), lax.axis_index("chunks")
    rows = pl.ds(chunk * CHUNK, CHUNK)
    copies = [(q_gmem, "q"), (k_gmem, "k"), (v_gmem, "v"), (valid_gmem, "valid")]
    copies += [(after_gmem, "after")]
    _load([(source.at[head, rows], s[name]) for source, name in copies], s["barriers"])
    key_valid = plgpu.load(s["valid"], layout=_ROW) > 0
    shift, earlier, first = (
        plgpu.layout_cast(jnp.full((CHUNK,), -jnp.inf, jnp.float32), _ROW) for _ in range(3)
    )
    den = plgpu.layout_cast(jnp.zeros((CHUNK,), jnp.float32), _ROW)
    sums = [  # the numerator and the chunk's own scores
        plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)
        for shape in ((CHUNK, num_gmem.shape[-1]), (CHUNK, CHUNK))
    ]
    for tile in range(w_gmem.shape[0] // FEATURE_TILE):
        features = pl.ds(tile * FEATURE_TILE, FEATURE_TILE)
        copies = [(end_gmem, "end"), (state_gmem, "state"), (count_gmem, "count")]
        copies += [(earlier_gmem, "earlier"), (first_gmem, "first")]
        loads = [(source.at[head, chunk, features], s[name]) for source, name in copies]
        _load([(w_gmem.at[features], s["w"]), *loads], s["barriers"], 5)
        end = plgpu.load(s["end"], layout=_COLUMN)
        query_logs = _products(projection(s["q"], s["w"]), (CHUNK, FEATURE_TILE))
        earlier = jnp.maximum(earlier, _row_max(query_logs, s["earlier"]))
        first = jnp.maximum(first, _row_max(query_logs, s["first"]))
        logs = query_logs + lax.broadcast_in_dim(end, query_logs.shape, [1])
        new_shift = jnp.maximum(shift, jnp.max(logs, axis=1))
        rescale = jnp.exp(shift - new_shift)
        query_factors = jnp.exp(logs - lax.broadcast_in_dim(new_shift, logs.shape, [0]))
        count = plgpu.load(s["count"], layout=_COLUMN)
        weighted = query_factors * lax.broadcast_in_dim(count, logs.shape, [1])
        den = den * rescale + jnp.sum(weighted, axis=1)
        key_logs = _products(projection(s["k"], s["w"]), (CHUNK, FEATURE_TILE))
        key_logs = jnp.where(
            lax.broadcast_in_dim(key_valid, logs.shape, [0]),
            key_logs - lax.broadcast_in_dim(end, logs.shape, [1]),
            log_floor(jnp.float32),
        )
        s["query_factors"][...] = query_factors.astype(jnp.bfloat16)
        s["key_factors"][...] = jnp.exp(key_logs).astype(jnp.bfloat16)
        plgpu.commit_smem()
        products = [
            [(s["query_factors"], s["state"])],
            [(s["query_factors"], s["key_factors"].transpose((1, 0)))],
        ]
        sums = [
            x * lax.broadcast_in_dim(rescale, x.shape, [0]) + _products(pairs, x.shape)
            for x, pairs in zip(sums, products, strict=True)
        ]
        shift = new_shift
    num, scores = sums
    row = plgpu.broadcasted_iota(jnp.int32, scores.shape, 0, layout=plgpu.Layout.WGMMA)
    column = plgpu.broadcasted_iota(jnp.int32, scores.shape, 1, layout=plgpu.Layout.WGMMA)
    scores = jnp.where(row >= column, scores, 0.0)  # the valid keys' factors only are not 0
    den = den + jnp.sum(scores, axis=1)
    s["query_factors"][...] = scores.astype(jnp.bfloat16)  # the factors' buffer is free
    plgpu.commit_smem()
    num = num + _products([(s["query_factors"], s["v"])], num.shape)
    after = plgpu.load(s["after"], layout=_ROW) > 0
    lower = jnp.where(after, jnp.maximum(earlier, first), earlier)
    outputs = [(num, "num", num_gmem), (den, "den", den_gmem), (shift, "shift", shift_gmem)]
    outputs += [(lower, "after", lower_gmem)]  # the flags, read: its own buffer passes 227 KiB
    _store([(s[name], value, target.at[head, rows]) for value, name, target in outputs])
    plgpu.wait_smem_to_gmem(0)


def _row_max(logs: jax.Array, reference) -> jax.Array:
    """max_i (la_ti + r_i) over a tile of features, per row, r from the shared-memory
    ``reference``."""
    column = plgpu.load(reference, layout=_COLUMN)
    return jnp.max(logs + lax.broadcast_in_dim(column, logs.shape, [1]), axis=1)


def causal_readout(queries, keys, values, valid, weights, references, *, interpret=False):
    """Per head: the numerator ``(N, T, P)``, denominator ``(N, T)`` and row shifts S
    ``(N, T)`` of causal attention, relative to the chunks' references, and the rows' lower
    bounds R ``(N, T)`` on their largest exponents.

    Args:
      queries, keys: x_aug ``(N, T, K)`` bfloat16 (``augmented_rows``), T a multiple of
        ``CHUNK``.
      values: ``(N, T, P)`` bfloat16, zero where not valid, P a multiple of 64.
      valid: ``(N, T)`` float32, 1 for the keys that count.
      weights: W_aug ``(m, K)`` bfloat16 (``augmented_weights``).
      references: ``References`` of the chunks (``references``).
      interpret: run in Mosaic GPU's interpret mode.
    """
    heads, length, width = queries.shape
    value_width = values.shape[-1]
    scratch = dict(
        q=_smem((CHUNK, width), jnp.bfloat16),
        k=_smem((CHUNK, width), jnp.bfloat16),
        v=_smem((CHUNK, value_width), jnp.bfloat16),
        valid=plgpu.SMEM((CHUNK,), jnp.float32),
        after=plgpu.SMEM((CHUNK,), jnp.float32),
        w=_smem((FEATURE_TILE, weights.shape[-1]), jnp.bfloat16),
        end=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        state=_smem((FEATURE_TILE, value_width), jnp.bfloat16),
        count=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        earlier=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        first=plgpu.SMEM((FEATURE_TILE,), jnp.float32),
        query_factors=_smem((CHUNK, FEATURE_TILE), jnp.bfloat16),
        key_factors=_smem((CHUNK, FEATURE_TILE), jnp.bfloat16),
        num=plgpu.SMEM((CHUNK, value_width), jnp.float32),
        den=plgpu.SMEM((CHUNK,), jnp.float32),
        shift=plgpu.SMEM((CHUNK,), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=11),
    )
    shapes = [(heads, length, value_width)] + [(heads, length)] * 3
    rows = (queries, keys, values, valid, references.after_first)
    per_chunk = (references.end, references.state, references.counts)
    per_chunk += (references.earlier, references.first)
    return _launch(
        _causal_kernel,
        (*rows, weights, *per_chunk),
        shapes,
        scratch,
        heads=heads,
        chunks=length // CHUNK,
        interpret=interpret,
    )


class References(NamedTuple):
    """What the kernel takes of each of the N heads' n chunks besides the rows (m features,
    P value columns).

    Attributes:
      end: u ``(N, n, m)``, the running maximum of the valid keys' log-features through the
        chunk: its references.
      state: the earlier chunks' keys' state relative to u ``(N, n, m, P)`` bfloat16.
      counts: their count relative to u ``(N, n, m)``.
      earlier: the earlier chunks' valid keys' maximum ``(N, n, m)`` (the floor for none).
      first: the log-features of the chunk's first valid key ``(N, n, m)`` (the floor for
        none), float32 products in XLA.
      after_first: ``(N, T)`` float32, 1 for the rows at or after their chunk's first valid
        key.
    """

    end: jax.Array
    state: jax.Array
    counts: jax.Array
    earlier: jax.Array
    first: jax.Array
    after_first: jax.Array


def references(summaries, key, valid, weights, bias, norm_weight: float) -> References:
    """The chunks' ``References`` from their key summaries (``key_summaries``: the maxima d,
    the sums and counts relative to d) by a scan over the summaries in XLA
    (``_chunks.chunk_states``), and from the keys ``(N, T, H)``, ``valid`` ``(N, T)`` bool and
    the map (W, b, g)."""
    tops, sums, counts = summaries
    end = lax.cummax(tops, axis=1)
    floor = jnp.full_like(tops[:, :1], log_floor(jnp.dtype(jnp.float32)))
    earlier = jnp.concatenate([floor, end[:, :-1]], axis=1)
    states, decays = chunk_states_at_ends(
        jnp.concatenate([sums, counts[..., None]], axis=-1) * jnp.exp(tops - end)[..., None],
        earlier,
        end,
    )
    states = states * decays[..., None]  # from each chunk's start to its end
    heads, length, _ = key.shape
    per_chunk = valid.reshape(heads, length // CHUNK, CHUNK)
    first = jnp.argmax(per_chunk, axis=-1)  # the first valid key's place (0 for none)
    rows = jnp.take_along_axis(key.reshape(*per_chunk.shape, -1), first[..., None, None], 2)
    rows = rows[:, :, 0].astype(jnp.float32)
    products = jnp.matmul(rows, weights.T, precision=lax.Precision.HIGHEST)  # never TF32
    logs = products + bias + norm_weight * jnp.sum(rows * rows, -1, keepdims=True)
    has_key = jnp.any(per_chunk, axis=-1)
    after_first = has_key[..., None] & (jnp.arange(CHUNK) >= first[..., None])
    return References(
        end=end,
        state=states[..., :-1].astype(jnp.bfloat16),
        counts=states[..., -1],
        earlier=earlier,
        first=jnp.where(has_key[..., None], logs, floor),
        after_first=after_first.reshape(heads, length).astype(jnp.float32),
    )


def chunk_states_at_ends(summaries, earlier, end, *, reverse: bool = False):
    """(states ``(N, n, m, p)``, decays ``(N, n, m)``): ``_chunks.chunk_states`` over the
    chunks (axis 1) of per-chunk ``summaries`` ``(N, n, m, p)`` relative to each chunk's end
    ``end``, with the decays exp(earlier - end) from each chunk's start (the previous end,
    ``earlier``) to its end: the state of the earlier chunks relative to each chunk's start,
    or (``reverse``, with the summaries relative to the chunk's start) of the later chunks
    relative to each chunk's end."""
    decays = jnp.exp(earlier - end)
    initial = jnp.zeros_like(summaries[:, 0])
    states, _ = chunk_states(
        jnp.moveaxis(summaries, 1, 0), jnp.moveaxis(decays, 1, 0), initial, reverse=reverse
    )
    return jnp.moveaxis(states, 0, 1), decays


def tame_bound(features: int, length: int) -> float:
    """The largest S_t - R_t at which the kernel's sums are exact:
    ``_log_chunk.factored_bound`` for m features, T keys, float32 and bfloat16 factors."""
    return factored_bound(features, length, jnp.float32, jnp.bfloat16)


@functools.partial(jax.jit, static_argnames=("norm_weight", "interpret"))
def causal_sums(
    weights, bias, query, key, value, valid, *, norm_weight: float, interpret: bool = False
):
    """Causal FAVOR's sums for N heads through the key summaries' kernel and ``causal_readout``:
    (numerator ``(N, T, P)``, denominator ``(N, T)``, row shifts S ``(N, T)``, excess ``(N,)``),
    relative to the row shifts; excess is max_t (S_t - R_t) over the rows that attend to a key
    less ``tame_bound`` (-inf for none), and the sums are exact where it is <= 0 (the head is
    tame). T a multiple of ``CHUNK``, m of ``FEATURE_TILE``; query and key bfloat16
    (``check_rows``); values, zero where not valid, enter as bfloat16; valid ``(N, T)``
    bool."""
    value_width = value.shape[-1]
    check_rows(query, key, value_width)
    keys = augmented_rows(key, norm_weight)
    values = _padded_columns(value.astype(jnp.bfloat16))
    keep = valid.astype(jnp.float32)
    augmented = augmented_weights(weights, bias)
    summaries = key_summaries(keys, values, keep, augmented, interpret=interpret)
    chunks = references(summaries, key, valid, weights, bias, norm_weight)
    queries = augmented_rows(query, norm_weight)
    num, den, shift, lower = causal_readout(
        queries, keys, values, keep, augmented, chunks, interpret=interpret
    )
    attends = jnp.cumsum(valid, axis=-1) > 0
    spread = jnp.max(jnp.where(attends, shift - lower, -jnp.inf), axis=-1)
    return num[..., :value_width], den, shift, spread - tame_bound(weights.shape[0], key.shape[1])
