"""Causal prefix sums of linear attention with per-feature shifts, in the chunk-parallel form,
with the feature map fused in: the (T, m) features of a sequence are never formed.

One head, one sequence. With query log-features la (T, m), key log-features lb (T, m) (an
exponential feature map's l(x), phi = exp(l), computed here chunk by chunk from the rows of
query and key) and values v (T, p), the operation is

    Y_t = sum_{j <= t} sum_i exp(la_ti + lb_ji - M_t) v_j,      t = 0..T-1,

with row shifts M_t = max_{j <= t, i} (la_ti + lb_ji), constants under differentiation, so that
every exponential is of a non-positive number and the row's largest term is exp(0) = 1.
``_prefix.causal_prefix`` factors each key into one scalar log-scale and features relative to
it, so a key's features far below its own largest one (by more than float32's e^-87) are lost
before any query can weigh them; here no factor is shared between features, so no term that
matters to row t underflows.

**Why a product of two factors is exact.** Every term is formed as exp(x) exp(y) with
x + y = la_ti + lb_ji - M_t and x, y <= 0: for a reference r_i between the keys and the query,
x = la_ti + r_i - M_t and y = lb_ji - r_i. If the term is not negligible (above e^-87 of the
row's largest, 1) then x, y > -87 too, so neither factor underflows and the product carries
the term to a few ulps; if one factor underflows, the term was negligible. A reference works
for a set of keys and a set of queries when it lies between: r_i >= lb_ji for the keys and
r_i <= c_ti = max_{j <= t} lb_ji for the queries (then la_ti + r_i <= M_t).

**The chunk algorithm** (flash-linear-attention's and GLA's, ``fla/ops/common/chunk_h.py`` and
``chunk_o.py``, with per-feature references). The sequence is cut into chunks of C positions
and each chunk into blocks of B = ``LOG_BLOCK`` (C a whole number of blocks, T padded). With
per-feature maxima e (per block) and d (per chunk), and the running maxima at chunk starts
C^s_c = max(c_0, d_0..d_{c-1}), chunk ends C^e_c = max(C^s_c, d_c) and block starts E:

* chunk states, the keys before chunk c relative to C^s_c: per chunk U_c = sum_{j in c}
  exp(lb_j - d_c) v_j^T, then H_{c+1} = exp(C^s_c - C^e_c) H_c + exp(d_c - C^e_c) U_c by a
  scan over the chunk summaries only (``chunk_states``: T / C steps of (m, p) elementwise
  work);
* the row shifts, M_t = max(max_i (la_ti + E_i), max_{j <= t in t's block} (la_ti + lb_ji));
* each chunk's output, from the earlier chunks, exp(la_t + C^s - M_t) H_c (reference C^s), and
  from its own keys j <= t, sum_i exp(la_ti + lb_ji - M_t). No reference between a row and the
  chunk's later keys keeps both factors <= 1, but a bound does as well (``_log_chunk.Tame``):
  relative to r = max(C^s, lb_0), the chunk's start and its first key, the row factors
  exp(la_t + r - M_t) are <= 1, and a key whose factors exp(lb_j - r) stay within e^(L/2)
  (L = -ln of the smallest normal number) loses no term that matters, so such keys ("tame")
  enter as one C x C product selected for j <= t, as in flash-linear-attention. A key above
  the bound is formed by blocks: within its block per pair ((B, B, m), reduced over i), for
  the later blocks of the chunk as B x B products relative to its block's maximum e_b
  (exp(la_t + e_b - M_t) . exp(lb_j - e_b), both <= 1), in a loop that steps only when some key
  of the chunks formed at once is one. Nearly every key is tame: a sequence's first chunk at
  |k| ~ 30, where no earlier key sets the reference, is the common exception.
* the factors a chunk shares with the states, exp(la_t + C^s - M_t) and exp(lb_j - C^e), are
  its tame factors rescaled by exp(C^s - r) and exp(r - C^e), both <= 1 (a key that is not
  tame has exp(lb_j - C^e) formed apart, in the forward pass in the same kind of loop): a
  chunk's output and summary form two exponentials per position and feature, its cotangents
  three (the later queries' factor formed for every key and selected: inside the blocks' loop
  it took 0.4 MiB more temporaries at T = 256 and 1k; the accelerators' separate key pass,
  ``_key_summary``, one more).

Row t reads earlier chunks whole and its own chunk through ``jnp.where`` on j <= t, so output
t is bit-identical whatever later positions hold (later keys enter only through selections,
never products with 0; whether a key is tame depends on positions up to it, and the blocks'
loop, which later keys may make step, adds exactly 0 to the rows that read no key formed by
blocks).

**Gradients** (a ``jax.custom_vjp``): with G = dL/dY and D_tj = G_t . v_j,

    dla_ti = sum_{j <= t} P_tji D_tj,  dlb_ji = sum_{t >= j} P_tji D_tj,
    dv_j = sum_{t >= j} (sum_i P_tji) G_t,    P_tji = exp(la_ti + lb_ji - M_t),

formed by the same pieces: the chunk states again for dla, and for dlb and dv the states
of later queries, R_c = sum_{t after chunk c} exp(la_t + C^e_c - M_t) G_t^T, summed by the same
scan in reversed time (reference C^e_c: above chunk c's keys, below every later query's running
maximum). Each chunk's (dla, dlb) is pulled back through the feature map at once (``jax.vjp``
of the map on the chunk's rows), giving the rows' and the map's parameters' cotangents. The
residuals are the rows, the parameters and M.

**Two schedules, one computation per chunk** (``_chunks``): on a CPU one scan over
the chunks carries the state and forms each chunk's output from it (each chunk's work stays in
cache; no states are stored); on accelerators every chunk's key summary is formed first
(batched), then the states by the short scan, then the outputs of ``CHUNKS_PER_STEP`` chunks
at a time. The backward pass forms the chunk states by the first schedule's key pass either
way: on a CPU segment by segment (``_segment_length``, about sqrt(T / C) chunks each) from
checkpoints the forward pass keeps at each segment's start. Memory per head: the rows, M, the
(T / C, m, p) states in the backward pass on accelerators (and their forward pass), about
2 sqrt(T / C) of them on a CPU, and one chunk's (or ``CHUNKS_PER_STEP`` chunks') factors.

**Heads.** The op takes the rows of one head ``(T, H)`` or of N heads ``(T, N, H)``; with
heads, each chunk's rows are read in their layout and the feature map and the chunk's
arithmetic are mapped over the heads inside the chunk's step, so that the outputs and the
rows' cotangents are written in the rows' layout (a ``vmap`` of the whole op over heads
stacks them chunk-major and heads-first, then copies them back).

**Low precision** (``matmul_dtype``): the log-features, shifts, exponentials and states are
float32 (at least); the factors (each in [0, 1], but the tame keys' factors, at most
e^(L/2)) and values enter the products as ``matmul_dtype`` (bfloat16 for bfloat16 inputs),
accumulated in float32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rfjax.attention import _chunks
from rfjax.attention._checks import log_floor, vary_like
from rfjax.attention._chunks import chunk_states, map_chunks
from rfjax.attention._log_chunk import (
    chunk_cotangents,
    chunk_factors,
    chunk_output,
    dot,
)

# Positions per block, by which the keys that are not tame are formed (``_log_chunk.Tame``):
# within their block a (B, B, m) form, B m exponentials per position.
LOG_BLOCK = 16

# (params, rows (..., H), side) -> log-features (..., m), e.g. an exponential map's l(x).
LogFeatures = Callable[[Any, jax.Array, str], jax.Array]


def identity_logs(params: None, x: jax.Array, side: str) -> jax.Array:
    """Rows that are their own log-features (``causal_log_prefix``)."""
    del params, side
    return x


class PrefixOutputs(NamedTuple):
    """What ``causal_feature_prefix`` returns.

    Shapes for one head; rows with a heads axis ``(T, N, .)`` give ``(T, N, .)`` and
    ``(N, m, p)``.

    Attributes:
      out: Y ``(T, p)`` (p + 1 columns with ``normaliser``), in the accumulation dtype.
      row_shift: M ``(T,)`` (constants).
      query_bad: ``(T,)`` bool, queries whose rows or log-features are not finite (their Y row
        is 0).
      key_bad: ``(T,)`` bool, valid keys whose rows, log-features or values are not finite
        (left out).
      own_state: with ``with_own_state``, the keys' own state sum_j exp(lb_j - c) v_j^T ``(m, p)``
        relative to c = max_j lb_j (``key_state``), else ``None``.
    """

    out: jax.Array
    row_shift: jax.Array
    query_bad: jax.Array
    key_bad: jax.Array
    own_state: jax.Array | None


def causal_log_prefix(
    la: jax.Array,
    lb: jax.Array,
    v: jax.Array,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(Y (T, p), M (T,)) of the module docstring for given log-features.

    Args:
      la: query log-features, shape ``(T, m)``, finite.
      lb: key log-features, shape ``(T, m)``, finite (a key that must not count gets a very
        negative lb, e.g. ``_checks.log_floor``, and a zero row of ``v``).
      v: values, shape ``(T, p)`` (append a column of ones for the normaliser).
      chunk: chunk length C >= 1 (static; clipped to T, then rounded up to a whole number of
        blocks of ``min(LOG_BLOCK, C)`` positions): one (m, p) state per chunk.
      initial: ``(S_0, c_0)``, the state of keys before position 0: S_0 ``(m, p)`` relative to
        the per-feature shift c_0 ``(m,)`` (a constant); row t gains
        sum_i exp(la_ti + c_0i - M_t) S_0i. Default: no earlier keys (c_0 at the log floor).

    Returns:
      Y with Y_t = sum_{j <= t} sum_i exp(la_ti + lb_ji - M_t) v_j, and the row shifts M,
      M_t >= every exponent of row t.
    """
    valid = jnp.ones(la.shape[:1], bool)
    result = causal_feature_prefix(
        None, la, lb, v, valid, log_features=identity_logs, chunk=chunk, initial=initial
    )
    return result.out, result.row_shift


def causal_feature_prefix(
    params: Any,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    *,
    log_features: LogFeatures,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None = None,
    with_own_state: bool = False,
    matmul_dtype: Any = None,
    normaliser: bool = False,
    head_axes: Any = None,
) -> PrefixOutputs:
    """The op of the module docstring from rows: la = ``log_features(params, query, "query")``
    and lb = ``log_features(params, key, "key")``, chunk by chunk; for one head, or for N
    heads at once (rows ``(T, N, .)``: the outputs are formed in the rows' layout, so that no
    copy of them is made heads-first).

    Args:
      params: the feature map's parameters (a pytree; cotangents for its inexact leaves).
      query: ``(T, H)`` or ``(T, N, H)`` rows; a row that is not finite is zeroed before the
        map (so its derivative is finite) and flagged in ``query_bad``.
      key: ``(T, H)`` or ``(T, N, H)`` rows.
      value: ``(T, p)`` or ``(T, N, p)``.
      valid: ``(T,)`` bool, the keys that count; a valid key whose row, log-features or value
        are not finite is left out too and flagged in ``key_bad``.
      log_features: a static function (params, rows, side) -> log-features ``(rows, m)``, for
        one head.
      chunk: chunk length C (see ``causal_log_prefix``).
      initial: ``(S_0, c_0)``, the earlier keys' state (see ``causal_log_prefix``; with heads
        ``(N, m, p)`` and ``(N, m)``).
      with_own_state: also return the keys' own state (sequence parallelism's VJP).
      matmul_dtype: the dtype of the products' operands (default: the accumulation dtype).
      normaliser: append the normaliser's column to the values, 1 for the keys that count and
        0 for those left out (the output and the states get p + 1 columns).
      head_axes: with a heads axis, ``params``' axes over the heads (a ``jax.vmap`` in_axes
        prefix; ``None``: shared by the heads).

    Returns:
      ``PrefixOutputs``.
    """
    if query.ndim == 2:  # one head
        _check_one_head(head_axes)
        result = causal_feature_prefix(
            params,
            query[:, None],
            key[:, None],
            value[:, None],
            valid,
            log_features=log_features,
            chunk=chunk,
            initial=None if initial is None else jax.tree.map(lambda a: a[None], initial),
            with_own_state=with_own_state,
            matmul_dtype=matmul_dtype,
            normaliser=normaliser,
        )
        out, row_shift, query_bad, key_bad, own = result
        return PrefixOutputs(
            out[:, 0],
            row_shift[:, 0],
            query_bad[:, 0],
            key_bad[:, 0],
            None if own is None else own[0],
        )
    dtype = jnp.result_type(jnp.float32, query.dtype, key.dtype, value.dtype)
    no_earlier_keys = initial is None
    options = _Options(
        log_features,
        chunk,
        with_own_state,
        jnp.dtype(matmul_dtype or dtype),
        no_earlier_keys,
        head_axes,
        normaliser,
    )
    if no_earlier_keys:
        initial = _no_earlier_keys(params, query, value, options, dtype)
    # Inside shard_map the rows vary over mesh axes the parameters and the initial state may not
    # (replicated): their cotangents are per device, so they enter the op varying too, and the
    # transpose of that cast sums the cotangents over the devices.
    params, initial = jax.tree.map(
        lambda leaf: vary_like(jnp.asarray(leaf), query, key, value), (params, initial)
    )
    return PrefixOutputs(*_prefix(params, query, key, value, valid, initial, options))


def key_state(
    params: Any,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    *,
    log_features: LogFeatures,
    chunk: int,
    normaliser: bool = False,
    head_axes: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """The keys' own state (S ``(m, p)``, c ``(m,)``; rows with heads ``(T, N, .)`` give
    ``(N, m, p)``, ``(N, m)``): S = sum_j exp(lb_j - c) v_j^T over the valid keys with finite
    rows, log-features and values, c = max_j lb_j (the log floor without any), chunk by chunk
    (no (T, m) array); not differentiable (sequence parallelism's forward pass).
    ``normaliser``, ``head_axes``: as ``causal_feature_prefix``'s."""
    if key.ndim == 2:  # one head
        _check_one_head(head_axes)
        state, shift = key_state(
            params,
            key[:, None],
            value[:, None],
            valid,
            log_features=log_features,
            chunk=chunk,
            normaliser=normaliser,
        )
        return state[0], shift[0]
    dtype = jnp.result_type(jnp.float32, key.dtype, value.dtype)
    options = _Options(
        log_features, chunk, False, jnp.dtype(dtype), head_axes=head_axes, normaliser=normaliser
    )
    return _own_state(params, _split_keys(key, value, valid, options), options, dtype)


def _check_one_head(head_axes: Any) -> None:
    if head_axes is not None:
        raise ValueError("head_axes needs rows with a heads axis (T, N, H)")


def _own_state(params, x: _Rows, options: _Options, dtype) -> tuple[jax.Array, jax.Array]:
    """``key_state`` of the rows of ``x`` ``(N, m, p)``, ``(N, m)``."""
    initial = _no_earlier_keys(params, x.key, x.value, options, dtype)
    keys = _key_pass(params, x, initial, options)
    return keys.final_state, keys.end[-1]


def initial_state_cotangent(
    params: Any,
    query: jax.Array,
    row_shift: jax.Array,
    initial_shift: jax.Array,
    grad: jax.Array,
    *,
    log_features: LogFeatures,
    chunk: int,
    head_axes: Any = None,
) -> jax.Array:
    """dL/dS_0 = sum_t exp(la_t + c_0 - M_t) G_t^T ``(m, p)`` (the cotangent of
    ``causal_feature_prefix``'s initial state, for ``G`` = dL/dY and its row shifts M; rows
    with heads ``(T, N, H)``, M ``(T, N)``, c_0 ``(N, m)`` and G ``(T, N, p)`` give
    ``(N, m, p)``), chunk by chunk; not differentiable (sequence parallelism's VJP)."""
    if query.ndim == 2:  # one head
        _check_one_head(head_axes)
        one_head = (query[:, None], row_shift[:, None], initial_shift[None], grad[:, None])
        return initial_state_cotangent(params, *one_head, log_features=log_features, chunk=chunk)[0]
    dtype = jnp.result_type(jnp.float32, query.dtype, grad.dtype)
    options = _Options(log_features, chunk, False, jnp.dtype(dtype), head_axes=head_axes)
    split = _Splitter(query.shape[0], chunk)

    def summary(query, row_shift, grad):
        return _query_summary(params, query, row_shift, initial_shift, grad, options, dtype)

    # Padded rows: M = inf, so exp(la + c_0 - M) = 0 (a zero cotangent times exp(.) could be NaN).
    chunks = (split(query), split(row_shift, jnp.inf), split(grad))
    if _chunks.fused_chunk_scan(jax.default_backend()):
        # One chunk's factors at a time (a batch of chunks would form the (T, m) features of a
        # device's whole shard at T / C <= CHUNKS_PER_STEP).
        total = vary_like(jnp.zeros((*initial_shift.shape, grad.shape[-1]), dtype), *chunks)
        return jax.lax.scan(lambda total, rows: (total + summary(*rows), None), total, chunks)[0]
    return jnp.sum(map_chunks(summary, *chunks), axis=0)


def causal_log_prefix_quadratic(
    la: jax.Array, lb: jax.Array, v: jax.Array, row_shift: jax.Array
) -> jax.Array:
    """The same Y for given row shifts M as a (T, T, m) masked form: the reference for tests
    (O(T^2 m) memory)."""
    length = la.shape[0]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    pairs = la[:, None, :] + lb[None, :, :] - row_shift[:, None, None]
    weights = jnp.sum(jnp.exp(jnp.where(causal[:, :, None], pairs, -jnp.inf)), axis=-1)
    return weights @ v


# ----------------------------------------------------------------------------- the chunks


class _Options(NamedTuple):
    """The op's static arguments."""

    log_features: LogFeatures
    chunk: int
    with_own_state: bool
    matmul_dtype: Any
    # The state before the first chunk is zero (no initial state given): a one-chunk sequence
    # is formed without it (``_one_chunk_without_state``).
    no_earlier_keys: bool = False
    # params' axes over the rows' heads axis (a ``jax.vmap`` in_axes prefix).
    head_axes: Any = None
    # Append the normaliser's column (1 for the keys that count) to the values.
    normaliser: bool = False


def _finite_rows(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x), axis=-1)


def _over_heads(params, rows: jax.Array, side: str, options: _Options) -> jax.Array:
    """The log-features of rows ``(..., N, H)`` with the heads first ``(N, ..., m)``."""
    axis = rows.ndim - 2

    def head(params, rows):
        return options.log_features(params, rows, side)

    return jax.vmap(head, in_axes=(options.head_axes, axis))(params, rows)


def _no_earlier_keys(params, query, value, options: _Options, dtype):
    """(S_0, c_0) with no earlier keys ``(N, m, p)``, ``(N, m)``: zeros at the log floor, of
    the log-features' width."""
    probe = jax.ShapeDtypeStruct((1, *query.shape[1:]), dtype)
    heads, _, width = jax.eval_shape(lambda x: _over_heads(params, x, "key", options), probe).shape
    return (
        jnp.zeros((heads, width, value.shape[-1] + options.normaliser), dtype),
        jnp.full((heads, width), log_floor(dtype), dtype),
    )


class _Splitter(NamedTuple):
    """(T, .) <-> (n, s, b, .): T padded to n chunks of s blocks of b positions."""

    length: int
    chunk: int

    @property
    def shape(self) -> tuple[int, int, int]:
        chunk = min(self.chunk, self.length)
        block = min(LOG_BLOCK, chunk)
        chunk = -(-chunk // block) * block
        return -(-self.length // chunk), chunk // block, block

    def __call__(self, x: jax.Array, fill: Any = 0) -> jax.Array:
        return self.chunked(self.padded(x, fill))

    def padded(self, x: jax.Array, fill: Any = 0) -> jax.Array:
        """``(T, .)`` -> ``(T', .)``, T' = n s b (no copy when T' = T)."""
        chunks, blocks, block = self.shape
        size = chunks * blocks * block
        if size == self.length:
            return x
        pad = ((0, size - self.length),) + ((0, 0),) * (x.ndim - 1)
        return jnp.pad(x, pad, constant_values=fill)

    def chunked(self, padded: jax.Array) -> jax.Array:
        """``(T', .)`` -> ``(n, s, b, .)``."""
        return padded.reshape((*self.shape, *padded.shape[1:]))

    def take(self, padded: jax.Array, chunk: jax.Array | int) -> jax.Array:
        """Chunk ``chunk`` (traced) of ``(T', .)`` as ``(s, b, .)``: a slice of the rows, so a
        scan over chunk indices reads each chunk where it lies (a scan over ``chunked`` rows
        would first copy them chunk-major: under ``vmap`` over the batch, a transposed
        copy of the whole (B, T, N, H) array)."""
        _, blocks, block = self.shape
        rows = jax.lax.dynamic_slice_in_dim(padded, chunk * blocks * block, blocks * block)
        return rows.reshape((blocks, block, *padded.shape[1:]))

    def join(self, y: jax.Array) -> jax.Array:
        return y.reshape((-1, *y.shape[3:]))[: self.length]


class _Rows(NamedTuple):
    """The operands padded to whole chunks ``(T', .)`` (``split``); padded keys are not
    valid, padded queries are zeros (dropped)."""

    query: jax.Array | None
    key: jax.Array
    value: jax.Array
    valid: jax.Array
    split: _Splitter

    @staticmethod
    def of(query, key, value, valid, options: _Options) -> _Rows:
        split = _Splitter(key.shape[0], options.chunk)
        padded_query = None if query is None else split.padded(query)
        return _Rows(
            padded_query, split.padded(key), split.padded(value), split.padded(valid, False), split
        )

    @property
    def chunks(self) -> int:
        return self.split.shape[0]

    @property
    def operands(self) -> tuple[jax.Array | None, jax.Array, jax.Array, jax.Array]:
        """(query or None, key, value, valid), padded."""
        return self.query, self.key, self.value, self.valid

    def keys_of(self, chunk: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(key, value, valid) of chunk ``chunk`` ``(s, b, .)``."""
        take = self.split.take
        return take(self.key, chunk), take(self.value, chunk), take(self.valid, chunk)

    def rows_of(self, chunk: jax.Array | int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(query, key, value, valid) of chunk ``chunk`` ``(s, b, .)``."""
        assert self.query is not None
        return (self.split.take(self.query, chunk), *self.keys_of(chunk))

    def chunked(self) -> tuple[jax.Array, ...]:
        """The operands (query when given, key, value, valid) as ``(n, s, b, .)``."""
        return tuple(self.split.chunked(a) for a in self.operands if a is not None)


def _split_keys(key, value, valid, options: _Options) -> _Rows:
    return _Rows.of(None, key, value, valid, options)


def _key_logs(params, key, value, valid, options: _Options, dtype):
    """(lb, v, bad) of a chunk's keys ``(s, b, N, .)``, with the heads first: lb
    ``(N, s, b, m)``, v ``(N, s, b, p)``, bad ``(s, b, N)``. Keys left out (not valid, or rows,
    log-features or value not finite) get lb at the log floor and v = 0 (selected, so nothing
    non-finite reaches a product; their rows are zeroed before the map); ``bad`` flags the
    valid ones left out. With ``normaliser``, v gains the column of the keys that count."""
    usable = valid[..., None] & _finite_rows(key) & _finite_rows(value)
    lb = _over_heads(params, jnp.where(usable[..., None], key, 0), "key", options).astype(dtype)
    usable = usable & jnp.moveaxis(_finite_rows(lb), 0, -1)
    heads_first = jnp.moveaxis(usable, -1, 0)[..., None]
    lb = jnp.where(heads_first, lb, log_floor(dtype))
    v = jnp.where(heads_first, jnp.moveaxis(value, -2, 0), 0)
    if options.normaliser:
        v = jnp.concatenate([v, heads_first.astype(v.dtype)], axis=-1)
    return lb, v, valid[..., None] & ~usable


def _query_logs(params, query, options: _Options, dtype):
    """(la ``(N, s, b, m)``, bad ``(s, b, N)``) of a chunk's queries ``(s, b, N, H)``: rows
    that are not finite are zeroed before the map, and rows whose log-features are not finite
    get la = 0."""
    finite = _finite_rows(query)
    la = _over_heads(params, jnp.where(finite[..., None], query, 0), "query", options)
    usable = jnp.moveaxis(finite, -1, 0) & _finite_rows(la)
    return jnp.where(usable[..., None], la, 0).astype(dtype), jnp.moveaxis(~usable, 0, -1)


def _query_summary(params, query, row_shift, shift, grad, options: _Options, dtype):
    """sum_t exp(la_t + shift - M_t) G_t^T ``(N, m, p)`` over a chunk's queries ``(s, b, N, H)``
    (row shifts M ``(s, b, N)``, G ``(s, b, N, p)``, per-feature shift ``(N, m)``)."""
    la, _ = _query_logs(params, query, options, dtype)
    factor = jnp.exp(la + shift[:, None, None] - jnp.moveaxis(row_shift, -1, 0)[..., None])
    return dot("nsbm,sbnp->nmp", factor, grad, options.matmul_dtype)


class _KeyPass(NamedTuple):
    """The keys' pass: per chunk the running maxima at its start and end (``(n, m)``,
    constants) and the state of the keys before it ``(n, m, p)`` (relative to its start), and
    the state after the last chunk (relative to the last end)."""

    start: jax.Array
    end: jax.Array
    states: jax.Array
    final_state: jax.Array


def _key_summary(params, key, value, valid, options: _Options, dtype):
    """A chunk's key maximum d_c ``(N, m)`` (a constant) and summary sum_j exp(lb_j - d_c) v_j^T
    ``(N, m, p)``."""
    lb, v, _ = _key_logs(params, key, value, valid, options, dtype)
    top = jax.lax.stop_gradient(jnp.max(lb, axis=(1, 2)))
    return top, dot("nsbm,nsbp->nmp", jnp.exp(lb - top[:, None, None]), v, options.matmul_dtype)


def _key_step(params, x: _Rows, options: _Options, dtype):
    """The CPU schedule's scan step over chunk indices c: carry (state before c, C^s_c) ->
    (state after c, C^e_c), emitting (state before c, C^s_c, C^e_c)."""

    def step(carry, chunk):
        state, start = carry
        top, summary = _key_summary(params, *x.keys_of(chunk), options, dtype)
        end = jnp.maximum(start, top)
        new_state = _rescaled(state, start, end) + _rescaled(summary, top, end)
        return (new_state, end), (state, start, end)

    return step


def _rescaled(state: jax.Array, shift: jax.Array, new_shift: jax.Array) -> jax.Array:
    """A state ``(..., m, p)`` relative to ``shift`` ``(..., m)`` made relative to
    ``new_shift`` >= ``shift``."""
    return jnp.exp(shift - new_shift)[..., None] * state


def _key_pass(params, x: _Rows, initial, options: _Options) -> _KeyPass:
    """Each chunk's key maximum d_c and summary sum_j exp(lb_j - d_c) v_j^T, then the running
    maxima and the states (``chunk_states``); on a CPU (``fused_chunk_scan``) in one scan over
    the chunks, with no (n, m, p) summaries beside the states."""
    dtype = initial[0].dtype
    initial_state, initial_shift = initial
    initial_shift = jax.lax.stop_gradient(initial_shift)
    if _chunks.fused_chunk_scan(jax.default_backend()):
        carry = (vary_like(initial_state, *x.operands), vary_like(initial_shift, *x.operands))
        (final, _), (states, start, end) = jax.lax.scan(
            _key_step(params, x, options, dtype), carry, jnp.arange(x.chunks)
        )
        return _KeyPass(start, end, states, final)
    summary = functools.partial(_key_summary, params, options=options, dtype=dtype)
    chunk_max, summaries = map_chunks(summary, *x.chunked()[-3:])
    end = jnp.maximum(jax.lax.cummax(chunk_max, axis=0), initial_shift)
    start = jnp.concatenate([initial_shift[None], end[:-1]])
    summaries = _rescaled(summaries, chunk_max, end)
    states, final = chunk_states(summaries, jnp.exp(start - end), initial_state)
    return _KeyPass(start, end, states, final)


# ------------------------------------------------------------- forward, backward, custom VJP


def _one_chunk_without_state(x: _Rows, options: _Options) -> bool:
    """Whether the sequence is one chunk with no earlier keys: then it is formed without the
    earlier chunks' (zero) state. XLA's CPU backend (jaxlib 0.12.0.1) folds a zero state into
    the chunk's fusions, and a YNNPACK reduce fusion then reads memory it never wrote: outputs
    and gradients NaN in some processes (B = 4, T = 32, H = H_v = m = 64: about 1 in 3;
    ``tests/rfjax/attention/test_log_prefix.py``)."""
    return x.chunks == 1 and options.no_earlier_keys


# The shortest segment of the CPU schedule's backward pass (``_segment_length``): a sequence
# of at most this many chunks is one segment, whose states take a few MiB (T = 2k, C = 64:
# 32 states of (m, p) per head); segments of 4 chunks cost 4% more time at T = 1k.
MIN_SEGMENT = 32


def _segment_length(chunks: int) -> int:
    """Chunks per segment of the CPU schedule: the smallest divisor K of ``chunks`` with
    K^2 >= ``chunks`` and K >= ``MIN_SEGMENT`` (all of them if fewer). The forward pass keeps
    the state at each segment's start (n / K of them) and the backward pass forms one
    segment's K states again at a time, instead of storing all n (m, p) states (at T = 64k
    and C = 64, 1,024 states per head: as many bytes as the head's (T, m) features when
    p = C)."""
    length = min(chunks, max(MIN_SEGMENT, math.isqrt(chunks - 1) + 1))
    while chunks % length:
        length += 1
    return length


def _scan_keeping_checkpoints(step, carry, chunks: int):
    """``lax.scan(step, carry, arange(chunks))`` that also keeps the carry at the start of each
    ``_segment_length`` chunks: (those checkpoints ``(n / K, ...)``, the outputs ``(n, ...)``).
    One flat scan: each step rewrites its segment's slot in place, with the carry where the
    step starts the segment and the slot's own value otherwise (a scan over segments of scans
    copied every output once more: 10% more forward + backward time at T = 1k)."""
    length = _segment_length(chunks)

    def keeping(both, chunk):
        carry, checkpoints = both
        slot = chunk // length

        def put(buffer, value):
            kept = jnp.where(chunk % length == 0, value, buffer[slot])
            return jax.lax.dynamic_update_index_in_dim(buffer, kept, slot, 0)

        checkpoints = jax.tree.map(put, checkpoints, carry)
        carry, outputs = step(carry, chunk)
        return (carry, checkpoints), outputs

    empty = jax.tree.map(
        lambda a: vary_like(jnp.zeros((chunks // length, *a.shape), a.dtype), a), carry
    )
    (_, checkpoints), outputs = jax.lax.scan(keeping, (carry, empty), jnp.arange(chunks))
    return checkpoints, outputs


def _forward(params, query, key, value, valid, initial, options: _Options):
    """(outputs, row shifts as (n, s, b, N), the own state's shift or None, the CPU schedule's
    checkpoints or None: (state, C^s) at the start of each ``_segment_length`` chunks)."""
    dtype = initial[0].dtype
    x = _Rows.of(query, key, value, valid, options)
    split = x.split

    def head_output(la, lb, v, start, state, end):
        chunk, row_shift = chunk_factors(la, lb, start, matmul_dtype=options.matmul_dtype)
        out, summary = chunk_output(chunk, v, start, state, options.matmul_dtype, end)
        return out, row_shift, summary

    def output(query, key, value, valid, start, state, summed=False):
        """(the chunk's outputs, (with ``summed`` its keys' summary and C^e, else None))"""
        la, query_bad = _query_logs(params, query, options, dtype)
        lb, v, key_bad = _key_logs(params, key, value, valid, options, dtype)
        end = None
        if summed:
            end = jnp.maximum(start, jax.lax.stop_gradient(jnp.max(lb, axis=(1, 2))))
        out, row_shift, summary = jax.vmap(head_output)(la, lb, v, start, state, end)
        outputs = (jnp.moveaxis(out, 0, 2), jnp.moveaxis(row_shift, 0, 2), query_bad, key_bad)
        return outputs, (summary, end)

    if _chunks.fused_chunk_scan(jax.default_backend()):

        def step(carry, rows):
            state, start = carry
            outputs, (summary, end) = output(*rows, start, state, summed=True)
            return (_rescaled(state, start, end) + summary, end), outputs

        rows = x.operands
        initial = (
            vary_like(initial[0], *rows),
            vary_like(jax.lax.stop_gradient(initial[1]), *rows),
        )
        checkpoints = jax.tree.map(lambda a: a[None], initial)
        if _one_chunk_without_state(x, options):
            first, _ = output(*x.rows_of(0), initial[1], None)
            outputs = jax.tree.map(lambda a: a[None], first)
        else:
            checkpoints, outputs = _scan_keeping_checkpoints(
                lambda carry, c: step(carry, x.rows_of(c)), initial, x.chunks
            )
    else:
        keys = _key_pass(params, x, initial, options)
        outputs = map_chunks(lambda *a: output(*a)[0], *x.chunked(), keys.start, keys.states)
        checkpoints = None
    out, row_shift, query_bad, key_bad = outputs
    own = own_shift = None
    if options.with_own_state:
        own, own_shift = _own_state(params, x, options, dtype)
    flat = (split.join(out), split.join(row_shift), split.join(query_bad), split.join(key_bad))
    return (*flat, own), row_shift, own_shift, checkpoints


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _prefix(params, query, key, value, valid, initial, options):
    return _forward(params, query, key, value, valid, initial, options)[0]


def _prefix_fwd(params, query, key, value, valid, initial, options):
    outputs, *residuals = _forward(params, query, key, value, valid, initial, options)
    return outputs, (params, query, key, value, valid, initial, *residuals)


def _prefix_bwd(options: _Options, residuals, cotangents):
    params, query, key, value, valid, initial, row_shift, own_shift, checkpoints = residuals
    grad, _, _, _, own_grad = cotangents  # M and the flags are constants
    dtype = initial[0].dtype
    x = _Rows.of(query, key, value, valid, options)
    split = x.split
    grad = split.padded(grad.astype(dtype))

    def head_cotangents(la, lb, v, row_shift, start, end, state, later, grad, own):
        chunk, _ = chunk_factors(la, lb, start, row_shift, options.matmul_dtype)
        grad_la, grad_lb, grad_v = chunk_cotangents(
            chunk, v, start, end, state, later, grad, options.matmul_dtype
        )
        if own is not None:  # S = sum_j exp(lb_j - c) v_j^T
            own_grad, own_shift = own
            factor = jnp.exp(lb - own_shift)
            grad_lb = grad_lb + factor * dot("mp,sbp->sbm", own_grad, v, options.matmul_dtype)
            grad_v = grad_v + dot("sbm,mp->sbp", factor, own_grad, options.matmul_dtype)
        query_summary = dot(
            "sbm,sbp->mp", chunk.earlier_chunks_query(start), grad, options.matmul_dtype
        )
        return (grad_la, grad_lb, grad_v), query_summary

    def cotangents_of(query, key, value, valid, row_shift, start, end, state, later, grad):
        """((params, query, key, value) cotangents, the later queries' summary) of a chunk:
        the rows ``(s, b, N, .)``, row shifts and G in the rows' layout, the rest heads
        first."""

        def logs(params, query, key, value):
            la, _ = _query_logs(params, query, options, dtype)
            lb, v, _ = _key_logs(params, key, value, valid, options, dtype)
            return la, lb, v

        (la, lb, v), pullback = jax.vjp(logs, params, query, key, value)
        own = None if own_grad is None else (own_grad, own_shift)
        heads_first = (jnp.moveaxis(row_shift, -1, 0), jnp.moveaxis(grad, -2, 0))
        grads, query_summary = jax.vmap(head_cotangents)(
            la, lb, v, heads_first[0], start, end, state, later, heads_first[1], own
        )
        return pullback(grads), query_summary

    zero_params = _zero_cotangents(params)
    if _chunks.fused_chunk_scan(jax.default_backend()):
        key_step = _key_step(params, x, options, dtype)

        def step(carry, inputs):
            later, params_grad = carry
            chunk, *pieces, decay = inputs
            rows = x.rows_of(chunk)
            (grads, summary) = cotangents_of(*rows, *pieces, later, split.take(grad, chunk))
            params_grad = _add_cotangents(params_grad, grads[0])
            return (decay[..., None] * later + summary, params_grad), grads[1:]

        if x.chunks == 1:
            # One chunk has no later queries: formed without a zero state, which XLA's CPU
            # backend (jaxlib 0.12.0.1) folds into the in-block sums' fusion when the scan has
            # one step, and its YNNPACK reduce fusion then reads memory it never wrote (dk NaN
            # in some processes; tests/rfjax/attention/test_log_prefix.py). With more chunks the
            # state is the scan's carry; forming the last chunk apart there too cost 24% more
            # temporaries at T = 1024 (its pieces live beside the scan's).
            _, (state, start, end) = key_step(jax.tree.map(lambda a: a[0], checkpoints), 0)
            (params_grad, *row_grads), grad_initial = cotangents_of(
                *x.rows_of(0),
                row_shift[0],
                start,
                end,
                None if _one_chunk_without_state(x, options) else state,
                None,
                split.take(grad, 0),
            )
            row_grads = [g[None] for g in row_grads]
        else:
            # In reversed time, forming each segment's states again from the forward pass's
            # checkpoint (the keys' pass) at its last chunk, the first one reached.
            length = _segment_length(x.chunks)

            def segment_states(chunk):
                first = chunk // length * length
                checkpoint = jax.tree.map(lambda a: a[chunk // length], checkpoints)
                return jax.lax.scan(key_step, checkpoint, first + jnp.arange(length))[1]

            def step_in_segment(carry, inputs):
                *carry, segment = carry
                chunk, shift = inputs
                segment = jax.lax.cond(
                    chunk % length == length - 1,
                    segment_states,
                    lambda _: segment,
                    chunk,
                )
                state, start, end = (a[chunk % length] for a in segment)
                decay = jnp.exp(start - end)
                carry, grads = step(tuple(carry), (chunk, shift, start, end, state, decay))
                return (*carry, segment), grads

            rows = x.operands
            empty = jax.eval_shape(segment_states, 0)
            carry = (
                vary_like(jnp.zeros_like(initial[0]), *rows, grad),
                _vary_like_tree(zero_params, *rows),
                jax.tree.map(lambda a: vary_like(jnp.zeros(a.shape, a.dtype), *rows), empty),
            )
            (grad_initial, params_grad, _), row_grads = jax.lax.scan(
                step_in_segment, carry, (jnp.arange(x.chunks), row_shift), reverse=True
            )
    else:
        keys = _key_pass(params, x, initial, options)
        decays = jnp.exp(keys.start - keys.end)
        chunks = (*x.chunked(), row_shift, keys.start, keys.end, keys.states)
        grad = split.chunked(grad)

        def summary(query, row_shift, start, grad):
            return _query_summary(params, query, row_shift, start, grad, options, dtype)

        summaries = map_chunks(summary, chunks[0], row_shift, keys.start, grad)
        later, grad_initial = chunk_states(
            summaries, decays, jnp.zeros_like(initial[0]), reverse=True
        )
        params_grad, row_grads = _accumulate_chunks(
            lambda *a: cotangents_of(*a)[0], (*chunks, later, grad), zero_params
        )
    query_grad, key_grad, value_grad = (split.join(g) for g in row_grads)
    return (
        params_grad,
        query_grad,
        key_grad,
        value_grad,
        None,
        (grad_initial, jnp.zeros_like(initial[1])),
    )


def _zero_cotangents(params):
    """Zero cotangents of ``params``' leaves (float0 for integer leaves)."""

    def zero(leaf):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            return jnp.zeros_like(leaf)
        return jnp.zeros(leaf.shape, jax.dtypes.float0)

    return jax.tree.map(zero, params)


def _vary_like_tree(tree, *references):
    """``vary_like`` on each inexact leaf (float0 leaves cannot vary)."""
    return jax.tree.map(
        lambda z: z if z.dtype == jax.dtypes.float0 else vary_like(z, *references), tree
    )


def _accumulate_chunks(function, chunks: tuple, zero):
    """The sum over chunks of ``function(*chunk)[0]`` (a pytree like ``zero``) and its other
    outputs stacked: ``CHUNKS_PER_STEP`` chunks at a time, vmapped, in a scan that carries the
    sum (no (n, ...) stack of the first output). The chunk axis is padded with zero chunks,
    whose first output must be zero (a zero cotangent gives none)."""
    count = chunks[0].shape[0]
    group = min(_chunks.CHUNKS_PER_STEP, count)
    groups = -(-count // group)

    def in_groups(x):
        x = jnp.pad(x, ((0, groups * group - count),) + ((0, 0),) * (x.ndim - 1))
        return x.reshape((groups, group, *x.shape[1:]))

    def step(total, group_chunks):
        first, *rest = jax.vmap(function)(*group_chunks)
        summed = jax.tree.map(
            lambda g: g[0] if g.dtype == jax.dtypes.float0 else jnp.sum(g, axis=0), first
        )
        return _add_cotangents(total, summed), rest

    total, rest = jax.lax.scan(step, _vary_like_tree(zero, chunks), tuple(map(in_groups, chunks)))
    return total, tuple(x.reshape((-1, *x.shape[2:]))[:count] for x in rest)


def _add_cotangents(total, more):
    return jax.tree.map(lambda a, b: a if a.dtype == jax.dtypes.float0 else a + b, total, more)


_prefix.defvjp(_prefix_fwd, _prefix_bwd)
