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
from typing import Any

import jax
import jax.numpy as jnp

from rfjax.attention._checks import log_floor
from rfjax.attention._log_prefix import (
    LogFeatures,
    PrefixOutputs,
    causal_feature_prefix,
    initial_state_cotangent,
    key_state,
)
from rfjax.attention._prefix import causal_prefix, prefix_cotangents, weighted_outer_sum


def check_sequence_axis(sequence_axis: object) -> str | None:
    """``None`` or the name (a ``str``) of a mesh axis: one bound by an enclosing ``jax.shard_map``,
    or an Explicit axis of the mesh set outside it (``_global_split``)."""
    if sequence_axis is None:
        return None
    if not isinstance(sequence_axis, str):
        raise TypeError(
            f"sequence_axis must be None or the name (str) of a mesh axis, got {sequence_axis!r}"
        )
    return sequence_axis


def check_split_along(sequence_axis: str | None, **arrays: object) -> None:
    """Inside ``jax.shard_map``, every array given (query, key, value, a key padding mask; ``None``
    is skipped) must vary over the mesh axis ``sequence_axis``, as the local shards of a
    sequence split along it do. A shard's type records the mesh axes it varies over, not which
    dimension an axis splits: a replicated input (in_specs ``P()``) is caught here, a split of
    the heads or the batch over the axis only through its key padding mask (one row per
    position, replicated when the heads are split). Without ``check_vma`` the types record no
    axes, and nothing is checked. On global arrays (outside ``shard_map``) the split itself is
    checked (``_global_split.split_spec``).

    Raises:
      ValueError: naming the first array that does not vary over the axis.
    """
    if sequence_axis is None or not _tracks_axis(sequence_axis):
        return
    for name, array in arrays.items():
        if array is None:
            continue
        if sequence_axis in jax.typeof(jnp.asarray(array)).manual_axis_type.varying:
            continue
        raise ValueError(
            f"{name} does not vary over the mesh axis {sequence_axis!r}: with sequence_axis="
            f"{sequence_axis!r} every device must hold its own part of the sequence (in_specs "
            f"P(None, {sequence_axis!r}) for (B, T, ...) arrays and (B, S) masks); a replicated "
            f"{name} would be read as that part, and an axis that splits the heads or the batch "
            f"instead would mix them"
        )


def _tracks_axis(axis_name: str) -> bool:
    """Whether types inside this ``shard_map`` record variation over ``axis_name`` (its
    ``check_vma``): the axis index always varies over its axis when they do."""
    return axis_name in jax.typeof(jax.lax.axis_index(axis_name)).manual_axis_type.varying


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
    """Whether ``flag`` (bool, any shape) is set on any device before this one along the axis,
    elementwise."""
    flags = jax.lax.all_gather(flag, axis_name)
    earlier = jnp.arange(flags.shape[0]) < jax.lax.axis_index(axis_name)
    return jnp.any(flags & earlier.reshape((-1,) + (1,) * flag.ndim), axis=0)


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


def sequence_parallel_feature_prefix(
    params,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    *,
    log_features: LogFeatures,
    chunk: int,
    axis_name: str,
    matmul_dtype: jnp.dtype | None = None,
    normaliser: bool = False,
    head_axes: Any = None,
) -> PrefixOutputs:
    """``_log_prefix.causal_feature_prefix`` (per-feature shifts, the feature map fused) on
    device d's shard of a sequence split along ``axis_name``: Y_t over all keys j <= t of the
    whole sequence, up to the row shift that cancels in FAVOR's ratio (``(T / D, p)``). Rows of
    one head ``(T / D, H)`` or of N heads ``(T / D, N, H)`` (states per head); ``normaliser``
    and ``head_axes`` as ``causal_feature_prefix``'s.

    Each device sums its keys relative to its own per-feature maximum c_d (``(m,)``, a
    constant), S_d = sum_j exp(lb_j - c_d) v_j^T (``_log_prefix.key_state``, chunk by chunk);
    device d combines the earlier devices' (S_e, c_e) per feature, C = max_{e < d} c_e and
    S = sum_{e < d} exp(c_e - C) S_e (one ``all_gather`` each; later devices enter only through
    ``jnp.where(earlier, ., 0)``, and their exponents are selected away before ``exp``, so
    neither their values nor an overflow reach device d or its gradients), and runs its shard
    from the initial state (S, C).

    Gradients (a ``jax.custom_vjp``), as ``sequence_parallel_prefix``'s, keep the one-device
    memory bound: the cotangent of S, sum_t exp(la_t + C - M_t) G_t^T, is summed chunk by
    chunk (``_log_prefix.initial_state_cotangent``); its transpose across devices (a
    reduce-scatter) gives dL/dS_d, which enters the prefix's own backward pass with G (its
    ``own_state`` output), instead of as a second (T / D, m) cotangent of lb.
    """
    options = dict(
        log_features=log_features,
        chunk=chunk,
        matmul_dtype=matmul_dtype,
        normaliser=normaliser,
        head_axes=head_axes,
    )
    return _feature_prefix_over_devices(
        params, query, key, value, valid, tuple(options.items()), axis_name
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _feature_prefix_over_devices(params, query, key, value, valid, options, axis_name):
    return _feature_prefix_over_devices_fwd(params, query, key, value, valid, options, axis_name)[0]


def _earlier_initial(own_state, own_shift, axis_name):
    """(S, C, factors): the earlier devices' combined state ``(..., m, p)`` and shift
    ``(..., m)``, and each device's factor exp(c_e - C) ``(D, ..., m)`` in it (0 for devices
    that are not earlier); ``...``: the heads, if any."""
    floor = log_floor(own_shift.dtype)
    maxima = jax.lax.all_gather(own_shift, axis_name)
    states = jax.lax.all_gather(own_state, axis_name)
    earlier = jnp.arange(maxima.shape[0]) < jax.lax.axis_index(axis_name)
    earlier = earlier.reshape((-1,) + (1,) * own_shift.ndim)
    earlier_max = jnp.max(jnp.where(earlier, maxima, floor), axis=0)
    factors = jnp.where(earlier, jnp.exp(jnp.where(earlier, maxima - earlier_max, 0.0)), 0.0)
    combined = jnp.sum(factors[..., None] * jnp.where(earlier[..., None], states, 0.0), axis=0)
    return combined, earlier_max, factors


def _feature_prefix_over_devices_fwd(params, query, key, value, valid, options, axis_name):
    options = dict(options)
    own_state, own_shift = key_state(
        params,
        key,
        value,
        valid,
        log_features=options["log_features"],
        chunk=options["chunk"],
        normaliser=options["normaliser"],
        head_axes=options["head_axes"],
    )
    combined, earlier_max, factors = _earlier_initial(
        own_state, jax.lax.stop_gradient(own_shift), axis_name
    )
    result = causal_feature_prefix(
        params, query, key, value, valid, initial=(combined, earlier_max), **options
    )
    residuals = (params, query, key, value, valid, combined, earlier_max, factors)
    return result, (residuals, result.row_shift)


def _feature_prefix_over_devices_bwd(options, axis_name, residuals, cotangents):
    options = dict(options)
    (params, query, key, value, valid, combined, earlier_max, factors), row_shift = residuals
    grad = cotangents.out
    # dL/dS: row t read S as exp(la_t + C - M_t) S.
    earlier_grad = initial_state_cotangent(
        params,
        query,
        row_shift,
        earlier_max,
        grad,
        log_features=options["log_features"],
        chunk=options["chunk"],
        head_axes=options["head_axes"],
    )
    # S = sum_e factors_e S_e over the earlier devices e: device e's dL/dS_e sums the later
    # devices' factors_e dL/dS (factors are 0 for devices that are not earlier).
    own_grad = jax.lax.psum_scatter(
        factors[..., None] * earlier_grad, axis_name, scatter_dimension=0
    )

    def prefix_and_state(params, query, key, value):
        result = causal_feature_prefix(
            params,
            query,
            key,
            value,
            valid,
            initial=(combined, earlier_max),
            with_own_state=True,
            **options,
        )
        return result.out, result.own_state

    _, pullback = jax.vjp(prefix_and_state, params, query, key, value)
    return (*pullback((grad, own_grad)), None)


_feature_prefix_over_devices.defvjp(
    _feature_prefix_over_devices_fwd, _feature_prefix_over_devices_bwd
)
