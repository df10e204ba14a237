"""Causal prefix sums for linear attention, chunked, with log-scales and a memory-bounded VJP.

One head, one sequence. The operation is

    Y_t = sum_{j <= t} (a_t . b_j) exp(alpha_j - beta_t) v_j,      t = 0..T-1,

with a: (T, m), b: (T, m), v: (T, p), alpha, beta: (T,), under the contract

    beta is non-decreasing and alpha_j <= beta_t for all j <= t,

so that every exponential below is of a non-positive number (nothing overflows). With
beta = cummax(alpha) this is the causal FAVOR numerator/denominator with an online (running-max)
key stabiliser; with alpha = beta = 0 it is plain causal linear attention.

The sequence is cut into chunks of length C; the state S = sum_{j < chunk} exp(alpha_j -
beta_prev) b_j v_j^T (m, p) of the earlier chunks' keys is kept relative to beta_prev, the beta of
the last position already summed, and within a chunk the C x C masked quadratic form is used. On a
CPU a ``lax.scan`` over chunks carries S (O(T (m + p) + C^2 + m p) memory per head); on
accelerators every chunk's key summary is formed at once, the states by a scan over the summaries
only and the outputs batched over chunks (``_chunks``; (T / C, m, p) states more).

Gradients (``causal_prefix`` is a ``jax.custom_vjp``) are three calls of the same chunked op, two
of them in reversed time, so the backward pass keeps the same memory bound (residuals are only the
inputs). With G = dL/dY:

    da_t = sum_{j <= t} (G_t . v_j) exp(alpha_j - beta_t) b_j                 (same op)
    db_j = exp(alpha_j - beta_j) sum_{t >= j} (v_j . G_t) exp(beta_j - beta_t) a_t
    dv_j = exp(alpha_j - beta_j) sum_{t >= j} (b_j . a_t) exp(beta_j - beta_t) G_t

and the last two are the op on time-reversed inputs with log-scales -beta (which satisfies the
contract in reversed time, since beta is non-decreasing). alpha and beta are constants: their
cotangents are zero (callers pass values under ``stop_gradient``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax.attention import _chunks
from rfjax.attention._checks import vary_like
from rfjax.attention._chunks import chunk_states, map_chunks


def _pad_to_chunks(
    a: jax.Array, b: jax.Array, v: jax.Array, alpha: jax.Array, beta: jax.Array, chunk: int
) -> tuple[jax.Array, ...]:
    """Pads the time axis to a multiple of ``chunk`` with positions that contribute nothing."""
    length = a.shape[0]
    pad = -length % chunk
    if pad == 0:
        return a, b, v, alpha, beta
    last = beta[-1:]

    def zeros(x: jax.Array) -> jax.Array:
        return jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1))

    # b = 0 at padded keys (no contribution); alpha = beta = last beta keeps the contract.
    return (
        zeros(a),
        zeros(b),
        zeros(v),
        jnp.concatenate([alpha, jnp.broadcast_to(last, (pad,))]),
        jnp.concatenate([beta, jnp.broadcast_to(last, (pad,))]),
    )


def causal_prefix_scan(
    a: jax.Array,
    b: jax.Array,
    v: jax.Array,
    alpha: jax.Array,
    beta: jax.Array,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """The chunked op, differentiated by plain autodiff (stores one (m, p) state per chunk).

    Args:
      a: query-side features, shape ``(T, m)``.
      b: key-side features, shape ``(T, m)``.
      v: values, shape ``(T, p)``.
      alpha: key-side log-scales, shape ``(T,)``.
      beta: query-side log-scales, shape ``(T,)``, non-decreasing, ``alpha[j] <= beta[t]`` for
        ``j <= t``.
      chunk: chunk length C >= 1 (static).
      initial: ``(S_0, c_0)``, the state of keys before position 0, ``(m, p)`` relative to the
        scalar c_0 <= ``beta[0]``: Y_t gains (a_t . S_0) exp(c_0 - beta_t), added inside the
        scan (no (T, p) term outside it). Default: no earlier keys.

    Returns:
      Y, shape ``(T, p)``.
    """
    length, width = a.shape
    chunk = min(chunk, length)
    a, b, v, alpha, beta = _pad_to_chunks(a, b, v, alpha, beta, chunk)
    num_chunks = a.shape[0] // chunk

    def split(x: jax.Array) -> jax.Array:
        return x.reshape((num_chunks, chunk, *x.shape[1:]))

    chunks = tuple(map(split, (a, b, v, alpha, beta)))
    if initial is None:
        initial = (jnp.zeros((width, v.shape[1]), v.dtype), beta[0])
    if _chunks.fused_chunk_scan(jax.default_backend()):

        def step(carry, inputs):
            state, beta_prev = carry
            a_c, b_c, v_c, alpha_c, beta_c = inputs
            out = _chunk_output(a_c, b_c, v_c, alpha_c, beta_c, beta_prev, state)
            beta_last = beta_c[-1]
            state = jnp.exp(beta_prev - beta_last) * state + _key_summary(
                b_c, v_c, alpha_c, beta_last
            )
            return (state, beta_last), out

        init = (vary_like(initial[0], a, b, v, alpha, beta), vary_like(initial[1], beta))
        _, out = jax.lax.scan(step, init, chunks)
    else:
        # Each chunk's keys relative to its last beta, then the states relative to the last
        # beta of the chunk before (the initial shift for the first).
        last = chunks[4][:, -1]
        previous = jnp.concatenate([jnp.reshape(initial[1], (1,)), last[:-1]])
        summaries = map_chunks(_key_summary, chunks[1], chunks[2], chunks[3], last)
        states, _ = chunk_states(summaries, jnp.exp(previous - last)[:, None], initial[0])
        out = map_chunks(_chunk_output, *chunks, previous, states)
    return out.reshape((-1, v.shape[1]))[:length]


def _key_summary(b_c, v_c, alpha_c, beta_last):
    """sum_j exp(alpha_j - beta_last) b_j v_j^T over one chunk's keys ``(m, p)``."""
    return (b_c * jnp.exp(alpha_c - beta_last)[:, None]).T @ v_c


def _chunk_output(a_c, b_c, v_c, alpha_c, beta_c, beta_prev, state):
    """One chunk's rows of Y given the earlier keys' state S ``(m, p)`` relative to
    ``beta_prev`` <= beta_t."""
    causal = jnp.tril(jnp.ones((a_c.shape[0],) * 2, dtype=bool))
    # Within the chunk: weights (a_t . b_j) exp(alpha_j - beta_t) for j <= t, exactly 0 else
    # (selected, not multiplied by 0: a later key's overflow must not reach row t).
    exponent = jnp.where(causal, alpha_c[None, :] - beta_c[:, None], 0.0)
    weights = jnp.where(causal, jnp.exp(exponent) * (a_c @ b_c.T), 0.0)
    return weights @ v_c + jnp.exp(beta_prev - beta_c)[:, None] * (a_c @ state)


def weighted_outer_sum(x: jax.Array, y: jax.Array, log_weight: jax.Array, chunk: int) -> jax.Array:
    """sum_t exp(log_weight_t) x_t y_t^T ``(m, p)``, chunk by chunk.

    x: ``(T, m)``, y: ``(T, p)``, log_weight: ``(T,)`` (<= 0 in use, so nothing overflows). The
    sum runs over the same zero-padded (T / C, C, .) split of x and y that ``causal_prefix``'s
    scans read, so that XLA keeps one copy of them: one product ``(x * w[:, None]).T @ y`` over
    the whole sequence is a second consumer of x in another layout, plus a scaled copy and its
    transpose, each (T, m) (issue 15: 0.30 of one device's memory per device at 4 devices
    instead of ~0.26). Used for a key state sum_j exp(alpha_j - beta_{T-1}) b_j v_j^T and for
    the cotangent of ``causal_prefix``'s initial state.
    """
    chunk = min(chunk, x.shape[0])
    pad = -x.shape[0] % chunk
    x, y, log_weight = (
        jnp.pad(z, ((0, pad),) + ((0, 0),) * (z.ndim - 1)) for z in (x, y, log_weight)
    )

    def split(z: jax.Array) -> jax.Array:
        return z.reshape((-1, chunk, *z.shape[1:]))

    def step(total, inputs):
        x_c, y_c, log_weight_c = inputs
        return total + (x_c * jnp.exp(log_weight_c)[:, None]).T @ y_c, None

    init = vary_like(jnp.zeros((x.shape[1], y.shape[1]), y.dtype), x, y, log_weight)
    return jax.lax.scan(step, init, (split(x), split(y), split(log_weight)))[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def causal_prefix(
    a: jax.Array,
    b: jax.Array,
    v: jax.Array,
    alpha: jax.Array,
    beta: jax.Array,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """``causal_prefix_scan`` with a VJP that recomputes chunk by chunk (bounded memory)."""
    return causal_prefix_scan(a, b, v, alpha, beta, chunk, initial)


def _causal_prefix_fwd(a, b, v, alpha, beta, chunk, initial):
    return causal_prefix(a, b, v, alpha, beta, chunk, initial), (a, b, v, alpha, beta, initial)


def prefix_cotangents(
    a: jax.Array,
    b: jax.Array,
    v: jax.Array,
    alpha: jax.Array,
    beta: jax.Array,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None,
    grad: jax.Array,
    final_state_grad: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dL/da, dL/db, dL/dv) of ``causal_prefix`` by three chunked passes of the op itself.

    Args:
      a, b, v, alpha, beta, chunk, initial: the op's arguments (``causal_prefix_scan``).
      grad: G = dL/dY, shape ``(T, p)``.
      final_state_grad: optionally the cotangent ``(m, p)`` of the keys' own final state
        S_T = sum_j exp(alpha_j - beta_{T-1}) b_j v_j^T (``weighted_outer_sum``) when the
        caller also used it (sequence parallelism passes it to later devices). Its terms
        exp(alpha_j - beta_{T-1}) (v_j^T dS^T, b_j^T dS) enter the two reversed-time passes as
        their initial state (dS^T or dS, -beta_{T-1}), summed chunk by chunk like the rest:
        no (T, m) or (T, p) array next to those passes' own.

    Returns:
      The three cotangents, shaped like a, b and v.
    """
    # With an initial state, da_t gains (G_t . S_0^T) exp(c_0 - beta_t): the op's own carried
    # term, so the same op with the initial state (S_0^T, c_0).
    transposed = None if initial is None else (initial[0].T, initial[1])
    grad_a = causal_prefix(grad, v, b, alpha, beta, chunk, transposed)
    # Anti-causal sums: reverse time, log-scales -beta, then the per-key factor
    # exp(alpha_j - beta_j) <= 1. A final-state cotangent starts the reversed scans relative
    # to -beta_{T-1}, the first reversed log-scale (so the contract holds).
    flip_neg_beta = -beta[::-1]
    key_factor = jnp.exp(alpha - beta)[:, None]
    start_b = start_v = None
    if final_state_grad is not None:
        start_b, start_v = (final_state_grad.T, -beta[-1]), (final_state_grad, -beta[-1])

    def reversed_prefix(x, y, z, start):
        flipped = causal_prefix(
            x[::-1], y[::-1], z[::-1], flip_neg_beta, flip_neg_beta, chunk, start
        )
        return key_factor * flipped[::-1]

    grad_b = reversed_prefix(v, grad, a, start_b)
    grad_v = reversed_prefix(b, a, grad, start_v)
    return grad_a, grad_b, grad_v


def _causal_prefix_bwd(chunk, residuals, grad):
    a, b, v, alpha, beta, initial = residuals
    grad_a, grad_b, grad_v = prefix_cotangents(a, b, v, alpha, beta, chunk, initial, grad)
    grad_initial = None
    if initial is not None:
        # dS_0 = sum_t exp(c_0 - beta_t) a_t G_t^T; c_0, like alpha and beta, is a constant.
        shift = initial[1]
        grad_initial = (
            weighted_outer_sum(a, grad, shift - beta, chunk),
            jnp.zeros_like(shift),
        )
    return grad_a, grad_b, grad_v, jnp.zeros_like(alpha), jnp.zeros_like(beta), grad_initial


causal_prefix.defvjp(_causal_prefix_fwd, _causal_prefix_bwd)


def causal_prefix_quadratic(
    a: jax.Array, b: jax.Array, v: jax.Array, alpha: jax.Array, beta: jax.Array
) -> jax.Array:
    """The same op as a (T, T) masked quadratic form: the reference for tests (O(T^2) memory)."""
    length = a.shape[0]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    exponent = jnp.where(causal, alpha[None, :] - beta[:, None], -jnp.inf)
    return (jnp.exp(exponent) * (a @ b.T)) @ v
