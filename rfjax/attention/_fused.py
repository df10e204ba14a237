"""Fused Pallas kernels of FAVOR attention: the feature map (projection, exponent, stabiliser)
is computed inside the kernels from the rows, so the (T, m) features never reach memory.

One head, one sequence (``jax.vmap`` over batch and heads adds grid axes). The maps are those
whose log-features are l(x) = x W^T + b + g |x|^2 (``rfjax.features.AffineLogForm``: FAVOR+,
its antithetic variant and OPRF; kernels in ``_fused_kernels``) and the angular hybrid
(``AngularHybridForm``; kernels in ``_fused_hybrid``: its positive and trigonometric bases
and sign channels, one key shift per key as in the XLA form). A static spec (``Spec``) says
how the kernels read the map's parameters and which kernels run; both sets take the same
arguments, so the passes below are shared. For the affine maps the computation is the chunk
algorithm of ``_log_prefix`` (per-feature key shifts, exact at any norm), written per chunk of
C positions in blocks of B = 16:

* causal, forward: ``key_summary_kernel`` per chunk (the chunk's key maximum d and summary
  sum_j exp(lb_j - d) [v_j, 1]), the running maxima and the chunk states by a scan over the
  summaries only (``_chunks.chunk_states``, in XLA), then ``output_kernel`` per chunk: the
  numerator and denominator rows and the row shifts M (a block's weights against its own keys
  per pair, as the XLA form forms them, or with ``diagonal_form="factored"``
  (``fused_kernel_settings``) as products of a factor per row and one per key where
  ``_log_chunk.factored_bound`` allows it: a branch per block; with ``diagonal_form="chunk"``
  each block against all the chunk's keys as the XLA form's tame product, where exact);
* causal, backward (one ``jax.custom_vjp``): the states again, ``query_summary_kernel`` per chunk
  (sum_t exp(la_t + C^s - M_t) G_t^T) and the later queries' states by the reversed scan, then
  ``cotangent_kernel`` over groups of chunks: a pass over a chunk's blocks of queries, then one
  over its blocks of keys (each block's cotangents complete in its step, so one block's are held
  at a time), the cotangents of the log-features pulled back through the affine map block by
  block (dq = dla W + 2 g (sum_i dla_i) q, and dW, db summed over the group's chunks);
* bidirectional: the same key summaries combined over all chunks (per-feature maxima), then
  ``readout_kernel`` per chunk; its backward forms the queries' summary and the keys'
  cotangents the same way.

One head's chunk states are as large as its features would be (F values per chunk for each of
its P value columns: F = m for FAVOR+, 2 (n + 1) 2m for the angular hybrid). Past
``STATES_BYTES`` of them the causal passes run over segments of chunks (a scan carries the
running maxima and the state from one segment to the next; the backward pass keeps the carry at
each segment's start and forms one segment's states at a time from it) and the bidirectional
passes sum their summaries segment by segment.

The affine maps' cotangent kernels run once per tile of at most ``cotangent_features`` features
(their shared memory per block grows with the features; ``tools/triton_kernels.py`` compiles
every kernel for sm80 and sm90 without a GPU and reports it).

The kernels are written once in Pallas and compiled for a backend (``Backend``: Triton on NVIDIA
sm80+ GPUs, Mosaic on TPUs) or run in interpret mode on any platform (tests on CPU). Mosaic GPU
(sm90+) takes kernels in its own idiom: ``_fused_mosaic_gpu`` has the bidirectional forward
pass's (key summaries and read-out, for the affine maps) and ``_fused_mosaic_gpu_grads`` its
backward pass's, which ``Backend("mosaic_gpu")`` runs in place of the generic ones;
``_fused_mosaic_gpu_causal`` and ``_fused_mosaic_gpu_causal_grads`` have causal attention's
passes, which run where their row shifts are within reach, else the generic kernels'
(``_mosaic_gpu_causal``). Values are
padded to a power-of-two width of at least 16 (the products' smallest dimension on GPUs, and
Triton's shapes) and the head dimension likewise (zeros change neither x W^T nor |x|^2).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rfjax.attention import _kernel_settings
from rfjax.attention._checks import log_floor, vary_like
from rfjax.attention._chunks import chunk_states
from rfjax.attention._fused_hybrid import FEATURE_TILE, AngularHybridSpec
from rfjax.attention._fused_kernels import CHUNK, AffineSpec
from rfjax.attention._head_features import data_normalizer, finite_rows, floored_ratio, normalise
from rfjax.features import AffineLogForm, AngularHybridFeatureMap

MIN_WIDTH = 16  # the smallest dimension of a product on GPUs (tt.dot)
Spec = AffineSpec | AngularHybridSpec  # how the kernels read a map's parameters, and which
CHUNKS_PER_GROUP = 16  # chunks per program of the cotangent kernel (dW, db summed over them)
# Bytes of one head's chunk states (float32) held at once; beyond, the passes run segment by
# segment (the module's docstring). The angular hybrid's states are 2 (n + 1) 2m wide (9,216 at
# m = 256 and n = 8: 2.3 MiB per chunk of P = 64 values), so all of them at T = 64k would take
# 2.3 GiB per head. 128 MiB keeps FAVOR+ at m = 256 (64 KiB per chunk) in one segment up to
# T = 128k.
STATES_BYTES = 128 << 20


@dataclasses.dataclass(frozen=True)
class Backend:
    """How the kernels are compiled: ``compiler`` "triton", "tpu" or None (interpret mode,
    with the TPU's simulator for ``interpret == "tpu"``)."""

    compiler: str | None
    interpret: str | None = None

    @property
    def mosaic_gpu(self) -> bool:
        """Whether attention runs the kernels in Mosaic GPU's idiom (``_fused_mosaic_gpu``,
        ``_fused_mosaic_gpu_grads``, ``_fused_mosaic_gpu_causal``,
        ``_fused_mosaic_gpu_causal_grads``; compiled for sm90+, or in
        interpret mode) in place of the generic ones."""
        return "mosaic_gpu" in (self.compiler, self.interpret)

    @property
    def generic(self) -> Backend:
        """The backend of the generic kernels where this one is Mosaic GPU's (its causal
        attention's fallback and gradients): Triton where the kernels are compiled, interpret
        mode where they are interpreted; itself otherwise."""
        if not self.mosaic_gpu:
            return self
        return Backend("triton" if self.compiler == "mosaic_gpu" else None)

    def call(self, kernel, **kwargs):
        """``pl.pallas_call`` of ``kernel`` with this backend's parameters."""
        if self.compiler == "triton":
            from jax.experimental.pallas import triton as plgpu

            settings = _kernel_settings.IN_FORCE
            kwargs["compiler_params"] = plgpu.CompilerParams(**settings.triton_parameters)
        elif self.compiler == "tpu":
            from jax.experimental.pallas import tpu as pltpu

            semantics = ("parallel",) * len(kwargs["grid"])
            kwargs["compiler_params"] = pltpu.CompilerParams(dimension_semantics=semantics)
        elif self.interpret == "tpu":
            from jax.experimental.pallas import tpu as pltpu

            kwargs["interpret"] = pltpu.InterpretParams()
        else:
            kwargs["interpret"] = True

        def run(*operands):
            # Inside shard_map the operands vary over mesh axes (all the same ones:
            # ``fused_attention_sums`` casts them), and so do the outputs.
            varying = jax.typeof(operands[0]).manual_axis_type
            out_shape = [
                jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=varying)
                for s in kwargs["out_shape"]
            ]
            return pl.pallas_call(kernel, **(kwargs | {"out_shape": out_shape}))(*operands)

        return run


# ------------------------------------------------------------------------------- wrappers


def _padded_width(n: int) -> int:
    """A column width padded for the kernels: the next power of two >= ``MIN_WIDTH`` (Triton
    forms values of power-of-two shapes only)."""
    return max(MIN_WIDTH, 1 << max(n - 1, 0).bit_length())


class _Sequence:
    """A sequence of T rows padded to whole segments of chunks (zeros; keys of padded rows do
    not count) and its column widths to powers of two >= ``MIN_WIDTH`` (zeros change neither
    x W^T, |x|^2 nor a product with a value). The fewest segments of at most ``most`` chunks
    each (``_segment_chunks``; one segment without it), of equal length: fewer chunks of
    padding than segments."""

    def __init__(self, length: int, most: int | None = None):
        self.length = length
        chunks = max(1, -(-length // CHUNK))
        self.segments = 1 if most is None else -(-chunks // most)
        self.segment = -(-chunks // self.segments)  # chunks per segment
        self.chunks = self.segments * self.segment
        self.padded = self.chunks * CHUNK

    def one_segment(self) -> _Sequence:
        """The rows of one segment: ``segment`` whole chunks."""
        return _Sequence(self.segment * CHUNK)

    def pad(self, x: jax.Array) -> jax.Array:
        """``(T, w)`` -> ``(T', w')``, or a mask ``(T,)`` -> a float column ``(T', 1)``."""
        if x.ndim == 1:
            x = x[:, None].astype(jnp.float32)
            return jnp.pad(x, ((0, self.padded - self.length), (0, 0)))
        width = _padded_width(x.shape[1])
        return jnp.pad(x, ((0, self.padded - self.length), (0, width - x.shape[1])))

    def split(self, x: jax.Array) -> jax.Array:
        """A padded ``(T', w)`` -> ``(segments, rows per segment, w)``."""
        return x.reshape(self.segments, -1, x.shape[-1])

    def rows(self, x: jax.Array | jax.ShapeDtypeStruct, chunks: int = 1) -> pl.BlockSpec:
        """Blocks of ``chunks`` chunks of rows of a padded ``(T', w)`` array."""
        return pl.BlockSpec((chunks * CHUNK, x.shape[1]), lambda c: (c, 0))


def _segment_chunks(width: int, value_width: int) -> int:
    """The most chunks per segment for states of ``width`` features and ``value_width`` columns
    (float32, with the counts' column): as many as ``STATES_BYTES`` holds, at least one."""
    return max(1, STATES_BYTES // (4 * width * (value_width + 1)))


def _joined(x: jax.Array) -> jax.Array:
    """``(segments, rows per segment, w)`` -> ``(T', w)``."""
    return x.reshape(-1, x.shape[-1])


def _over_segments(step, carry, xs, *, reverse: bool = False):
    """``jax.lax.scan(step, carry, xs)`` over the segments (the leading axis of ``xs``); one
    segment is one call of ``step``, without a loop."""
    if jax.tree.leaves(xs)[0].shape[0] == 1:
        carry, ys = step(carry, jax.tree.map(lambda a: a[0], xs))
        return carry, jax.tree.map(lambda a: a[None], ys)
    return jax.lax.scan(step, carry, xs, reverse=reverse)


def _whole(x: jax.Array | jax.ShapeDtypeStruct) -> pl.BlockSpec:
    return pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)


def _per_chunk(x: jax.Array | jax.ShapeDtypeStruct, chunks: int | None = None) -> pl.BlockSpec:
    """Block c of an ``(n, ...)`` array: entry c, squeezed (``chunks`` None), or entries
    [c chunks, (c + 1) chunks) (a group's, indexed inside the kernel)."""
    rest = x.shape[1:]
    if chunks is None:
        return pl.BlockSpec((None, *rest), lambda c: (c, *(0,) * len(rest)))
    return pl.BlockSpec((chunks, *rest), lambda c: (c, *(0,) * len(rest)))


def _out(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


class _Map(NamedTuple):
    """The map's parameters padded for the kernels: weights ``(r, H')`` and ``aux`` (the bias
    ``(1, m)`` or the sign projection ``(n, H')``), and how the kernels read them (``spec``)."""

    weights: jax.Array
    aux: jax.Array
    spec: Spec

    @staticmethod
    def of(weights: jax.Array, aux: jax.Array, spec: Spec) -> _Map:
        head_dim = _padded_width(weights.shape[1])
        padded = jnp.pad(weights, ((0, 0), (0, head_dim - weights.shape[1])))
        return _Map(padded, spec.padded_aux(aux, head_dim), spec)

    @property
    def width(self) -> int:
        """F, the width of the states and summaries."""
        return self.spec.width(self.weights, self.aux)

    @property
    def reference_width(self) -> int:
        """The width of the key maxima: F (one per feature) or 1 (one per key)."""
        return self.spec.reference_width(self.weights, self.aux)

    def kernel(self, name: str, matmul_dtype):
        """The spec's kernel ``name`` with its static arguments."""
        kernel = getattr(self.spec.kernels, name)
        return functools.partial(kernel, spec=self.spec, matmul_dtype=matmul_dtype)

    def specs(self) -> list[pl.BlockSpec]:
        return [_whole(self.weights), _whole(self.aux)]

    def feature_tiles(self) -> list[slice]:
        """The features cut into tiles of at most ``cotangent_features`` (the settings in
        force) for the cotangent kernels: the affine maps (per-feature parameters: a row of W,
        an entry of b); one tile for the angular hybrid."""
        width = self.width
        step = _kernel_settings.IN_FORCE.cotangent_features
        if not isinstance(self.spec, AffineSpec) or width <= step:
            return [slice(None)]
        return [slice(i, min(i + step, width)) for i in range(0, width, step)]

    def tile(self, features: slice) -> _Map:
        """The affine map restricted to ``features`` (itself for ``slice(None)``)."""
        if features == slice(None):
            return self
        return _Map(self.weights[features], self.aux[:, features], self.spec)


def _group_size(chunks: int) -> int:
    """Chunks per program of the cotangent kernels: the largest divisor of ``chunks`` up to
    ``CHUNKS_PER_GROUP``."""
    return max(g for g in range(1, min(CHUNKS_PER_GROUP, chunks) + 1) if chunks % g == 0)


def _key_summaries(form: _Map, keys: _Sequence, k, v, valid, backend, matmul_dtype):
    """Each chunk's key maximum d ``(n, 1, m)``, sum_j exp(lb_j - d) v_j^T ``(n, m, P)`` and
    sum_j exp(lb_j - d) ``(n, 1, m)``."""
    width, value_width, n = form.width, v.shape[1], keys.chunks
    outputs = [
        _out((n, 1, form.reference_width)),
        _out((n, width, value_width)),
        _out((n, 1, width)),
    ]
    return backend.call(
        form.kernel("key_summary_kernel", matmul_dtype),
        grid=(n,),
        in_specs=[keys.rows(k), keys.rows(v), keys.rows(valid), *form.specs()],
        out_specs=[_per_chunk(x) for x in outputs],
        out_shape=outputs,
        name="rfjax_favor_key_summary",
    )(k, v, valid, form.weights, form.aux)


def _with_counts(sums: jax.Array, counts: jax.Array) -> jax.Array:
    """``(n, m, P)`` and ``(n, 1, m)`` -> ``(n, m, P + 1)``: one state for the scans."""
    return jnp.concatenate([sums, counts.swapaxes(1, 2)], axis=2)


def _without_counts(states: jax.Array) -> tuple[jax.Array, jax.Array]:
    return states[:, :, :-1], states[:, :, -1:].swapaxes(1, 2)


def _causal_states(form, keys, k, v, valid, backend, matmul_dtype, carry):
    """((start, end ``(n, 1, m)``, states ``(n, m, P)``, counts ``(n, 1, m)``), carry): the
    running maxima at each chunk's start and end, and the state of the keys before it relative
    to its start (``chunk_states`` over the summaries). ``carry`` (``_first_carry`` before the
    first chunk): the running maximum ``(1, 1, m)`` and the state ``(m, P + 1)`` (counts last)
    before these chunks; the carry returned is theirs after them."""
    chunk_max, sums, counts = _key_summaries(form, keys, k, v, valid, backend, matmul_dtype)
    previous, initial = carry
    end = jnp.maximum(jax.lax.cummax(chunk_max, axis=0), previous)
    start = jnp.concatenate([previous, end[:-1]])
    summaries = _with_counts(sums, counts) * jnp.exp(chunk_max - end).swapaxes(1, 2)
    states, final = chunk_states(summaries, jnp.exp(start - end)[:, 0], initial)
    return (start, end, *_without_counts(states)), (end[-1:], final)


def _first_carry(x: _Rows) -> tuple[jax.Array, jax.Array]:
    """The carry of ``_causal_states`` before the first chunk: the floor and no state."""
    floor = jnp.full((1, 1, x.form.reference_width), log_floor(jnp.dtype(jnp.float32)))
    state = jnp.zeros((x.form.width, x.value.shape[1] + 1), jnp.float32)
    return vary_like(floor, x.key), vary_like(state, x.key, x.value)


def _combined(chunk_max, sums, counts):
    """Summaries ``(n, 1, m)``, ``(n, m, P)``, ``(n, 1, m)`` relative to their own maxima ->
    (c ``(1, m)``, S ``(m, P)``, z ``(1, m)``) relative to the per-feature maximum c."""
    top = jnp.max(chunk_max, axis=0)
    rescale = jnp.exp(chunk_max - top)
    return top, jnp.sum(sums * rescale.swapaxes(1, 2), axis=0), jnp.sum(counts * rescale, axis=0)


def _combined_state(x: _Rows, backend, matmul_dtype):
    """(c ``(1, m)``, S ``(m, P)``, z ``(1, m)``): every key's state relative to the per-feature
    maximum c (bidirectional), combined segment by segment."""
    rows = x.keys.one_segment()

    def segment_state(_, segment):
        summaries = _key_summaries(x.form, rows, *segment, backend, matmul_dtype)
        return None, _combined(*summaries)

    segments = tuple(map(x.keys.split, (x.key, x.value, x.valid)))
    per_segment = _over_segments(segment_state, None, segments)[1]
    return _combined(*per_segment)


def _query_summaries(form, queries, q, reference, row_shift, grad, grad_den, backend, matmul_dtype):
    """Per chunk sum_t exp(la_t + r - M_t) [G_t, g_t]^T: ``(n, m, P)``, ``(n, 1, m)``;
    ``reference`` r per chunk ``(n, 1, m)`` or one ``(1, m)``."""
    width, value_width, n = form.width, grad.shape[1], queries.chunks
    outputs = [_out((n, width, value_width)), _out((n, 1, width))]
    reference_spec = _per_chunk(reference) if reference.ndim == 3 else _whole(reference)
    return backend.call(
        form.kernel("query_summary_kernel", matmul_dtype),
        grid=(n,),
        in_specs=[
            queries.rows(q),
            *form.specs(),
            reference_spec,
            queries.rows(row_shift),
            queries.rows(grad),
            queries.rows(grad_den),
        ],
        out_specs=[_per_chunk(x) for x in outputs],
        out_shape=outputs,
        name="rfjax_favor_query_summary",
    )(q, form.weights, form.aux, reference, row_shift, grad, grad_den)


def _padded_cotangents(sequence: _Sequence, grad_num, grad_den):
    return sequence.pad(grad_num.astype(jnp.float32)), sequence.pad(grad_den.astype(jnp.float32))


class _Rows(NamedTuple):
    """One head's padded rows and map (the residuals of the custom VJPs)."""

    query: jax.Array
    key: jax.Array
    value: jax.Array
    valid: jax.Array
    form: _Map
    queries: _Sequence
    keys: _Sequence


def _rows(weights, aux, spec, query, key, value, valid) -> _Rows:
    form = _Map.of(weights, aux, spec)
    segment = _segment_chunks(form.width, _padded_width(value.shape[1]))
    queries, keys = _Sequence(query.shape[0], segment), _Sequence(key.shape[0], segment)
    return _Rows(
        queries.pad(query), keys.pad(key), keys.pad(value), keys.pad(valid), form, queries, keys
    )


def _unpadded_cotangents(spec, weights, aux, query, key, value, grad_w, grad_aux, dq, dk, dv):
    """The custom VJPs' cotangents, padding dropped: (dW, d aux, dq, dk, dv, None for the
    mask)."""
    return (
        grad_w[:, : weights.shape[1]].astype(weights.dtype),
        spec.unpadded_aux(grad_aux, aux),
        dq[: query.shape[0], : query.shape[1]].astype(query.dtype),
        dk[: key.shape[0], : key.shape[1]].astype(key.dtype),
        dv[: value.shape[0], : value.shape[1]].astype(value.dtype),
        None,
    )


def _differentiable(forward, backward):
    """The attention sums of ``forward`` under one ``jax.custom_vjp`` whose pullback is
    ``backward``: the residuals are the inputs and the rows' shifts (the forward's second
    output), so the backward recomputes the states rather than storing them."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
    def attention(weights, aux, query, key, value, valid, spec, backend, matmul_dtype):
        return forward(weights, aux, query, key, value, valid, spec, backend, matmul_dtype)[0]

    def attention_fwd(weights, aux, query, key, value, valid, spec, backend, matmul_dtype):
        out, row_shift = forward(
            weights, aux, query, key, value, valid, spec, backend, matmul_dtype
        )
        return out, (weights, aux, query, key, value, valid, row_shift)

    attention.defvjp(attention_fwd, backward)
    return attention


# --- causal


def _over_feature_tiles(form: _Map, cotangents) -> tuple[jax.Array, ...]:
    """(rows' cotangents..., dW ``(m, H)``, d aux ``(1, m)``): ``cotangents(tile, features)``
    (the rows' cotangents and the per-group dW and d aux of one tile of features) summed over
    the tiles for the rows, joined along the features for the parameters."""
    rows: list[jax.Array] | None = None
    grad_w, grad_aux = [], []
    for features in form.feature_tiles():
        *tile_rows, tile_w, tile_aux = cotangents(form.tile(features), features)
        rows = tile_rows if rows is None else [a + b for a, b in zip(rows, tile_rows, strict=True)]
        grad_w.append(jnp.sum(tile_w, 0))
        grad_aux.append(jnp.sum(tile_aux, 0))
    assert rows is not None
    return (*rows, jnp.concatenate(grad_w, axis=0), jnp.concatenate(grad_aux, axis=-1))


def _causal_forward(weights, aux, query, key, value, valid, spec, backend, matmul_dtype):
    x = _rows(weights, aux, spec, query, key, value, valid)
    rows = x.queries.one_segment()

    def segment_outputs(carry, segment):
        q, k, v, valid = segment
        (start, _, states, counts), carry = _causal_states(
            x.form, rows, k, v, valid, backend, matmul_dtype, carry
        )
        outputs = [_out((rows.padded, v.shape[1]))] + [_out((rows.padded, 1))] * 2
        return carry, backend.call(
            x.form.kernel("output_kernel", matmul_dtype),
            grid=(rows.chunks,),
            in_specs=[
                *(rows.rows(a) for a in segment),
                *x.form.specs(),
                _per_chunk(start),
                _per_chunk(states),
                _per_chunk(counts),
            ],
            out_specs=[rows.rows(o) for o in outputs],
            out_shape=outputs,
            name="rfjax_favor_causal_output",
        )(q, k, v, valid, x.form.weights, x.form.aux, start, states, counts)

    segments = tuple(map(x.queries.split, (x.query, x.key, x.value, x.valid)))
    _, outputs = _over_segments(segment_outputs, _first_carry(x), segments)
    num, den, row_shift = map(_joined, outputs)
    length = x.queries.length
    out = (num[:length, : value.shape[1]], *(y[:length, 0] for y in (den, row_shift)))
    return out, row_shift


def _causal_checkpoints(x: _Rows, keys, backend, matmul_dtype):
    """The carry of ``_causal_states`` at each segment's start (stacked); ``keys`` the
    segments' keys, values and mask."""
    first = _first_carry(x)
    if x.keys.segments == 1:
        return jax.tree.map(lambda a: a[None], first)
    rows = x.keys.one_segment()

    def step(carry, segment):
        _, after = _causal_states(x.form, rows, *segment, backend, matmul_dtype, carry)
        return after, carry

    return _over_segments(step, first, keys)[1]


def _causal_backward(spec, backend, matmul_dtype, residuals, cotangents):
    weights, aux, query, key, value, valid, row_shift = residuals
    grad_num, grad_den, _ = cotangents  # the row shifts are constants
    x = _rows(weights, aux, spec, query, key, value, valid)
    grad, grad_den = _padded_cotangents(x.queries, grad_num, grad_den)
    rows = x.queries.one_segment()
    group = _group_size(rows.chunks)
    groups = rows.chunks // group

    def segment_cotangents(later, inputs):
        # The segment's states from the carry at its start, the later queries' states from the
        # carry of the segments after it (reversed time).
        (q, k, v, valid, shift, g, g_den), checkpoint = inputs
        (start, end, states, counts), _ = _causal_states(
            x.form, rows, k, v, valid, backend, matmul_dtype, checkpoint
        )
        sums, query_counts = _query_summaries(
            x.form, rows, q, start, shift, g, g_den, backend, matmul_dtype
        )
        later_states, later = chunk_states(
            _with_counts(sums, query_counts), jnp.exp(start - end)[:, 0], later, reverse=True
        )
        later_sums, later_counts = _without_counts(later_states)
        chunked = (q, k, v, valid)

        def tile_cotangents(form: _Map, features: slice):
            per_chunk = (
                start[..., features],
                end[..., features],
                states[:, features],
                counts[..., features],
                later_sums[:, features],
                later_counts[..., features],
            )
            outputs = [
                *(_out(a.shape) for a in chunked[:3]),
                _out((groups, *form.weights.shape)),
                _out((groups, *form.aux.shape)),
            ]
            return backend.call(
                form.kernel("cotangent_kernel", matmul_dtype),
                grid=(groups,),
                in_specs=[
                    *(rows.rows(a, group) for a in chunked),
                    *form.specs(),
                    *(_per_chunk(a, group) for a in per_chunk),
                    *(rows.rows(a, group) for a in (shift, g, g_den)),
                ],
                out_specs=[
                    *(rows.rows(o, group) for o in outputs[:3]),
                    *map(_per_chunk, outputs[3:]),
                ],
                out_shape=outputs,
                name="rfjax_favor_causal_cotangents",
            )(*chunked, form.weights, form.aux, *per_chunk, shift, g, g_den)

        return later, _over_feature_tiles(x.form, tile_cotangents)

    segments = tuple(
        map(x.queries.split, (x.query, x.key, x.value, x.valid, row_shift, grad, grad_den))
    )
    checkpoints = _causal_checkpoints(x, segments[1:4], backend, matmul_dtype)
    _, first_later = _first_carry(x)
    _, per_segment = _over_segments(
        segment_cotangents, first_later, (segments, checkpoints), reverse=True
    )
    dq, dk, dv = map(_joined, per_segment[:3])
    grad_w, grad_b = (jnp.sum(a, axis=0) for a in per_segment[3:])
    return _unpadded_cotangents(spec, weights, aux, query, key, value, grad_w, grad_b, dq, dk, dv)


_causal = _differentiable(_causal_forward, _causal_backward)


# --- bidirectional


def _bidirectional_forward(weights, aux, query, key, value, valid, spec, backend, matmul_dtype):
    x = _rows(weights, aux, spec, query, key, value, valid)
    rows = x.queries
    if backend.mosaic_gpu:  # imported here: Mosaic GPU only where it is asked for
        from rfjax.attention import _fused_mosaic_gpu

        num, den, row_shift = _fused_mosaic_gpu.bidirectional_sums(
            x.form.weights,
            x.form.aux[0],
            *(a[None] for a in (x.query, x.key, x.value, x.valid[:, 0] > 0)),
            norm_weight=spec.norm_weight,
            interpret=backend.compiler is None,
        )
        row_shift = row_shift[0, :, None]
        return (
            num[0, : rows.length, : value.shape[1]],
            den[0, : rows.length],
            row_shift[: rows.length, 0],
        ), row_shift
    shift, state, count = _combined_state(x, backend, matmul_dtype)
    outputs = [_out((rows.padded, state.shape[1]))] + [_out((rows.padded, 1))] * 2
    num, den, row_shift = backend.call(
        x.form.kernel("readout_kernel", matmul_dtype),
        grid=(rows.chunks,),
        in_specs=[rows.rows(x.query), *x.form.specs(), *map(_whole, (shift, state, count))],
        out_specs=[rows.rows(o) for o in outputs],
        out_shape=outputs,
        name="rfjax_favor_readout",
    )(x.query, x.form.weights, x.form.aux, shift, state, count)
    out = (
        num[: rows.length, : value.shape[1]],
        *(y[: rows.length, 0] for y in (den, row_shift)),
    )
    return out, row_shift


def _bidirectional_backward(spec, backend, matmul_dtype, residuals, cotangents):
    weights, aux, query, key, value, valid, row_shift = residuals
    grad_num, grad_den, _ = cotangents
    x = _rows(weights, aux, spec, query, key, value, valid)
    if backend.mosaic_gpu:  # imported here: Mosaic GPU only where it is asked for
        from rfjax.attention import _fused_mosaic_gpu_grads

        grad, grad_den = _padded_cotangents(x.queries, grad_num, grad_den)
        grad_w, grad_b, dq, dk, dv = _fused_mosaic_gpu_grads.bidirectional_cotangents(
            x.form.weights,
            x.form.aux[0],
            *(a[None] for a in (x.query, x.key, x.value, x.valid[:, 0] > 0)),
            *(a[None] for a in (row_shift[:, 0], grad, grad_den[:, 0])),
            norm_weight=spec.norm_weight,
            interpret=backend.compiler is None,
        )
        return _unpadded_cotangents(
            spec, weights, aux, query, key, value, grad_w[0], grad_b, dq[0], dk[0], dv[0]
        )
    shift, state, count = _combined_state(x, backend, matmul_dtype)
    grad, grad_den = _padded_cotangents(x.queries, grad_num, grad_den)
    query_rows = x.queries.one_segment()

    def segment_summary(_, segment):
        sums, counts = _query_summaries(
            x.form, query_rows, segment[0], shift, *segment[1:], backend, matmul_dtype
        )
        return None, (jnp.sum(sums, axis=0), jnp.sum(counts, axis=0))

    segments = tuple(map(x.queries.split, (x.query, row_shift, grad, grad_den)))
    grad_state, grad_count = (
        jnp.sum(a, axis=0) for a in _over_segments(segment_summary, None, segments)[1]
    )
    queries, keys = x.queries, x.keys
    q_group, k_group = _group_size(queries.chunks), _group_size(keys.chunks)
    q_groups, k_groups = queries.chunks // q_group, keys.chunks // k_group

    def tile_cotangents(form: _Map, features: slice):
        tile_shift = shift[..., features]
        q_outputs = [
            _out(x.query.shape),
            _out((q_groups, *form.weights.shape)),
            _out((q_groups, *form.aux.shape)),
        ]
        dq, dw_q, db_q = backend.call(
            form.kernel("query_cotangent_kernel", matmul_dtype),
            grid=(q_groups,),
            in_specs=[
                queries.rows(x.query, q_group),
                *form.specs(),
                *map(_whole, (tile_shift, state[features], count[..., features])),
                *(queries.rows(a, q_group) for a in (row_shift, grad, grad_den)),
            ],
            out_specs=[
                queries.rows(x.query, q_group),
                _per_chunk(q_outputs[1]),
                _per_chunk(q_outputs[2]),
            ],
            out_shape=q_outputs,
            name="rfjax_favor_query_cotangents",
        )(
            x.query,
            form.weights,
            form.aux,
            tile_shift,
            state[features],
            count[..., features],
            row_shift,
            grad,
            grad_den,
        )
        k_outputs = [
            _out(x.key.shape),
            _out(x.value.shape),
            _out((k_groups, *form.weights.shape)),
            _out((k_groups, *form.aux.shape)),
        ]
        tile_state, tile_count = grad_state[features], grad_count[..., features]
        dk, dv, dw_k, db_k = backend.call(
            form.kernel("key_cotangent_kernel", matmul_dtype),
            grid=(k_groups,),
            in_specs=[
                *(keys.rows(a, k_group) for a in (x.key, x.value, x.valid)),
                *form.specs(),
                *map(_whole, (tile_shift, tile_state, tile_count)),
            ],
            out_specs=[
                keys.rows(x.key, k_group),
                keys.rows(x.value, k_group),
                *map(_per_chunk, k_outputs[2:]),
            ],
            out_shape=k_outputs,
            name="rfjax_favor_key_cotangents",
        )(x.key, x.value, x.valid, form.weights, form.aux, tile_shift, tile_state, tile_count)
        grad_w = jnp.concatenate([dw_q, dw_k])  # summed over the groups by the caller
        grad_b = jnp.concatenate([db_q, db_k])
        return dq, dk, dv, grad_w, grad_b

    dq, dk, dv, grad_w, grad_b = _over_feature_tiles(x.form, tile_cotangents)
    return _unpadded_cotangents(spec, weights, aux, query, key, value, grad_w, grad_b, dq, dk, dv)


_bidirectional = _differentiable(_bidirectional_forward, _bidirectional_backward)


class AngularHybridForm(NamedTuple):
    """What the kernels compute the angular hybrid's features from
    (``rfjax.features.AngularHybridFeatureMap``, variant II): the base projection and the sign
    projection.

    Attributes:
      weights: W ``(m, H)``, of both base estimators (positive and trigonometric).
      signs: T ``(n, H)``, the angular coefficient's sign projection.
    """

    weights: jax.Array
    signs: jax.Array


FusedForm = AffineLogForm | AngularHybridForm

# What the errors for other maps list: the maps the kernels take.
AFFINE_MAPS = "'positive', 'positive_antithetic', 'oprf' (affine log-features)"
FUSED_MAPS = f"{AFFINE_MAPS} and 'angular_hybrid'"


def _kernel_parameters(form: FusedForm) -> tuple[Spec, jax.Array, jax.Array]:
    """(the kernels' ``spec``, weights, aux) of ``form``."""
    if isinstance(form, AngularHybridForm):  # z and -z from W2 = [W; -W]
        weights = jnp.concatenate([form.weights, -form.weights])
        return AngularHybridSpec(form.signs.shape[0]), weights, form.signs
    return AffineSpec(float(form.norm_weight)), form.weights, form.bias


def fused_attention_sums(
    form: FusedForm,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    *,
    causal: bool,
    backend: Backend,
    matmul_dtype: Any = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """FAVOR's sums for one head with the map fused: (numerator ``(T, p)``, denominator
    ``(T,)``) for causal or bidirectional attention.

    Affine log-features (``AffineLogForm``): a key shift per feature, each row relative to its
    largest term, the sums that ``_log_prefix.causal_feature_prefix`` (causal) or the
    per-feature key shifts of ``_bidirectional`` form. The angular hybrid
    (``AngularHybridForm``; ``_fused_hybrid``): the XLA form's sums, in its units
    e^{-s(q_t) - c_t} (s the per-row log-scale ``HybridParts.log_scale``, c_t its running
    (causal) or global maximum over the keys), so that the denominator floor ``eps`` of signed
    maps clips the same rows.

    Args:
      form: the map's ``AffineLogForm`` (weights ``(m, H)``, bias ``(m,)``, norm weight) or
        ``AngularHybridForm``.
      query: ``(T, H)``, finite.
      key: ``(S, H)`` (S == T if causal), finite.
      value: ``(S, p)``, finite where ``valid``.
      valid: ``(S,)`` bool, the keys that count.
      causal: attend only to keys j <= t.
      backend: how the kernels are compiled (``Backend``).
      matmul_dtype: the products' operand dtype (accumulated in float32) for the affine maps;
        the angular hybrid's are float32 (``AngularHybridSpec.operand_dtype``).

    Returns:
      (numerator, denominator), float32.

    Raises:
      ValueError: for causal attention under a Mosaic GPU backend, whose kernels run through
        ``fused_attention`` (their fallback is decided over all heads at once).
    """
    if causal and backend.mosaic_gpu:
        raise ValueError(
            "causal attention under Mosaic GPU runs through fused_attention (its fallback to "
            "the generic kernels is decided over all heads); fused_attention_sums takes the "
            "generic backends (Backend.generic)"
        )
    spec, *arrays = _varying_operands(form, query, key, value, valid)
    op = _causal if causal else _bidirectional
    num, den, _ = op(*arrays, spec, backend, spec.operand_dtype(jnp.dtype(matmul_dtype)))
    return num, den


def _varying_operands(form: FusedForm, query, key, value, valid):
    """(the kernels' ``spec``, weights, aux, query, key, value, valid). Inside shard_map the
    parameters (replicated) enter varying like the rows, so that every kernel's operands and
    outputs have one type and the parameters' cotangents are summed over the devices (the
    transpose of the cast)."""
    spec, weights, aux = _kernel_parameters(form)
    arrays = (weights, aux, query, key, value, valid)
    return (spec, *(vary_like(x, query, key, value, valid) for x in arrays))


def kernel_form(projection, fmap) -> FusedForm | None:
    """The form the kernels compute for (projection, map), or ``None`` when they take no such
    map: ``AffineLogForm`` for a symmetric exponential map whose ``affine_log_form`` is given
    (FAVOR+, its antithetic variant, OPRF), ``AngularHybridForm`` for the angular hybrid."""
    if isinstance(fmap, AngularHybridFeatureMap):
        if fmap.sign_projection is None:
            raise ValueError(
                "AngularHybridFeatureMap has no sign projection: call .init(key, dim) first"
            )
        return AngularHybridForm(projection.matrix(), fmap.sign_projection.matrix())
    method = getattr(fmap, "affine_log_form", None)
    if method is None or not getattr(fmap, "symmetric", True):
        return None
    return method(projection, side="key")


def check_fusable(
    fmap,
    projection,
    implementation: str,
    *,
    dtype,
    widths: tuple[int, int],
    axes: tuple[int | None, int | None] = (None, None),
) -> None:
    """``ValueError`` naming the maps the fused kernels take, for a map they do not (and for
    Mosaic GPU's, naming what they take of the inputs' ``dtype``, the features and the
    ``widths``: the heads' H and the values' P). ``axes``: the head axes of a per-head
    projection and map (``PerHead``), whose forms are per head as the kernels take them
    (``_over_heads``)."""
    form_of = kernel_form if axes == (None, None) else jax.vmap(kernel_form, in_axes=axes)
    try:
        form = jax.eval_shape(form_of, projection, fmap)
    except ValueError as error:  # e.g. OPRF statistics of several sequences in one map
        raise ValueError(f"implementation={implementation!r}: {error}") from None
    if form is None:
        raise ValueError(
            f"implementation={implementation!r} fuses the feature maps {FUSED_MAPS}; "
            f"{type(fmap).__name__} is not one: use implementation='xla', which takes every map"
        )
    if implementation in _MOSAIC_GPU:
        _check_mosaic_gpu_call(form, type(fmap).__name__, implementation, dtype)
        from rfjax.attention import _fused_mosaic_gpu  # Mosaic GPU only where it is asked for

        _fused_mosaic_gpu.check_widths(*widths)
    if implementation == "pallas_triton":
        _check_triton_widths(form, type(fmap).__name__)


# The implementations that run the kernels in Mosaic GPU's idiom (``_fused_mosaic_gpu``).
_MOSAIC_GPU = ("pallas_mosaic_gpu", "pallas_mosaic_gpu_interpret")


def _check_mosaic_gpu_call(form: FusedForm, name: str, implementation: str, dtype):
    """``ValueError`` for what the Mosaic GPU kernels do not take: inputs other than bfloat16,
    the angular hybrid, m not a multiple of 64 (their tiles of features)."""
    count = form.weights.shape[-2]
    problems = {
        f"{jnp.dtype(dtype).name} inputs (bfloat16 only)": jnp.dtype(dtype) != jnp.bfloat16,
        f"{name} ({AFFINE_MAPS} only)": not isinstance(form, AffineLogForm),
        f"m = {count} features (a multiple of 64)": count == 0 or count % 64 != 0,
    }
    found = [problem for problem, present in problems.items() if present]
    if found:
        raise ValueError(
            f"implementation={implementation!r} does not take {'; '.join(found)}: use "
            f"implementation='pallas_triton' or 'xla'"
        )


def fusable(
    fmap,
    projection,
    implementation: str,
    *,
    dtype,
    widths: tuple[int, int],
    axes: tuple[int | None, int | None] = (None, None),
) -> bool:
    """Whether ``implementation``'s kernels take (``fmap``, ``projection``) and heads and values
    of ``widths``: ``check_fusable`` without its error, for ``"auto"``'s choice."""
    try:
        check_fusable(fmap, projection, implementation, dtype=dtype, widths=widths, axes=axes)
    except ValueError:
        return False
    return True


def _check_triton_widths(form: FusedForm, name: str) -> None:
    """``ValueError`` before compiling for feature counts Triton cannot take: every value a
    Triton kernel forms has power-of-two dimensions (>= 16 in products), so the affine maps'
    m features must be such a number, and the hybrid's 2m a multiple of its tile
    (``_fused_hybrid.FEATURE_TILE``, 16)."""
    count = form.weights.shape[-2]
    if isinstance(form, AngularHybridForm):
        fits = (2 * count) % FEATURE_TILE == 0
        allowed = f"m with 2m a multiple of {FEATURE_TILE}"
    else:
        fits, allowed = _power_of_two(count, MIN_WIDTH), f"m a power of two >= {MIN_WIDTH}"
    if not fits:
        raise ValueError(
            f"implementation='pallas_triton' takes {name} with {allowed} features (Triton's "
            f"blocks); got m = {count}: use implementation='xla' (or "
            f"'pallas_triton_interpret'), or such an m"
        )


def _power_of_two(n: int, minimum: int) -> bool:
    return n >= minimum and n & (n - 1) == 0


def fused_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection,
    fmap,
    *,
    axes: tuple[int | None, int | None],
    causal: bool,
    eps: float,
    backend: Backend,
    matmul_dtype: Any,
) -> jax.Array:
    """All heads, BTNH in and out, through the fused kernels (``fused_attention_sums`` vmapped
    over batch and heads; causal attention under Mosaic GPU: ``_mosaic_gpu_causal``): the
    normalised output, with non-finite rows kept out of the sums and flagged as
    ``favor_attention`` does (a non-finite query's row, and every row that attends to a
    non-finite unmasked key or value, is NaN). ``query`` and ``key`` are the rows before the
    data normaliser H^-1/4, which each head applies as its kernels take it (``_head_rows``)."""
    operands = (query, key, value, mask, projection, fmap)
    if causal and backend.mosaic_gpu:
        return _mosaic_gpu_causal(
            *operands, axes=axes, eps=eps, backend=backend, matmul_dtype=matmul_dtype
        )

    def sums(form, q, k, v, usable):
        form, q, k = _head_rows(form, q, k, backend)
        num, den = fused_attention_sums(
            form, q, k, v, usable, causal=causal, backend=backend, matmul_dtype=matmul_dtype
        )
        return num, den, None

    return _over_heads(sums, axes=axes, causal=causal, eps=eps)(*operands)[0]


def _head_rows(form: FusedForm, query: jax.Array, key: jax.Array, backend: Backend):
    """(form, query, key) of one head as its kernels take them, from the rows before the data
    normaliser s = H^-1/4: the generic kernels take the rows scaled, s x (``normalise``). The
    Mosaic GPU kernels take the rows as bfloat16, exact (they take bfloat16 inputs only:
    ``check_fusable``), and s folded into the affine map, l(s x) = x (s W)^T + b + s^2 g |x|^2:
    x_aug holds one bfloat16 part of x where s x, a float32 number, needs three
    (``_fused_mosaic_gpu.augmented_rows``), which halves the projections' products and the rows'
    shared memory."""
    if not (backend.mosaic_gpu and isinstance(form, AffineLogForm)):
        return form, normalise(query), normalise(key)
    scale = data_normalizer(query.shape[-1])
    folded = AffineLogForm(form.weights * scale, form.bias, form.norm_weight * scale**2)
    return folded, query.astype(jnp.bfloat16), key.astype(jnp.bfloat16)


def _over_heads(head_sums, *, axes: tuple[int | None, int | None], causal: bool, eps: float):
    """``head_sums(form, q, k, v, usable)`` -> (numerator, denominator, aux) of one head as
    a function of all heads' (query, key, value, mask, projection, fmap), BTNH: (the
    normalised output, BTNH, with its non-finite rows flagged; aux per batch and head)."""

    def head(q, k, v, valid, proj, f):
        form = kernel_form(proj, f)
        query_finite = finite_rows(q)
        usable = valid & finite_rows(k) & finite_rows(v)
        num, den, aux = head_sums(
            form,
            jnp.where(query_finite[:, None], q, 0),
            jnp.where(usable[:, None], k, 0),
            jnp.where(usable[:, None], v, 0),
            usable,
        )
        out = floored_ratio(num.astype(v.dtype), den.astype(v.dtype)[:, None], eps)
        bad_key = valid & ~usable
        poisoned_by_key = jnp.cumsum(bad_key, dtype=jnp.int32) > 0 if causal else jnp.any(bad_key)
        poisoned = ~query_finite | poisoned_by_key
        return jnp.where(poisoned[:, None], jnp.nan, out), aux

    over_heads = jax.vmap(head, in_axes=(1, 1, 1, None, *axes), out_axes=(1, 0))
    return jax.vmap(over_heads, in_axes=(0, 0, 0, 0, None, None))


def _mosaic_gpu_causal(query, key, value, mask, projection, fmap, *, axes, eps, backend,
                       matmul_dtype):  # fmt: skip
    """Causal attention under Mosaic GPU: ``_fused_mosaic_gpu_causal``'s forward pass where
    every head is tame, else the generic kernels' (``Backend.generic``): one ``lax.cond``
    outside the heads' ``vmap``, so only one branch runs. Differentiated, the backward pass
    of the branch taken (``_fused_mosaic_gpu_causal_grads``'s kernels where every head is
    tame)."""
    generic = functools.partial(
        fused_attention,
        axes=axes,
        causal=True,
        eps=eps,
        backend=backend.generic,
        matmul_dtype=matmul_dtype,
    )

    def sums(form, q, k, v, usable):
        spec, *arrays = _varying_operands(*_head_rows(form, q, k, backend), v, usable)
        return _mosaic_causal(*arrays, spec, backend, None)

    mosaic = _over_heads(sums, axes=axes, causal=True, eps=eps)

    @jax.custom_vjp
    def attention(*operands):
        out, excess = mosaic(*operands)
        return jax.lax.cond(jnp.all(excess <= 0), lambda: out, lambda: generic(*operands))

    def forward(*operands):
        (out, excess), pullback = jax.vjp(mosaic, *operands)
        tame = jnp.all(excess <= 0)
        out = jax.lax.cond(tame, lambda: out, lambda: generic(*operands))
        return out, (pullback, operands, tame, excess)

    def backward(residuals, cotangent):
        pullback, operands, tame, excess = residuals

        def of_kernels():
            return pullback((cotangent, jnp.zeros_like(excess)))

        def of_generic():
            return jax.vjp(generic, *operands)[1](cotangent)

        return jax.lax.cond(tame, of_kernels, of_generic)

    attention.defvjp(forward, backward)
    return attention(query, key, value, mask, projection, fmap)


def _mosaic_causal_forward(weights, aux, query, key, value, valid, spec, backend, _):
    """One head's causal sums through ``_fused_mosaic_gpu_causal.causal_sums``: ((numerator
    ``(T, p)``, denominator ``(T,)``, how far past its reach the head is: <= 0 where tame), the
    row shifts ``(1, T')``)."""
    from rfjax.attention import _fused_mosaic_gpu_causal  # Mosaic GPU only where asked for

    x = _rows(weights, aux, spec, query, key, value, valid)
    num, den, shift, excess = _fused_mosaic_gpu_causal.causal_sums(
        x.form.weights,
        x.form.aux[0],
        *(a[None] for a in (x.query, x.key, x.value, x.valid[:, 0] > 0)),
        norm_weight=spec.norm_weight,
        interpret=backend.compiler is None,
    )
    length = x.queries.length
    return (num[0, :length, : value.shape[1]], den[0, :length], excess[0]), shift


def _mosaic_causal_backward(spec, backend, _, residuals, cotangents):
    """The cotangents of ``_mosaic_causal_forward`` through
    ``_fused_mosaic_gpu_causal_grads.causal_cotangents``."""
    from rfjax.attention import _fused_mosaic_gpu_causal_grads  # Mosaic GPU only where asked

    weights, aux, query, key, value, valid, row_shift = residuals
    grad_num, grad_den, _ = cotangents  # the excess is a constant
    x = _rows(weights, aux, spec, query, key, value, valid)
    grad, grad_den = _padded_cotangents(x.queries, grad_num, grad_den)
    grad_w, grad_b, dq, dk, dv = _fused_mosaic_gpu_causal_grads.causal_cotangents(
        x.form.weights,
        x.form.aux[0],
        *(a[None] for a in (x.query, x.key, x.value, x.valid[:, 0] > 0)),
        row_shift,
        grad[None],
        grad_den[None, :, 0],
        norm_weight=spec.norm_weight,
        interpret=backend.compiler is None,
    )
    return _unpadded_cotangents(
        spec, weights, aux, query, key, value, grad_w[0], grad_b, dq[0], dk[0], dv[0]
    )


_mosaic_causal = _differentiable(_mosaic_causal_forward, _mosaic_causal_backward)
