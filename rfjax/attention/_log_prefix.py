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
* each chunk's output, three pieces: earlier chunks, exp(la_t + C^s - M_t) H_c (reference C^s);
  earlier blocks of the chunk, (exp(la_t + e_b' - M_t) . exp(lb_j - e_b')) v_j with the key
  block's own maximum e_b' as the reference (a B x B product per pair of blocks); the block's
  own keys j <= t, sum_i exp(la_ti + lb_ji - M_t) as a (B, B, m) form (no reference between
  a row and its own block's later keys would do), reduced over i.

Row t reads earlier chunks and blocks whole and its own block through ``jnp.where`` on j <= t,
so output t is bit-identical whatever later positions hold (later keys enter only through
selections, never products with 0).

**Gradients** (a ``jax.custom_vjp``): with G = dL/dY and D_tj = G_t . v_j,

    dla_ti = sum_{j <= t} P_tji D_tj,  dlb_ji = sum_{t >= j} P_tji D_tj,
    dv_j = sum_{t >= j} (sum_i P_tji) G_t,    P_tji = exp(la_ti + lb_ji - M_t),

formed by the same three pieces: the chunk states again for dla, and for dlb and dv the states
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
way. Memory per head: the rows, M, the (T / C, m, p) states in the backward pass (and the
forward pass on accelerators), and one chunk's (or ``CHUNKS_PER_STEP`` chunks') factors.

**Low precision** (``matmul_dtype``): the log-features, shifts, exponentials and states are
float32 (at least); the factors (each in [0, 1]) and values enter the products as
``matmul_dtype`` (bfloat16 for bfloat16 inputs), accumulated in float32.
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

# Positions per block of the in-chunk (B, B, m) form: the form costs B m exponentials per
# position, the blocks before it in the chunk (C / B - 1) / 2 products of m.
LOG_BLOCK = 16

# (params, rows (..., H), side) -> log-features (..., m), e.g. an exponential map's l(x).
LogFeatures = Callable[[Any, jax.Array, str], jax.Array]


def identity_logs(params: None, x: jax.Array, side: str) -> jax.Array:
    """Rows that are their own log-features (``causal_log_prefix``)."""
    del params, side
    return x


class PrefixOutputs(NamedTuple):
    """What ``causal_feature_prefix`` returns.

    Attributes:
      out: Y ``(T, p)``, in the accumulation dtype.
      row_shift: M ``(T,)`` (constants).
      query_bad: ``(T,)`` bool, queries whose log-features are not finite (their Y row is 0).
      key_bad: ``(T,)`` bool, valid keys whose log-features or values are not finite (left out).
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
) -> PrefixOutputs:
    """The op of the module docstring from rows: la = ``log_features(params, query, "query")``
    and lb = ``log_features(params, key, "key")``, chunk by chunk.

    Args:
      params: the feature map's parameters (a pytree; cotangents for its inexact leaves).
      query: ``(T, H)`` rows, finite (zero the rows that are not, and flag them yourself).
      key: ``(T, H)`` rows, finite where ``valid``.
      value: ``(T, p)``, finite where ``valid`` (append a column of ones for the normaliser:
        it is zeroed for the keys left out).
      valid: ``(T,)`` bool, the keys that count; a valid key whose log-features or value are
        not finite is left out too and flagged in ``key_bad``.
      log_features: a static function (params, rows, side) -> log-features ``(rows, m)``.
      chunk: chunk length C (see ``causal_log_prefix``).
      initial: ``(S_0, c_0)``, the earlier keys' state (see ``causal_log_prefix``).
      with_own_state: also return the keys' own state (sequence parallelism's VJP).
      matmul_dtype: the dtype of the products' operands (default: the accumulation dtype).

    Returns:
      ``PrefixOutputs``.
    """
    dtype = jnp.result_type(jnp.float32, query.dtype, key.dtype, value.dtype)
    no_earlier_keys = initial is None
    if no_earlier_keys:
        initial = _no_earlier_keys(params, query, value, log_features, dtype)
    options = _Options(
        log_features, chunk, with_own_state, jnp.dtype(matmul_dtype or dtype), no_earlier_keys
    )
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
) -> tuple[jax.Array, jax.Array]:
    """The keys' own state (S ``(m, p)``, c ``(m,)``): S = sum_j exp(lb_j - c) v_j^T over the
    valid keys with finite log-features and values, c = max_j lb_j (the log floor without
    any), chunk by chunk (no (T, m) array); not differentiable (sequence parallelism's forward
    pass)."""
    dtype = jnp.result_type(jnp.float32, key.dtype, value.dtype)
    options = _Options(log_features, chunk, False, jnp.dtype(dtype))
    x = _split_keys(key, value, valid, options)
    state, shift = _no_earlier_keys(params, key, value, log_features, dtype)
    keys = _key_pass(params, x, (state, shift), options)
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
) -> jax.Array:
    """dL/dS_0 = sum_t exp(la_t + c_0 - M_t) G_t^T ``(m, p)`` (the cotangent of
    ``causal_feature_prefix``'s initial state, for ``G`` = dL/dY and its row shifts M), chunk
    by chunk; not differentiable (sequence parallelism's VJP)."""
    dtype = jnp.result_type(jnp.float32, query.dtype, grad.dtype)
    options = _Options(log_features, chunk, False, jnp.dtype(dtype))
    length = query.shape[0]
    split = _Splitter(length, chunk)

    def summary(query, row_shift, grad):
        la = log_features(params, query, "query")
        la = jnp.where(_finite_rows(la)[..., None], la, 0).astype(dtype)
        return _dot(
            "sbm,sbp->mp", jnp.exp(la + initial_shift - row_shift[..., None]), grad, options
        )

    # Padded rows: M = inf, so exp(la + c_0 - M) = 0 (a zero cotangent times exp(.) could be NaN).
    row_shift = split(row_shift[:, None], jnp.inf)[..., 0]
    chunks = (split(query), row_shift, split(grad))
    if _chunks.fused_chunk_scan(jax.default_backend()):
        # One chunk's factors at a time (a batch of chunks would form the (T, m) features of a
        # device's whole shard at T / C <= CHUNKS_PER_STEP).
        total = vary_like(jnp.zeros((initial_shift.shape[-1], grad.shape[-1]), dtype), *chunks)
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


def _dot(spec: str, a: jax.Array, b: jax.Array, options: _Options) -> jax.Array:
    """``einsum`` with operands in ``matmul_dtype``, accumulated in (at least) float32."""
    accumulate = jnp.result_type(jnp.float32, a.dtype, b.dtype)
    md = options.matmul_dtype
    return jnp.einsum(spec, a.astype(md), b.astype(md), preferred_element_type=accumulate)


def _finite_rows(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x), axis=-1)


def _no_earlier_keys(params, query, value, log_features, dtype) -> tuple[jax.Array, jax.Array]:
    """(S_0, c_0) with no earlier keys: zeros at the log floor, of the log-features' width."""
    probe = jax.ShapeDtypeStruct((1, query.shape[-1]), dtype)
    width = jax.eval_shape(lambda x: log_features(params, x, "key"), probe).shape[-1]
    return (
        jnp.zeros((width, value.shape[-1]), dtype),
        jnp.full((width,), log_floor(dtype), dtype),
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
        would first copy them chunk-major: under ``vmap`` over batch and heads, a transposed
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
    """(lb, v, bad) of a chunk's keys: keys left out (not valid, or log-features or value not
    finite) get lb at the log floor and v = 0 (selected, so nothing non-finite reaches a
    product); ``bad`` flags the valid ones left out."""
    lb = options.log_features(params, key, "key").astype(dtype)
    usable = valid & _finite_rows(lb) & _finite_rows(value)
    lb = jnp.where(usable[..., None], lb, log_floor(dtype))
    return lb, jnp.where(usable[..., None], value, 0), valid & ~usable


def _query_logs(params, query, options: _Options, dtype):
    """(la, bad) of a chunk's queries: rows whose log-features are not finite get la = 0."""
    la = options.log_features(params, query, "query").astype(dtype)
    usable = _finite_rows(la)
    return jnp.where(usable[..., None], la, 0), ~usable


class _KeyPass(NamedTuple):
    """The keys' pass: per chunk the running maxima at its start and end (``(n, m)``,
    constants) and the state of the keys before it ``(n, m, p)`` (relative to its start), and
    the state after the last chunk (relative to the last end)."""

    start: jax.Array
    end: jax.Array
    states: jax.Array
    final_state: jax.Array


def _key_summary(params, key, value, valid, options: _Options, dtype):
    """A chunk's key maximum d_c ``(m,)`` (a constant) and summary sum_j exp(lb_j - d_c) v_j^T
    ``(m, p)``."""
    lb, v, _ = _key_logs(params, key, value, valid, options, dtype)
    top = jax.lax.stop_gradient(jnp.max(lb, axis=(0, 1)))
    return top, _dot("sbm,sbp->mp", jnp.exp(lb - top), v, options)


def _key_step(params, x: _Rows, options: _Options, dtype):
    """The CPU schedule's scan step over chunk indices c: carry (state before c, C^s_c) ->
    (state after c, C^e_c), emitting (state before c, C^s_c, C^e_c)."""

    def step(carry, chunk):
        state, start = carry
        top, summary = _key_summary(params, *x.keys_of(chunk), options, dtype)
        end = jnp.maximum(start, top)
        new_state = jnp.exp(start - end)[:, None] * state + jnp.exp(top - end)[:, None] * summary
        return (new_state, end), (state, start, end)

    return step


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
    summaries = jnp.exp(chunk_max - end)[..., None] * summaries
    states, final = chunk_states(summaries, jnp.exp(start - end), initial_state)
    return _KeyPass(start, end, states, final)


class _Keys(NamedTuple):
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


def _keys(lb: jax.Array, start: jax.Array) -> _Keys:
    block_max = jax.lax.stop_gradient(jnp.max(lb, axis=1))
    block_end = jnp.maximum(jax.lax.cummax(block_max, axis=0), start)
    block_start = jnp.concatenate([start[None], block_end[:-1]])
    return _Keys(jnp.exp(lb - block_max[:, None]), block_max, block_start)


def _block_pairs(la: jax.Array, lb: jax.Array) -> jax.Array:
    """la_ti + lb_ji within each block for j <= t, -inf (selected, not added) for j > t:
    ``(s, b, b, m)``."""
    block = la.shape[1]
    causal = jnp.tril(jnp.ones((block, block), dtype=bool))[:, :, None]
    return jnp.where(causal, la[:, :, None, :] + lb[:, None, :, :], -jnp.inf)


def _row_shift(la: jax.Array, lb: jax.Array, keys: _Keys) -> jax.Array:
    """M_t = max(max_i (la_ti + E_i), max_{j <= t in t's block, i} (la_ti + lb_ji)) ``(s, b)``:
    the row's largest exponent, from positions <= t only."""
    own_block = jnp.max(_block_pairs(la, lb), axis=(-2, -1))
    earlier = jnp.max(la + keys.block_start[:, None, :], axis=-1)
    return jax.lax.stop_gradient(jnp.maximum(own_block, earlier))


class _Chunk(NamedTuple):
    """One chunk's factors given its row shifts M: the keys', the queries' exp(la_t + E - M_t)
    ``(s, b, m)`` (each <= 1), and the blocks' own forms exp(la_ti + lb_ji - M_t) for j <= t,
    0 for j > t ``(s, b, b, m)``."""

    keys: _Keys
    query: jax.Array
    block_weights: jax.Array

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


def _chunk(la, lb, start, row_shift=None) -> tuple[_Chunk, jax.Array]:
    """(``_Chunk``, M): one chunk's factors, with its row shifts (formed unless given)."""
    keys = _keys(lb, start)
    if row_shift is None:
        row_shift = _row_shift(la, lb, keys)
    query = jnp.exp(la + keys.block_start[:, None] - row_shift[..., None])
    weights = jnp.exp(_block_pairs(la, lb) - row_shift[..., None, None])
    return _Chunk(keys, query, weights), row_shift


def _chunk_output(chunk: _Chunk, v, start, state, options: _Options) -> jax.Array:
    """One chunk's Y ``(s, b, p)`` given the earlier chunks' state ``(m, p)`` (relative to
    ``start``; ``None`` where there are none): its blocks' own keys, its earlier blocks, the
    earlier chunks."""
    weights = jnp.sum(chunk.block_weights, axis=-1)
    out = jnp.einsum("sij,sjp->sip", weights, v.astype(weights.dtype))
    blocks = v.shape[0]
    for offset in range(1, blocks):
        query, key = chunk.earlier_block(offset)
        scores = _dot("sim,sjm->sij", query, key, options)
        out = out.at[offset:].add(_dot("sij,sjp->sip", scores, v[: blocks - offset], options))
    if state is None:
        return out
    return out + _dot("sim,mp->sip", chunk.earlier_chunks_query(start), state, options)


def _chunk_cotangents(chunk: _Chunk, v, start, end, state, later, grad, options: _Options):
    """(dla, dlb, dv) ``(s, b, .)`` of one chunk: its blocks' own forms, its earlier blocks,
    the earlier chunks (``state``, relative to ``start``) and the later queries (``later``,
    relative to ``end``; ``None`` where there are none, a one-chunk sequence's backward pass;
    ``state`` ``None`` where no keys come before the chunk, ``_one_chunk_without_state``)."""
    weights = chunk.block_weights
    # D_tj within each block, selected for j <= t: a later key's product (huge or inf, e.g. the
    # floored normaliser's cotangent G / eps of a row without keys) never meets its 0 weight.
    products = _dot("sip,sjp->sij", grad, v, options)
    causal = jnp.tril(jnp.ones(products.shape[-2:], dtype=bool))
    products = jnp.where(causal, products, 0)[..., None]
    grad_la = jnp.sum(weights * products, axis=2)
    grad_lb = jnp.sum(weights * products, axis=1)
    grad_v = jnp.einsum("sij,sip->sjp", jnp.sum(weights, axis=-1), grad.astype(weights.dtype))
    blocks = v.shape[0]
    for offset in range(1, blocks):
        query, key = chunk.earlier_block(offset)
        values, grads = v[: blocks - offset], grad[offset:]
        products = _dot("sip,sjp->sij", grads, values, options)
        scores = _dot("sim,sjm->sij", query, key, options)
        grad_la = grad_la.at[offset:].add(query * _dot("sij,sjm->sim", products, key, options))
        grad_lb = grad_lb.at[: blocks - offset].add(
            key * _dot("sij,sim->sjm", products, query, options)
        )
        grad_v = grad_v.at[: blocks - offset].add(_dot("sij,sip->sjp", scores, grads, options))
    if state is not None:
        query = chunk.earlier_chunks_query(start)
        grad_la = grad_la + query * _dot("mp,sip->sim", state, grad, options)
    if later is not None:
        key = chunk.keys.relative_to(end)
        grad_lb = grad_lb + key * _dot("mp,sjp->sjm", later, v, options)
        grad_v = grad_v + _dot("sjm,mp->sjp", key, later, options)
    return grad_la, grad_lb, grad_v


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
    copied every output once more: 10% of the backward pass at T = 1k)."""
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
    """(outputs, row shifts as (n, s, b), the own state's shift or None, the CPU schedule's
    checkpoints or None: (state, C^s) at the start of each ``_segment_length`` chunks)."""
    dtype = initial[0].dtype
    x = _Rows.of(query, key, value, valid, options)
    split = x.split

    def output(query, key, value, valid, start, state):
        la, query_bad = _query_logs(params, query, options, dtype)
        lb, v, key_bad = _key_logs(params, key, value, valid, options, dtype)
        chunk, row_shift = _chunk(la, lb, start)
        out = _chunk_output(chunk, v, start, state, options)
        return (out, row_shift, query_bad, key_bad), (chunk, lb, v)

    if _chunks.fused_chunk_scan(jax.default_backend()):

        def step(carry, rows):
            state, start = carry
            outputs, (chunk, lb, v) = output(*rows, start, state)
            end = jnp.maximum(start, jax.lax.stop_gradient(jnp.max(lb, axis=(0, 1))))
            summary = _dot("sbm,sbp->mp", chunk.keys.relative_to(end), v, options)
            return (jnp.exp(start - end)[:, None] * state + summary, end), outputs

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
        own, own_shift = key_state(
            params, key, value, valid, log_features=options.log_features, chunk=options.chunk
        )
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

    def cotangents_of(query, key, value, valid, row_shift, start, end, state, later, grad):
        def logs(params, query, key, value):
            la, _ = _query_logs(params, query, options, dtype)
            lb, v, _ = _key_logs(params, key, value, valid, options, dtype)
            return la, lb, v

        (la, lb, v), pullback = jax.vjp(logs, params, query, key, value)
        chunk, _ = _chunk(la, lb, start, row_shift)
        grad_la, grad_lb, grad_v = _chunk_cotangents(
            chunk, v, start, end, state, later, grad, options
        )
        if own_grad is not None:  # S = sum_j exp(lb_j - c) v_j^T
            own = jnp.exp(lb - own_shift)
            grad_lb = grad_lb + own * _dot("mp,sbp->sbm", own_grad, v, options)
            grad_v = grad_v + _dot("sbm,mp->sbp", own, own_grad, options)
        query_summary = _dot("sbm,sbp->mp", chunk.earlier_chunks_query(start), grad, options)
        return pullback((grad_la, grad_lb, grad_v)), query_summary

    zero_params = _zero_cotangents(params)
    if _chunks.fused_chunk_scan(jax.default_backend()):
        key_step = _key_step(params, x, options, dtype)

        def step(carry, inputs):
            later, params_grad = carry
            chunk, *pieces, decay = inputs
            rows = x.rows_of(chunk)
            (grads, summary) = cotangents_of(*rows, *pieces, later, split.take(grad, chunk))
            params_grad = _add_cotangents(params_grad, grads[0])
            return (decay[:, None] * later + summary, params_grad), grads[1:]

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
            la, _ = _query_logs(params, query, options, dtype)
            factor = jnp.exp(la + start - row_shift[..., None])
            return _dot("sbm,sbp->mp", factor, grad, options)

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
