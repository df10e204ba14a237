"""Sequence-parallel (context-parallel) FAVOR: the cross-device steps of ``favor_attention(...,
sequence_axis=name)`` inside ``jax.shard_map``, on a sequence split along its length over the
mesh axis ``name`` (device d holds positions [d T/D, (d+1) T/D)).

* Bidirectional: each device sums its keys into (S, z) relative to its own key maximum c_d
  (``_bidirectional.key_value_summary``); ``psum_summary`` rescales them to the global maximum
  c = pmax(c_d) and sums them over the axis (``psum``), so every device reads out its queries
  against all keys.
* Causal: device d needs the state of all earlier devices, an exclusive scan of the per-device
  (S_d, z_d, c_d) under the online-softmax combination (S, c) + (S', c') = (S e^{c - c''} +
  S' e^{c' - c''}, c'' = max(c, c')). ``exclusive_state_scan`` does it by one ``all_gather`` and a
  masked sum: D states of m (H_v + 1) floats per head are small next to the T/D (m + H_v) of the
  local features, it is a single collective round (a ``ppermute`` ring needs D - 1 dependent
  rounds, a Hillis-Steele scan log2 D rounds of combines), its transpose (a reduce-scatter) gives
  the backward pass with no custom rule, and later devices' states enter only through
  ``jnp.where(earlier, ., 0)``: device d's output is computed from bit-identical inputs whatever
  devices > d hold, so the causal leak test holds across device boundaries. The running key
  maximum of device d starts at the maximum over earlier devices (never later ones).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax.attention._checks import log_floor, vary_like
from rfjax.attention._prefix import _pad_to_chunks, causal_prefix


def check_sequence_axis(sequence_axis: object) -> str | None:
    """``None``, or the name of a mesh axis bound by an enclosing ``jax.shard_map``."""
    if sequence_axis is None:
        return None
    if not isinstance(sequence_axis, str):
        raise TypeError(
            f"sequence_axis must be None or the name (str) of a mesh axis, got {sequence_axis!r}"
        )
    try:
        jax.lax.axis_size(sequence_axis)
    except NameError:
        raise ValueError(
            f"sequence_axis={sequence_axis!r} names no mesh axis of an enclosing jax.shard_map: "
            f"call favor_attention with sequence_axis inside jax.shard_map over a mesh with an "
            f"axis {sequence_axis!r} that splits the sequence (in_specs P(None, "
            f"{sequence_axis!r}) for (B, T, N, H) inputs), or pass sequence_axis=None"
        ) from None
    return sequence_axis


def psum_summary(
    kv: jax.Array, k_sum: jax.Array, shift: jax.Array, axis_name: str
) -> tuple[jax.Array, jax.Array]:
    """Bidirectional key sums of all devices from this device's.

    Args:
      kv: S_d = sum_j psi_j exp(mu_j - c_d) v_j^T over this device's keys, ``(B, N, m, H_v)``.
      k_sum: z_d = sum_j psi_j exp(mu_j - c_d), ``(B, N, m)``.
      shift: c_d, this device's key maximum, ``(B, N)`` (a constant under differentiation).
      axis_name: the mesh axis that splits the keys.

    Returns:
      (sum_d S_d exp(c_d - c), sum_d z_d exp(c_d - c)) with c = max_d c_d: the sums of the whole
      sequence relative to its key maximum, the same on every device.
    """
    shift = jax.lax.stop_gradient(shift)
    rescale = jnp.exp(shift - jax.lax.pmax(shift, axis_name))
    return jax.lax.psum((kv * rescale[..., None, None], k_sum * rescale[..., None]), axis_name)


def exclusive_state_scan(
    state: jax.Array, local_max: jax.Array, axis_name: str
) -> tuple[jax.Array, jax.Array]:
    """(sum_{e < d} S_e exp(c_e - C_d), C_d = max_{e < d} c_e) on device d of ``axis_name``.

    Args:
      state: S_d, this device's state ``(m, p)`` relative to ``local_max``.
      local_max: c_d, a scalar (a constant under differentiation).
      axis_name: the mesh axis that splits the sequence.

    Returns:
      The combined state of the earlier devices ``(m, p)`` and their maximum; on device 0 a zero
      state and the log floor (``_checks.log_floor``), which is below every key's log-scale.
    """
    states = jax.lax.all_gather(state, axis_name)
    maxima = jax.lax.all_gather(jax.lax.stop_gradient(local_max), axis_name)
    earlier = jnp.arange(states.shape[0]) < jax.lax.axis_index(axis_name)
    earlier_max = jnp.max(jnp.where(earlier, maxima, log_floor(state.dtype)))
    factors = jnp.exp(jnp.where(earlier, maxima - earlier_max, 0.0))
    masked = jnp.where(earlier[:, None, None], states, 0.0)
    return jnp.einsum("d,dmp->mp", jnp.where(earlier, factors, 0.0), masked), earlier_max


def earlier_devices_any(flag: jax.Array, axis_name: str) -> jax.Array:
    """Whether ``flag`` (a bool scalar) is set on any device before this one along the axis."""
    flags = jax.lax.all_gather(flag, axis_name)
    return jnp.any(flags & (jnp.arange(flags.shape[0]) < jax.lax.axis_index(axis_name)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def key_state(
    b: jax.Array, v: jax.Array, alpha: jax.Array, beta: jax.Array, chunk: int
) -> jax.Array:
    """This device's state S = sum_j exp(alpha_j - beta_last) b_j v_j^T ``(m, p)``.

    Shapes and contract as in ``causal_prefix`` (beta_last = ``beta[-1]`` >= every alpha). The
    sum runs chunk by chunk over the same padded (T / C, C, .) split of b, v and alpha that
    ``causal_prefix`` scans, so that XLA keeps one copy of the keys' features: the one-product
    form ``(b * w[:, None]).T @ v`` kept b live in a second layout next to the scan's and made
    a scaled copy (per device 0.30 of one device's memory at 4 devices instead of ~0.26;
    issue 15). The VJP is the two plain products (residuals: the inputs); alpha and beta are
    constants.
    """
    chunk = min(chunk, b.shape[0])
    _, b, v, alpha, beta = _pad_to_chunks(b, b, v, alpha, beta, chunk)
    num_chunks = b.shape[0] // chunk

    def split(x: jax.Array) -> jax.Array:
        return x.reshape((num_chunks, chunk, *x.shape[1:]))

    def step(state, inputs):
        b_c, v_c, alpha_c = inputs
        return state + (b_c * jnp.exp(alpha_c - beta[-1])[:, None]).T @ v_c, None

    init = vary_like(jnp.zeros((b.shape[1], v.shape[1]), v.dtype), b, v, alpha, beta)
    return jax.lax.scan(step, init, (split(b), split(v), split(alpha)))[0]


def _key_state_fwd(b, v, alpha, beta, chunk):
    return key_state(b, v, alpha, beta, chunk), (b, v, alpha, beta)


def _key_state_bwd(chunk, residuals, grad):
    b, v, alpha, beta = residuals
    weights = jnp.exp(alpha - beta[-1])[:, None]
    return (v * weights) @ grad.T, weights * (b @ grad), jnp.zeros_like(alpha), jnp.zeros_like(beta)


key_state.defvjp(_key_state_fwd, _key_state_bwd)


def sequence_parallel_prefix(
    a: jax.Array,
    b: jax.Array,
    v: jax.Array,
    alpha: jax.Array,
    beta: jax.Array,
    chunk: int,
    *,
    axis_name: str,
) -> jax.Array:
    """``_prefix.causal_prefix`` of a sequence split over ``axis_name``: this device's rows of Y.

    With the local shard's inputs (shapes and contract as in ``causal_prefix``, beta the local
    running maximum of alpha), Y_t = sum over all positions j <= t of the full sequence. The
    earlier devices' state enters as (a_t . S_<d) exp(C_d - beta'_t), with the running maximum
    beta'_t = max(C_d, beta_t) carried across the device boundary: it is ``causal_prefix``'s
    initial state (summed inside its scan, no (T/D, p) term outside) with beta', so the
    contract (beta' non-decreasing, alpha_j <= beta'_t, C_d <= beta'_0) and its bounded-memory
    VJP are kept. Gradients to earlier devices' keys and values flow back
    through the ``all_gather`` of ``exclusive_state_scan``.
    """
    alpha, beta = jax.lax.stop_gradient(alpha), jax.lax.stop_gradient(beta)
    local_max = beta[-1]  # >= every alpha of this shard
    state = key_state(b, v, alpha, beta, chunk)
    earlier_state, earlier_max = exclusive_state_scan(state, local_max, axis_name)
    beta = jnp.maximum(beta, earlier_max)
    return causal_prefix(a, b, v, alpha, beta, chunk, (earlier_state, earlier_max))
