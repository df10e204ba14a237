"""Causal prefix sums of linear attention with per-feature shifts, from log-features.

One head, one sequence. With query log-features la (T, m), key log-features lb (T, m) and values
v (T, p), the operation is

    Y_t = sum_{j <= t} sum_i exp(la_ti + lb_ji - M_t) v_j,      t = 0..T-1,

returned with its row shifts M (T,), constants under differentiation chosen by the op so that
every exponential is of a non-positive number and the row's largest term is exp(0) = 1.
``_prefix.causal_prefix`` factors each key into one scalar log-scale and features relative to it,
so a key's features far below its own largest one (by more than float32's e^-87) are lost before
any query can weigh them; here no factor is shared between features, so no term that matters to
row t underflows: the carried state is kept relative to a per-feature shift, and the terms within
a chunk are formed in log space.

The sequence is cut into chunks of length C. A ``lax.scan`` over chunks carries

    S_i = sum_{j < chunk} exp(lb_ji - c_i) v_j    (m, p),    c_i = max_{j < chunk} lb_ji,

(c depends on earlier chunks only: causal). Within a chunk, the weights of the C x C masked form
are W_tj = sum_i exp(la_ti + lb_ji - M_t) for j <= t (a (C, C, m) tensor), with

    M_t = max(max_{j <= t, i} (la_ti + lb_ji), max_i (la_ti + c_i)),

and Y_t = sum_j W_tj v_j + sum_i exp(la_ti + c_i - M_t) S_i. M_t reads positions <= t only, and
later keys enter only through selections (``jnp.where``), never products with 0, so output t is
bit-identical whatever later positions hold. Work per chunk: C^2 m exponentials, where the
scalar-shift op does a (C, m) x (m, C) product.

Gradients: plain autodiff of the scan with each chunk's step rematerialised
(``jax.checkpoint``), so the backward pass stores one (m, p) state and (m,) shift per chunk,
never the (C, C, m) tensors: O(T (m + p) + C^2 m + (T / C) m p) memory per head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax.attention._checks import log_floor, vary_like


def causal_log_prefix(
    la: jax.Array,
    lb: jax.Array,
    v: jax.Array,
    chunk: int,
    initial: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(Y (T, p), M (T,)): the chunked op of the module docstring.

    Args:
      la: query log-features, shape ``(T, m)``, finite.
      lb: key log-features, shape ``(T, m)``, finite (a key that must not count gets a very
        negative lb, e.g. ``_checks.log_floor``, and a zero row of ``v``).
      v: values, shape ``(T, p)`` (append a column of ones for the normaliser).
      chunk: chunk length C >= 1 (static; clipped to T).
      initial: ``(S_0, c_0)``, the state of keys before position 0: S_0 ``(m, p)`` relative to
        the per-feature shift c_0 ``(m,)`` (a constant), as the scan carries it; row t gains
        sum_i exp(la_ti + c_0i - M_t) S_0i. Default: no earlier keys (c_0 at the log floor).

    Returns:
      Y with Y_t = sum_{j <= t} sum_i exp(la_ti + lb_ji - M_t) v_j, and the row shifts M
      (``stop_gradient``), M_t >= every exponent of row t.
    """
    length, width = la.shape
    chunk = min(chunk, length)
    pad = -length % chunk
    floor = log_floor(lb.dtype)
    # Padded keys: lb at the floor and v = 0 (they add nothing); padded queries are dropped.
    la = jnp.pad(la, ((0, pad), (0, 0)))
    lb = jnp.pad(lb, ((0, pad), (0, 0)), constant_values=floor)
    v = jnp.pad(v, ((0, pad), (0, 0)))
    num_chunks = la.shape[0] // chunk

    def split(x: jax.Array) -> jax.Array:
        return x.reshape((num_chunks, chunk, *x.shape[1:]))

    causal = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))

    @jax.checkpoint
    def step(carry, inputs):
        state, shift = carry
        la_c, lb_c, v_c = inputs
        # (C, C, m): la_ti + lb_ji for j <= t, -inf (selected, not added) for j > t.
        pairs = jnp.where(causal[:, :, None], la_c[:, None, :] + lb_c[None, :, :], -jnp.inf)
        carried_logs = la_c + shift[None, :]
        row_shift = jax.lax.stop_gradient(
            jnp.maximum(jnp.max(pairs, axis=(1, 2)), jnp.max(carried_logs, axis=1))
        )
        weights = jnp.sum(jnp.exp(pairs - row_shift[:, None, None]), axis=-1)
        out = weights @ v_c + jnp.exp(carried_logs - row_shift[:, None]) @ state
        new_shift = jax.lax.stop_gradient(jnp.maximum(shift, jnp.max(lb_c, axis=0)))
        state = (
            jnp.exp(shift - new_shift)[:, None] * state + jnp.exp(lb_c - new_shift[None, :]).T @ v_c
        )
        return (state, new_shift), (out, row_shift)

    if initial is None:
        initial = (jnp.zeros((width, v.shape[1]), v.dtype), jnp.full((width,), floor, lb.dtype))
    init = (vary_like(initial[0], la, lb, v), vary_like(initial[1], la, lb, v))
    _, (out, row_shift) = jax.lax.scan(step, init, (split(la), split(lb), split(v)))
    return out.reshape((-1, v.shape[1]))[:length], row_shift.reshape(-1)[:length]


def shifted_state_sum(lb: jax.Array, v: jax.Array, shift: jax.Array, chunk: int) -> jax.Array:
    """sum_j exp(lb_j - shift) v_j^T ``(m, p)``, per feature, chunk by chunk.

    lb: ``(T, m)`` key log-features, v: ``(T, p)``, shift: ``(m,)`` with shift >= lb_j (a
    constant). The sum runs over the same zero-padded (T / C, C, .) split of lb and v that
    ``causal_log_prefix``'s scan reads, each chunk's (C, m) exponentials rematerialised in the
    backward pass, so neither pass holds a (T, m) array beside the prefix's own: one product
    ``exp(lb - shift).T @ v`` over the whole sequence keeps its (T, m) exponentials (issue 31:
    with it, sequence-parallel DERF at T = 64k on 4 devices needed 0.308 of one device's
    memory per device in the forward pass; 0.269 chunked).
    """
    chunk = min(chunk, lb.shape[0])
    pad = -lb.shape[0] % chunk
    lb = jnp.pad(lb, ((0, pad), (0, 0)), constant_values=log_floor(lb.dtype))
    v = jnp.pad(v, ((0, pad), (0, 0)))
    shift = jax.lax.stop_gradient(shift)

    @jax.checkpoint
    def step(total, inputs):
        lb_c, v_c = inputs
        return total + jnp.exp(lb_c - shift[None, :]).T @ v_c, None

    def split(z: jax.Array) -> jax.Array:
        return z.reshape((-1, chunk, z.shape[1]))

    init = vary_like(jnp.zeros((lb.shape[1], v.shape[1]), v.dtype), lb, v, shift)
    return jax.lax.scan(step, init, (split(lb), split(v)))[0]


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
