"""How far a proposal distribution over classes is from a target softmax (HRF Sec. 4.2).

Two uses in random-feature sampled softmax (``rfjax.nn.sample_proposal``):

* choosing the temperature tau of the kernel proposal softmax(q_bar.e_bar / tau) so that it is
  as close as possible to the model's softmax(q.e) (``kernel_softmax_divergence``,
  ``select_temperature``): a proposal far flatter or sharper than the model's softmax makes the
  sampled loss a poor estimate of the full cross-entropy;
* scoring a random-feature estimate of a softmax distribution (``distribution_metrics``, the
  HRF paper's Fig. 3 / Table 4 metrics).

References:
  Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Sec. 4.2, App. I;
  Ramdas, Garcia Trillos and Cuturi, "On Wasserstein two-sample testing and related families of
  nonparametric tests", Entropy 2017; Rawat et al., arXiv:1907.10747.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax._validation import check_inputs


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
      temperatures: ``(G,)`` positive temperatures tau.

    Returns:
      ``(G,)`` mean divergences (nats).

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
    log_p = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(log_p)
    entropy_term = jnp.sum(p * log_p, axis=-1)

    def divergence(tau):
        log_q = jax.nn.log_softmax(cosines / tau, axis=-1)
        return jnp.mean(entropy_term - jnp.sum(p * log_q, axis=-1))

    return jax.lax.map(divergence, temperatures)


def select_temperature(logits: jax.Array, cosines: jax.Array, temperatures: jax.Array) -> jax.Array:
    """The tau of ``temperatures`` with the smallest ``kernel_softmax_divergence`` (a scalar;
    jit-compatible). Treat the inputs as constants (``stop_gradient``) when used in a loss."""
    divergences = kernel_softmax_divergence(logits, cosines, temperatures)
    return temperatures[jnp.argmin(divergences)]


def distribution_metrics(probabilities: jax.Array, estimates: jax.Array) -> dict[str, jax.Array]:
    """Distances between a true softmax distribution over classes and a kernel estimate of it.

    The estimate is made a distribution by clipping at zero and normalising,
    p-hat_i = max(K-hat_i, 0) / sum_j max(K-hat_j, 0) (uniform where every K-hat_i <= 0), the
    distribution a clipped sampler proposes before its uniform floor. With class i placed at
    i / (V - 1) in [0, 1] (ids in vocabulary order) and the cumulative distributions F and
    F-hat, the 1-Wasserstein distance is W1 = sum_i |F(i) - F-hat(i)| / (V - 1) and the
    Kolmogorov-Smirnov statistic KS = max_i |F(i) - F-hat(i)| (Ramdas et al. 2017, as used by
    HRF Sec. 4.2); both lie in [0, 1]. ``negative_fraction`` is the fraction of estimates
    K-hat_i < 0 before clipping.

    Args:
      probabilities: ``(..., V)`` true distributions.
      estimates: ``(..., V)`` kernel estimates K-hat (un-normalised, any sign).

    Returns:
      dict of ``(...)`` arrays: ``wasserstein``, ``ks``, ``negative_fraction``.

    Examples:
      >>> import jax.numpy as jnp
      >>> out = distribution_metrics(jnp.array([0.5, 0.5, 0.0]), jnp.array([0.0, 1.0, 1.0]))
      >>> float(out["wasserstein"]), float(out["ks"])
      (0.5, 0.5)
    """
    probabilities = check_inputs("probabilities", probabilities)
    estimates = check_inputs("estimates", estimates)
    if probabilities.shape != estimates.shape:
        raise ValueError(
            f"probabilities and estimates must have the same shape, got {probabilities.shape} "
            f"and {estimates.shape}"
        )
    clipped = jnp.maximum(estimates, 0.0)
    total = jnp.sum(clipped, axis=-1, keepdims=True)
    size = estimates.shape[-1]
    estimated = jnp.where(total > 0, clipped / jnp.where(total > 0, total, 1.0), 1.0 / size)
    gap = jnp.abs(jnp.cumsum(probabilities, axis=-1) - jnp.cumsum(estimated, axis=-1))
    return {
        "wasserstein": jnp.sum(gap, axis=-1) / max(size - 1, 1),
        "ks": jnp.max(gap, axis=-1),
        "negative_fraction": jnp.mean(estimates < 0, axis=-1),
    }
