"""The two samplers that turn random features into a proposal over classes, ``"clipped"`` and
``"decomposition"`` (``SAMPLERS``; see ``rfjax.sampled_softmax`` for their distributions), each
returning the exact log-probability of the distribution it draws from."""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp

from rfjax._validation import check_choice, check_int, check_real

SAMPLERS: tuple[Literal["clipped", "decomposition"], ...] = ("clipped", "decomposition")


def clipped_proposal_log_probabilities(
    query_features: jax.Array, class_features: jax.Array, uniform_floor: float = 0.01
) -> jax.Array:
    """log Q of the ``"clipped"`` sampler for every class, ``(N, V)`` (see
    ``rfjax.sampled_softmax``).

    Q(i) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j, 0) + eps / V, or 1/V where every
    estimate of the row is <= 0. O(N V W).

    Args:
      query_features: ``(N, W)``.
      class_features: ``(V, W)``.
      uniform_floor: eps in (0, 1].

    Returns:
      ``(N, V)`` log-probabilities (each row's exponentials sum to one).
    """
    return clipped_log_probabilities(query_features @ class_features.T, uniform_floor)


def clipped_log_probabilities(estimates: jax.Array, uniform_floor: float = 0.01) -> jax.Array:
    """log Q of the ``"clipped"`` sampler from the kernel estimates ``(N, V)`` of every query and
    class (e.g. ``proposal_estimates``): Q(i) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j,
    0) + eps / V, or 1/V where every estimate of the row is <= 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> q = jnp.exp(clipped_log_probabilities(jnp.array([[3.0, -1.0, 1.0]]), 0.3))
      >>> [round(float(v), 3) for v in q[0]]
      [0.625, 0.1, 0.275]
    """
    uniform_floor = check_uniform_floor(uniform_floor)
    clipped = jnp.maximum(estimates, 0.0)
    total = jnp.sum(clipped, axis=-1, keepdims=True)
    vocabulary = estimates.shape[-1]
    shape = clipped / jnp.where(total > 0, total, 1.0)
    probabilities = jnp.where(
        total > 0, (1.0 - uniform_floor) * shape + uniform_floor / vocabulary, 1.0 / vocabulary
    )
    return jnp.log(probabilities)


def check_uniform_floor(uniform_floor: object) -> float:
    """``uniform_floor`` as a float in (0, 1], else a ``ValueError`` naming it."""
    uniform_floor = check_real("uniform_floor", uniform_floor, positive=True)
    if uniform_floor > 1:
        raise ValueError(f"uniform_floor must be in (0, 1], got {uniform_floor}")
    return uniform_floor


def feature_proposal_probabilities(
    query_features: jax.Array,
    class_features: jax.Array,
    *,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
) -> jax.Array:
    """The proposal Q(i | q) of ``sampler`` for every class, ``(N, V)``.

    O(N V W): for tests and diagnostics (``"decomposition"`` never forms it when sampling). A
    query whose mixture has no mass gets 1/V, as both samplers draw for it.
    """
    sampler = check_choice("sampler", sampler, SAMPLERS)
    if sampler == "clipped":
        return jnp.exp(
            clipped_proposal_log_probabilities(query_features, class_features, uniform_floor)
        )
    weights = jnp.abs(query_features) @ jnp.abs(class_features).T
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 1.0 / weights.shape[-1])


def inverse_cdf(key: jax.Array, probabilities: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` draws per row of ``(N, V)`` probabilities by inverse CDF
    (O(V + M log V) per row); a zero-probability class is never drawn."""
    cdf = jnp.cumsum(probabilities, axis=-1)
    shape = (probabilities.shape[0], num_samples)
    # 1 - U lies in (0, 1]: the first class whose CDF reaches it has positive mass.
    u = (1.0 - jax.random.uniform(key, shape, cdf.dtype)) * cdf[:, -1:]
    return jnp.minimum(jax.vmap(jnp.searchsorted)(cdf, u), probabilities.shape[-1] - 1)


def _first_at_least(table: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
    """For each (row, value): the first column j with table[row, j] >= value (binary search,
    ceil(log2(V + 1)) gathers per query; ``table`` rows are non-decreasing)."""
    size = table.shape[-1]

    def body(_, bounds):
        low, high = bounds
        middle = (low + high) // 2
        below = (table[rows, middle] < values) & (low < high)
        above = (~below) & (low < high)
        return jnp.where(below, middle + 1, low), jnp.where(above, middle, high)

    low = jnp.zeros(values.shape, jnp.int32)
    high = jnp.full(values.shape, size - 1, jnp.int32)
    low, _ = jax.lax.fori_loop(0, max(1, math.ceil(math.log2(size + 1))), body, (low, high))
    return low


def _sample_decomposition(
    key: jax.Array, query_features: jax.Array, class_features: jax.Array, num_samples: int
) -> tuple[jax.Array, jax.Array]:
    """The |.| feature mixture by the two-stage decomposition (see ``rfjax.sampled_softmax``);
    a query whose mixture has no mass (its features all 0, e.g. underflowed) draws uniformly,
    as the ``"clipped"`` sampler's rows without a positive estimate do."""
    weights_q = jnp.abs(query_features)
    weights_c = jnp.abs(class_features)
    tables = jnp.cumsum(weights_c, axis=0).T  # (W, V), row k ends with S_k
    feature_mass = weights_q * tables[:, -1]  # |a_k| S_k, (N, W)
    feature_key, class_key, uniform_key = jax.random.split(key, 3)
    features = inverse_cdf(feature_key, feature_mass, num_samples)
    shape = features.shape
    v = (1.0 - jax.random.uniform(class_key, shape, tables.dtype)) * tables[features, -1]
    samples = _first_at_least(tables, features, v)
    mass = jnp.einsum("nw,nmw->nm", weights_q, weights_c[samples])
    total = jnp.sum(feature_mass, axis=-1, keepdims=True)
    classes = class_features.shape[0]
    empty = total == 0
    samples = jnp.where(empty, jax.random.randint(uniform_key, shape, 0, classes), samples)
    log_q = jnp.log(mass) - jnp.log(jnp.where(empty, 1.0, total))
    return samples, jnp.where(empty, -math.log(classes), log_q)


def sample_from_features(
    key: jax.Array,
    query_features: jax.Array,
    class_features: jax.Array,
    num_samples: int,
    *,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
) -> tuple[jax.Array, jax.Array]:
    """Draws classes from the proposal of ``sampler`` (see ``rfjax.sampled_softmax``), with
    replacement, and returns the log-probabilities of the distribution the draws follow.

    Args:
      key: PRNG key.
      query_features: ``(N, W)`` features a of the queries (any sign).
      class_features: ``(V, W)`` features B of the classes (any sign).
      num_samples: M >= 1 draws per query.
      sampler: ``"clipped"`` (O(V W) per query) or ``"decomposition"`` (O(W + M log V) per
        query after an O(V W) table).
      uniform_floor: eps in (0, 1] of the ``"clipped"`` sampler (checked for both samplers).

    Returns:
      ``(samples, log_probabilities)``: int32 ``(N, M)`` class ids and float ``(N, M)`` log Q.
    """
    num_samples = check_int("num_samples", num_samples, minimum=1)
    sampler = check_choice("sampler", sampler, SAMPLERS)
    check_uniform_floor(uniform_floor)
    if sampler == "decomposition":
        return _sample_decomposition(key, query_features, class_features, num_samples)
    log_q = clipped_proposal_log_probabilities(query_features, class_features, uniform_floor)
    samples = inverse_cdf(key, jnp.exp(log_q), num_samples)
    return samples, jnp.take_along_axis(log_q, samples, axis=-1)
