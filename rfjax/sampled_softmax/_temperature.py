"""The temperature of a kernel proposal, by how far it is from the model's softmax (HRF Sec. 4.2).

Used in random-feature sampled softmax (``sample_proposal``) to choose the temperature
tau of the kernel proposal softmax(q_bar.e_bar / tau) so that it is as close as possible to the
model's softmax(q.e) (``kernel_softmax_divergence``, ``select_temperature``): a proposal far
flatter or sharper than the model's softmax makes the sampled loss a poor estimate of the full
cross-entropy. (Scoring a random-feature estimate of a softmax distribution, the HRF paper's
Fig. 3 / Table 4 metrics, is an experiment metric: ``experiments.lstm_lm.metrics``.)

References:
  Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Sec. 4.2, App. I;
  Rawat et al., arXiv:1907.10747.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax._validation import check_inputs, is_concrete


def kernel_softmax_divergence(
    logits: jax.Array, cosines: jax.Array, temperatures: jax.Array
) -> jax.Array:
    """Mean KL(softmax(logits) || softmax(cosines / tau)) over rows, for every tau.

    KL(p || q) = sum_i p_i (log p_i - log q_i) is the divergence that matters for a proposal q
    serving a target p: it is infinite where q misses mass of p. As a function of beta = 1/tau
    it is convex (log-partition minus a linear term), so the minimiser over a grid is within
    one grid step of the true one.

    Args:
      logits: ``(N, V)`` the model's logits o_i = q.e_i.
      cosines: ``(N, V)`` q_bar.e_bar of the same queries and classes.
      temperatures: ``(G,)`` positive temperatures tau. Others raise ``ValueError``; inside
        ``jit``, where they are unknown, their divergences are NaN.

    Returns:
      ``(G,)`` mean divergences (nats) over the rows whose logits and cosines are all finite: a
      row holding NaN or infinity has no divergence and is left out of the mean, so it does not
      make every tau's divergence NaN. With no such row, every divergence is NaN.

    Examples:
      >>> import jax.numpy as jnp
      >>> cosines = jnp.array([[0.9, 0.1, -0.5]])
      >>> divergence = kernel_softmax_divergence(cosines / 0.5, cosines, jnp.array([0.5, 2.0]))
      >>> abs(float(divergence[0])) < 1e-6, float(divergence[1]) > 0.1
      (True, True)
    """
    logits = check_inputs("logits", logits)
    cosines = check_inputs("cosines", cosines)
    if logits.shape != cosines.shape or logits.ndim != 2:
        raise ValueError(
            f"logits and cosines must have the same (N, V) shape, got {logits.shape} and "
            f"{cosines.shape}"
        )
    temperatures = check_inputs("temperatures", temperatures)
    if temperatures.ndim != 1:
        raise ValueError(f"temperatures must be 1-D (G,), got shape {temperatures.shape}")
    if is_concrete(temperatures) and not bool(jnp.all(temperatures > 0)):
        raise ValueError(f"temperatures must be > 0, got {temperatures}")
    finite_rows = jnp.all(jnp.isfinite(logits) & jnp.isfinite(cosines), axis=-1)
    logits = jnp.where(finite_rows[:, None], logits, 0)
    cosines = jnp.where(finite_rows[:, None], cosines, 0)
    finite_count = jnp.sum(finite_rows)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(log_p)
    entropy_term = jnp.sum(p * log_p, axis=-1)

    def divergence(tau):
        log_q = jax.nn.log_softmax(cosines / tau, axis=-1)
        per_row = jnp.where(finite_rows, entropy_term - jnp.sum(p * log_q, axis=-1), 0)
        value = jnp.sum(per_row) / finite_count
        return jnp.where((tau > 0) & (finite_count > 0), value, jnp.nan)

    return jax.lax.map(divergence, temperatures)


def select_temperature(logits: jax.Array, cosines: jax.Array, temperatures: jax.Array) -> jax.Array:
    """The tau of ``temperatures`` with the smallest ``kernel_softmax_divergence`` (a scalar;
    jit-compatible), never one whose divergence is NaN (a non-positive tau inside ``jit``)
    unless all are. Rows holding NaN or infinity are left out (``kernel_softmax_divergence``).
    Treat the inputs as constants (``stop_gradient``) when used in a loss."""
    divergences = kernel_softmax_divergence(logits, cosines, temperatures)
    return temperatures[jnp.argmin(jnp.where(jnp.isnan(divergences), jnp.inf, divergences))]
