"""Sequence-parallel (context-parallel) FAVOR: the cross-device steps of ``favor_attention(...,
sequence_axis=name)`` inside ``jax.shard_map``, on a sequence split along its length over the
mesh axis ``name`` (device d holds positions [d T/D, (d+1) T/D)).

* Bidirectional: each device sums its keys into (S, z) relative to its own key maximum c_d
  (``_bidirectional.key_value_summary``); ``psum_summary`` rescales them to the global maximum
  c = pmax(c_d) and sums them over the axis (``psum``), so every device reads out its queries
  against all keys.
* Causal: device d needs the state of all earlier devices, an exclusive scan of the per-device
  (S_d, z_d, c_d) under the online-softmax combination (S, c) + (S', c') = (S e^{c - c''} +
  S' e^{c' - c''}, c'' = max(c, c')). It is done by an ``all_gather`` of the D key maxima
  (``earlier_weights``: each device's running maximum is known before it sums its state) and
  one of the D states with a masked sum (``exclusive_state_sum``): D states of m (H_v + 1)
  floats per head are small next to the T/D (m + H_v) of the local features, it is a single
  collective round per quantity (a ``ppermute`` ring needs D - 1 dependent rounds, a
  Hillis-Steele scan log2 D rounds of combines), its transpose is one reduce-scatter
  (``exclusive_state_sum_transpose``), and later devices' states enter only through
  ``jnp.where(earlier, ., 0)``: device d's output is computed from bit-identical inputs whatever
  devices > d hold, so the causal leak test holds across device boundaries. The running key
  maximum of device d starts at the maximum over earlier devices (never later ones).
  ``sequence_parallel_prefix`` has its own VJP so that the gradient, like the forward pass,
  needs per device what one device needs at T / D (issue 15).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rfjax.attention._checks import log_floor
from rfjax.attention._log_prefix import causal_log_prefix, shifted_state_sum
from rfjax.attention._prefix import causal_prefix, prefix_cotangents, weighted_outer_sum


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
      kv: S_d = sum_j f_j exp(g_j - c_d) v_j^T over this device's keys, ``(B, N, m, H_v)``.
      k_sum: z_d = sum_j f_j exp(g_j - c_d), ``(B, N, m)``.
      shift: c_d, this device's key maximum, ``(B, N, w)``: one per head (w = 1) or per feature
        (w = m) (a constant under differentiation).
      axis_name: the mesh axis that splits the keys.

    Returns:
      (sum_d S_d exp(c_d - c), sum_d z_d exp(c_d - c)) with c = max_d c_d: the sums of the whole
      sequence relative to its key maximum, the same on every device.
    """
    shift = jax.lax.stop_gradient(shift)
    rescale = jnp.exp(shift - jax.lax.pmax(shift, axis_name))
    return jax.lax.psum((kv * rescale[..., None], k_sum * rescale), axis_name)


def earlier_devices_any(flag: jax.Array, axis_name: str) -> jax.Array:
    """Whether ``flag`` (a bool scalar) is set on any device before this one along the axis."""
    flags = jax.lax.all_gather(flag, axis_name)
    return jnp.any(flags & (jnp.arange(flags.shape[0]) < jax.lax.axis_index(axis_name)))


def earlier_weights(local_max: jax.Array, axis_name: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """How the device states of ``axis_name`` combine into this device's earlier state.

    Args:
      local_max: c_d, this device's key maximum, a scalar (a constant under differentiation).
      axis_name: the mesh axis that splits the sequence.

    Returns:
      ``(weights, earlier, earlier_max)`` on device d: C_d = max_{e < d} c_e (on device 0 the
      log floor ``_checks.log_floor``, below every key's log-scale), ``earlier`` the (D,) mask
      e < d and weights_e = exp(B_e - C_d) <= 1 for e < d, 0 else, where B_e = max_{e' <= e}
      c_{e'} is the running maximum at the end of device e, relative to which device e keeps
      its state S_e. Only the maxima of earlier devices enter.
    """
    maxima = jax.lax.all_gather(jax.lax.stop_gradient(local_max), axis_name)
    earlier = jnp.arange(maxima.shape[0]) < jax.lax.axis_index(axis_name)
    earlier_max = jnp.max(jnp.where(earlier, maxima, log_floor(maxima.dtype)))
    exponents = jnp.where(earlier, jax.lax.cummax(maxima) - earlier_max, 0.0)
    return jnp.where(earlier, jnp.exp(exponents), 0.0), earlier, earlier_max


def exclusive_state_sum(
    state: jax.Array, weights: jax.Array, earlier: jax.Array, axis_name: str
) -> jax.Array:
    """sum_{e < d} weights_e S_e ``(m, p)`` on device d: the earlier devices' state (``state``
    is this device's S_d; ``weights``, ``earlier`` from ``earlier_weights``). Later devices'
    states enter only through ``jnp.where(earlier, ., 0)``."""
    states = jax.lax.all_gather(state, axis_name)
    return jnp.einsum("d,dmp->mp", weights, jnp.where(earlier[:, None, None], states, 0.0))


def exclusive_state_sum_transpose(
    grad: jax.Array, weights: jax.Array, earlier: jax.Array, axis_name: str
) -> jax.Array:
    """The transpose of ``exclusive_state_sum``: from each device e's cotangent G_e of its
    earlier state, this device's dL/dS_d = sum_{e > d} weights^{(e)}_d G_e ``(m, p)``, by one
    reduce-scatter (``psum_scatter``) of the (D, m, p) contributions."""
    contributions = jnp.where(earlier[:, None, None], weights[:, None, None] * grad, 0.0)
    return jax.lax.psum_scatter(contributions, axis_name, scatter_dimension=0)


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
    running maximum is carried across the device boundary first, beta'_t = max(C_d, beta_t)
    (``earlier_weights``); device d sums its keys into S_d = sum_j exp(alpha_j - B_d) b_j v_j^T
    relative to B_d = beta'_{T/D-1} (``_prefix.weighted_outer_sum``, chunk by chunk), and the
    earlier devices' state S_<d = sum_{e < d} S_e exp(B_e - C_d) (``exclusive_state_sum``)
    enters as ``causal_prefix``'s initial state (S_<d, C_d) with beta', summed inside its scan:
    Y_t gains (a_t . S_<d) exp(C_d - beta'_t). The contract (beta' non-decreasing,
    alpha_j <= beta'_t, C_d <= beta'_0) holds.

    Gradients (a ``jax.custom_vjp``; alpha and beta are constants) keep the one-device memory
    bound: the cotangent of S_<d, sum_t exp(C_d - beta'_t) a_t G_t^T, is summed chunk by chunk;
    its transpose across devices (a reduce-scatter) gives dL/dS_d, which enters the prefix's
    reversed-time passes as their initial state (``_prefix.prefix_cotangents``) instead of as
    (T/D, m) and (T/D, p) terms added to their outputs (issue 15: the gradient's per-device
    memory was 0.29 of one device's at 4 devices, ideal 0.25).
    """
    return _prefix_over_devices(a, b, v, alpha, beta, chunk, axis_name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _prefix_over_devices(a, b, v, alpha, beta, chunk, axis_name):
    return _prefix_over_devices_fwd(a, b, v, alpha, beta, chunk, axis_name)[0]


def _prefix_over_devices_fwd(a, b, v, alpha, beta, chunk, axis_name):
    alpha, beta = jax.lax.stop_gradient(alpha), jax.lax.stop_gradient(beta)
    weights, earlier, earlier_max = earlier_weights(beta[-1], axis_name)
    beta = jnp.maximum(beta, earlier_max)
    # Two scheduling constraints (values unchanged): a, b and v all computed before the state
    # sum, and a's chunked copy for the prefix scan made only after it. Without the first XLA
    # keeps the chunked copies of b and v (shared by the sum and the scan) live while it
    # computes the query features; without the second, the copy of a lives during the sum.
    # Per-device gradient memory over one device's at T/4, T = 4096 (issue 15): 1.06x with
    # neither (loss sum(sin(3 Y)), masked), 1.00x with the first (1.03x for loss sum(Y)),
    # 0.97x with both (both losses).
    a, b, v = jax.lax.optimization_barrier((a, b, v))
    own_state = weighted_outer_sum(b, v, alpha - beta[-1], chunk)
    a, own_state = jax.lax.optimization_barrier((a, own_state))
    initial = (exclusive_state_sum(own_state, weights, earlier, axis_name), earlier_max)
    out = causal_prefix(a, b, v, alpha, beta, chunk, initial)
    return out, (a, b, v, alpha, beta, initial, weights, earlier)


def _prefix_over_devices_bwd(chunk, axis_name, residuals, grad):
    a, b, v, alpha, beta, initial, weights, earlier = residuals
    # Over reversed time, as the prefix's reversed passes read a and G: one copy of each.
    earlier_state_grad = weighted_outer_sum(a[::-1], grad[::-1], (initial[1] - beta)[::-1], chunk)
    own_state_grad = exclusive_state_sum_transpose(earlier_state_grad, weights, earlier, axis_name)
    grads = prefix_cotangents(a, b, v, alpha, beta, chunk, initial, grad, own_state_grad)
    return (*grads, jnp.zeros_like(alpha), jnp.zeros_like(beta))


_prefix_over_devices.defvjp(_prefix_over_devices_fwd, _prefix_over_devices_bwd)


def sequence_parallel_log_prefix(
    la: jax.Array, lb: jax.Array, v: jax.Array, chunk: int, *, axis_name: str
) -> jax.Array:
    """``_log_prefix.causal_log_prefix`` (per-feature shifts) on device d's shard of a sequence
    split along ``axis_name``: Y_t over all keys j <= t of the whole sequence, up to the row
    shift that cancels in FAVOR's ratio (``(T / D, p)``).

    Each device sums its keys relative to its own per-feature maximum, c_d = max_j lb_j
    (``(m,)``, a constant), S_d = sum_j exp(lb_j - c_d) v_j^T (``shifted_state_sum``, chunk by
    chunk); device d combines the earlier devices' (S_e, c_e) per feature, C = max_{e < d} c_e
    and S = sum_{e < d} exp(c_e - C) S_e (one ``all_gather`` each; later devices enter only
    through ``jnp.where(earlier, ., 0)``, and their exponents are selected away before ``exp``,
    so neither their values nor an overflow reach device d or its gradients), and scans its
    shard from (S, C).

    Gradients (a ``jax.custom_vjp``, like ``sequence_parallel_prefix``): the prefix's own VJP
    gives the cotangents of la, lb, v and of S; its transpose across devices (one
    reduce-scatter) gives dL/dS_d, whose terms exp(lb_j - c_d) (v_j . dL/dS_d) and
    exp(lb_j - c_d)^T dL/dS_d are added chunk by chunk, in place, to the prefix's cotangents of
    lb and v (issue 31: as a second (T / D, m) cotangent beside the prefix's, the gradient's
    memory per device was 1.13x one device's at T / D, 4 devices, T = 16k; now 1.00-1.06x).
    """
    return _log_prefix_over_devices(la, lb, v, chunk, axis_name)


def _earlier_log_state(lb, v, chunk, axis_name):
    """This device's (S_d, c_d) and the earlier devices' combined (S, C), with the weights of
    the combination (``factors``, ``earlier``: the (D, m) and (D, 1) terms of S)."""
    floor = log_floor(lb.dtype)
    local_max = jax.lax.stop_gradient(jnp.max(lb, axis=0))
    state = shifted_state_sum(lb, v, local_max, chunk)
    maxima = jax.lax.all_gather(local_max, axis_name)
    states = jax.lax.all_gather(state, axis_name)
    earlier = (jnp.arange(maxima.shape[0]) < jax.lax.axis_index(axis_name))[:, None]
    earlier_max = jnp.max(jnp.where(earlier, maxima, floor), axis=0)
    factors = jnp.exp(jnp.where(earlier, maxima - earlier_max[None, :], 0.0))
    combined = jnp.sum(jnp.where(earlier[:, :, None], factors[:, :, None] * states, 0.0), axis=0)
    return combined, earlier_max, local_max, factors, earlier


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _log_prefix_over_devices(la, lb, v, chunk, axis_name):
    combined, earlier_max, *_ = _earlier_log_state(lb, v, chunk, axis_name)
    return causal_log_prefix(la, lb, v, chunk, (combined, earlier_max))[0]


def _log_prefix_over_devices_fwd(la, lb, v, chunk, axis_name):
    combined, earlier_max, local_max, factors, earlier = _earlier_log_state(lb, v, chunk, axis_name)

    def prefix(la, lb, v, combined):
        return causal_log_prefix(la, lb, v, chunk, (combined, earlier_max))[0]

    out, prefix_vjp = jax.vjp(prefix, la, lb, v, combined)
    return out, (prefix_vjp, lb, v, local_max, factors, earlier)


def _log_prefix_over_devices_bwd(chunk, axis_name, residuals, grad):
    prefix_vjp, lb, v, local_max, factors, earlier = residuals
    grad_la, grad_lb, grad_v, grad_combined = prefix_vjp(grad)
    # The transpose of the combination and of the all_gather of the states: dL/dS_d.
    contributions = jnp.where(earlier[:, :, None], factors[:, :, None] * grad_combined, 0.0)
    grad_state = jax.lax.psum_scatter(contributions, axis_name, scatter_dimension=0)
    grad_lb, grad_v = _add_state_cotangents(lb, v, local_max, grad_state, grad_lb, grad_v, chunk)
    return grad_la, grad_lb, grad_v


def _add_state_cotangents(lb, v, shift, grad_state, grad_lb, grad_v, chunk):
    """``grad_lb``, ``grad_v`` plus the cotangents of S = sum_j exp(lb_j - shift) v_j^T with
    dL/dS = ``grad_state`` (m, p), written chunk by chunk into the given arrays (in place)."""
    length = lb.shape[0]
    chunk = min(chunk, length)

    def body(index, grads):
        total_lb, total_v = grads
        start = jnp.minimum(index * chunk, length - chunk)  # the last chunk may overlap
        fresh = jnp.arange(chunk) + start >= index * chunk  # rows not yet added
        lb_c = jax.lax.dynamic_slice_in_dim(lb, start, chunk)
        v_c = jax.lax.dynamic_slice_in_dim(v, start, chunk)
        weights = jnp.where(fresh[:, None], jnp.exp(lb_c - shift[None, :]), 0.0)
        add_lb = weights * (v_c @ grad_state.T)
        add_v = weights @ grad_state
        total_lb = jax.lax.dynamic_update_slice_in_dim(
            total_lb, jax.lax.dynamic_slice_in_dim(total_lb, start, chunk) + add_lb, start, 0
        )
        total_v = jax.lax.dynamic_update_slice_in_dim(
            total_v, jax.lax.dynamic_slice_in_dim(total_v, start, chunk) + add_v, start, 0
        )
        return total_lb, total_v

    return jax.lax.fori_loop(0, -(-length // chunk), body, (grad_lb, grad_v))


_log_prefix_over_devices.defvjp(_log_prefix_over_devices_fwd, _log_prefix_over_devices_bwd)
