"""The HRF paper's Fig. 3 / Table 4 metrics: how far a random-feature estimate of a softmax
distribution over classes is from the true one (W1 and KS; Ramdas, Garcia Trillos and Cuturi,
"On Wasserstein two-sample testing and related families of nonparametric tests", Entropy 2017,
as used by HRF Sec. 4.2, arXiv:2110.04367)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _floating(name: str, x: object) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.ndim < 1:
        raise ValueError(f"{name} must be a floating array (..., V), got {x.dtype}{x.shape}")
    return x


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
    probabilities = _floating("probabilities", probabilities)
    estimates = _floating("estimates", estimates)
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


def proposal_divergence(log_target: jax.Array, log_proposal: jax.Array) -> jax.Array:
    """KL(target || proposal) = sum_i p_i (log p_i - log q_i) over the last axis, from log
    probabilities: the divergence that governs importance sampling from the proposal (large where
    the proposal misses the target's mass; log V - H(p) for a uniform proposal).

    Examples:
      >>> import jax.numpy as jnp
      >>> uniform = jnp.log(jnp.full(4, 0.25))
      >>> round(float(proposal_divergence(jnp.log(jnp.array([1.0, 0, 0, 0])), uniform)), 4)
      1.3863
    """
    log_target = _floating("log_target", log_target)
    log_proposal = _floating("log_proposal", log_proposal)
    target = jnp.exp(log_target)
    terms = jnp.where(target > 0, target * (log_target - log_proposal), 0.0)
    return jnp.sum(terms, axis=-1)
