"""Monte Carlo estimate of RF-conformity for any coupling (the check on the closed forms)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from rfjax import projections
from rfjax._validation import check_int, check_key
from rfjax.theory import _inputs


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _conformity_draws(
    sampler: Callable[..., projections.Projection],
    dim: int,
    num_features: int,
    batch_size: int,
    keys: jax.Array,
    v: jax.Array,
) -> jax.Array:
    """Per-draw pair averages 1/(m(m-1)) sum_{i != j} e_i e_j, e_i = exp(w_i^T v)."""
    pairs = num_features * (num_features - 1)

    def one_draw(key: jax.Array) -> jax.Array:
        e = jnp.exp(sampler(key, dim, num_features)(v))
        total = jnp.sum(e)
        return (total * total - jnp.sum(e * e)) / pairs

    return jax.lax.map(one_draw, keys, batch_size=batch_size)


def monte_carlo_conformity(
    key: jax.Array,
    sampler: str | Callable[..., projections.Projection],
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    *,
    num_samples: int,
    batch_size: int = 4096,
) -> tuple[float, float]:
    """Monte Carlo RF-conformity rho = 1/(m(m-1)) sum_{i != j} E[exp((w_i + w_j)^T (x + y))].

    Draws ``num_samples`` independent projections from ``sampler`` (one split key each,
    vectorised with ``jax.lax.map`` in batches of ``batch_size`` draws, i.e. ``vmap`` inside a
    loop over a few chunks, bounding memory). For each draw, with e_i = exp(w_i^T (x + y)), the
    pair sum is (sum_i e_i)^2 - sum_i e_i^2; only ``projection(x + y)`` is used, so any coupling
    works, including structured ones that never form W. Per-draw values are computed in the
    projection's dtype and averaged in float64.

    Args:
      key: a PRNG key (``jax.random.key(seed)``).
      sampler: a coupling ``(key, dim, num_features) -> Projection`` or its registered name in
        ``rfjax.projections`` (e.g. ``"simplex"``).
      x: input of shape (d,).
      y: input of shape (d,).
      num_features: number of projections m >= 2.
      num_samples: number of independent draws N >= 2.
      batch_size: draws evaluated together (vectorised) per step.

    Returns:
      ``(mean, standard_error)``: the estimate and std/sqrt(N) of the per-draw values, floats.
      Compare with ``effective_conformity(conformity(coupling, d, |x + y|), |x + y|,
      block_sizes(d, m))``.

    Raises:
      TypeError: bad key or sampler.
      ValueError: bad shapes or counts.

    Examples:
      >>> x = jnp.array([0.2, 0.0, 0.0]); y = jnp.array([0.0, 0.2, 0.0])
      >>> mean, se = monte_carlo_conformity(jax.random.key(0), "simplex", x, y, 3, num_samples=2000)
      >>> from rfjax.theory import conformity
      >>> rho = float(conformity("simplex", 3, math.sqrt(0.08)))
      >>> abs(mean - rho) < 4 * se
      True

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10.
    """
    check_key("key", key)
    if isinstance(sampler, str):
        sampler = projections.get(sampler)
    elif not callable(sampler):
        raise TypeError(
            f"sampler must be a coupling name or a callable (key, dim, num_features) "
            f"-> Projection, got {type(sampler).__name__}"
        )
    x, y = _inputs.point_pair(x, y)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(
            f"x and y must have shape (d,), got x.shape={x.shape} and y.shape={y.shape}"
        )
    num_features = _inputs.feature_count(num_features, minimum=2)
    num_samples = check_int("num_samples", num_samples, minimum=2)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    keys = jax.random.split(key, num_samples)
    values = _conformity_draws(
        sampler, x.shape[-1], num_features, min(batch_size, num_samples), keys, jnp.asarray(x + y)
    )
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(num_samples))
