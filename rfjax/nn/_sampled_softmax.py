"""Sampled softmax with random-feature proposals (Rawat et al. 2019; HRF Sec. 4.2, App. I).

A sampled softmax replaces the normaliser Z = sum_i exp(o_i) of the cross-entropy over a
vocabulary of V classes (logits o_i = q.e_i of a query q and class embeddings e_i) by an
importance-sampled estimate from M negatives s_1..s_M ~ Q(. | q):

  loss = log(exp(o_t) + sum_j [s_j != t] exp(o_{s_j} - log(M Q(s_j | q)))) - o_t,

where t is the target. The log-proposal correction makes the bracket an unbiased estimate of
Z = exp(o_t) + sum_{i != t} exp(o_i) for every Q with Q(i) > 0, and "accidental hits"
(negatives equal to the target) are removed (their term is dropped, not resampled), so the
loss tends to the full cross-entropy as M grows.

Proposals (``PROPOSALS``). ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(o), the full
softmax of the loss logits (the ideal, O(V d) per query). The four kernel proposals follow
Rawat et al.: a random-feature estimate K-hat(q, e) = phi(q).psi(e) of the softmax kernel of the
*normalised* vectors with temperature tau,

  K(q, e) = exp(q_bar.e_bar / tau) = SM(q_bar / sqrt(tau), e_bar / sqrt(tau)),  u_bar = u / |u|,

so all inputs lie on the sphere of radius r = 1/sqrt(tau) (the loss keeps the un-normalised
logits). Feature maps: ``"positive"`` (FAVOR+, antithetic), ``"trigonometric"``,
``"angular_hybrid"`` and ``"gaussian_hybrid"`` (HRF Eq. 12, 19, 20; ``rfjax.features``).

Efficient sampling by the feature-space decomposition. With query features a = phi(q) and
key features B[i] = psi(e_i), the proposal actually used is the mixture

  Q(i | q) = sum_k |a_k| |B_ik| / sum_k |a_k| S_k,   S_k = sum_i |B_ik|,

sampled in two stages: a feature k with probability |a_k| S_k / sum_l |a_l| S_l, then a class
i with probability |B_ik| / S_k. The per-feature tables (column-wise cumulative sums of |B|,
width W x V) are built once per step from the vocabulary and shared by every query of the
batch; each draw then costs O(W) for the feature (inverse CDF over the query's W weights,
shared by its M draws) and O(log V) for the class (a binary search in the feature's table).
No O(V) softmax is formed per query. For positive features |.| is the identity and Q is the
normalised kernel estimate K-hat(q, e_i) / sum_j K-hat(q, e_j) (Rawat et al.'s proposal).
Trigonometric and hybrid estimators are signed, so their normalised estimate is not a
distribution: we sample the |.| mixture above instead, which is a proper distribution with
Q(i) > 0 wherever some |a_k B_ik| > 0, and the loss uses this Q (computed exactly for each
sampled class in O(W)), so the importance correction is exact for the proposal used. The
|.| mixture is not the (clipped) kernel estimate: for signed features it is flatter than
K-hat, which is part of what the HRF comparison measures.

References:
  Rawat, Chen, Yu, Suresh and Kumar, "Sampled softmax with random Fourier features",
  NeurIPS 2019, arXiv:1907.10747; Choromanski et al., "Hybrid Random Features", ICLR 2022,
  arXiv:2110.04367, Sec. 4.2 and App. I; Bengio and Senecal 2008; Jean et al. 2015.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rfjax import projections
from rfjax._validation import check_choice, check_inputs, check_int, check_real
from rfjax.features import (
    angular_hybrid_features,
    gaussian_hybrid_features,
    positive_features,
    trigonometric_features,
)

FEATURE_PROPOSALS = ("positive", "trigonometric", "angular_hybrid", "gaussian_hybrid")
PROPOSALS = (*FEATURE_PROPOSALS, "uniform", "exact")


def normalize_for_proposal(x: jax.Array, temperature: float) -> jax.Array:
    """x / (|x| sqrt(tau)): rows on the sphere of radius 1/sqrt(tau), so that
    SM(q', e') = exp(q_bar.e_bar / tau). Zero rows stay zero."""
    norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / (jnp.maximum(norms, jnp.finfo(x.dtype).tiny) * math.sqrt(temperature))


def proposal_features(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int = 8,
    temperature: float = 1.0,
    coupling: str = "orthogonal",
    gaussian_bandwidth: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Random features of the proposal kernel exp(q_bar.e_bar / tau) for queries and classes.

    The estimate of the kernel is ``query_features @ class_features.T``. Projections are drawn
    from ``key`` with ``coupling`` (``rfjax.projections.get``): m = ``num_features`` rows for
    positive/trigonometric (width 2m); for the hybrids m base rows shared by the positive and
    trigonometric estimators (variant II of HRF Theorem 3.1) and n = ``num_coefficient_features``
    independent rows for the coefficient (width 4m(n + 1) angular, 4m(2n + 1) Gaussian with
    trigonometric coefficients). Inputs are normalised (``normalize_for_proposal``) and treated
    as constants (``stop_gradient``).

    Args:
      key: PRNG key for the projections.
      queries: ``(N, d)`` query vectors q.
      embeddings: ``(V, d)`` class embeddings e_i.
      proposal: one of ``FEATURE_PROPOSALS``.
      num_features: m >= 1.
      num_coefficient_features: n >= 1 (hybrids only).
      temperature: tau > 0.
      coupling: coupling name for all projections.
      gaussian_bandwidth: bandwidth of the Gaussian hybrid's coefficient (default: the radius
        1/sqrt(tau)).

    Returns:
      ``(query_features (N, W), class_features (V, W))``.

    Raises:
      TypeError, ValueError: for a bad argument (named in the message).
    """
    proposal = check_choice("proposal", proposal, FEATURE_PROPOSALS)
    num_features = check_int("num_features", num_features, minimum=1)
    num_coefficient_features = check_int(
        "num_coefficient_features", num_coefficient_features, minimum=1
    )
    temperature = check_real("temperature", temperature, positive=True)
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    sampler = projections.get(coupling)
    dim = queries.shape[-1]
    radius = 1.0 / math.sqrt(temperature)
    inputs = [
        normalize_for_proposal(jax.lax.stop_gradient(x), temperature) for x in (queries, embeddings)
    ]
    base_key, coefficient_key = jax.random.split(key)
    base = sampler(base_key, dim, num_features, dtype=queries.dtype)
    if proposal == "positive":
        return tuple(positive_features(x, base, antithetic=True) for x in inputs)
    if proposal == "trigonometric":
        return tuple(trigonometric_features(x, base) for x in inputs)
    coefficient = sampler(coefficient_key, dim, num_coefficient_features, dtype=queries.dtype)
    if proposal == "angular_hybrid":
        return tuple(
            angular_hybrid_features(x, base, base, coefficient, side=side)
            for x, side in zip(inputs, ("query", "key"), strict=True)
        )
    bandwidth = radius if gaussian_bandwidth is None else gaussian_bandwidth
    return tuple(
        gaussian_hybrid_features(
            x, base, base, coefficient, side=side, bandwidth=bandwidth, radius=radius
        )
        for x, side in zip(inputs, ("query", "key"), strict=True)
    )


def feature_proposal_probabilities(
    query_features: jax.Array, class_features: jax.Array
) -> jax.Array:
    """The proposal Q(i | q) = sum_k |a_k| |B_ik| / sum_k |a_k| S_k of every class, ``(N, V)``.

    O(N V W): for tests and diagnostics; sampling never forms it (``sample_from_features``).
    """
    weights = jnp.abs(query_features) @ jnp.abs(class_features).T
    return weights / jnp.sum(weights, axis=-1, keepdims=True)


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


def sample_from_features(
    key: jax.Array, query_features: jax.Array, class_features: jax.Array, num_samples: int
) -> tuple[jax.Array, jax.Array]:
    """Draws classes from the feature mixture Q (see the module docstring), with replacement.

    Stage 1 picks a feature k per draw by inverse CDF over |a_k| S_k (O(W) per query, shared by
    its draws); stage 2 picks a class by binary search in the cumulative |B_{., k}| table built
    once for all queries (O(V W) per call, O(log V) per draw). The returned log-probabilities
    are those of Q itself (O(W) per draw), the distribution the draws follow.

    Args:
      key: PRNG key.
      query_features: ``(N, W)`` features a of the queries (any sign).
      class_features: ``(V, W)`` features B of the classes (any sign).
      num_samples: M >= 1 draws per query.

    Returns:
      ``(samples, log_probabilities)``: int32 ``(N, M)`` class ids and float ``(N, M)`` log Q.
    """
    num_samples = check_int("num_samples", num_samples, minimum=1)
    weights_q = jnp.abs(query_features)
    weights_c = jnp.abs(class_features)
    tables = jnp.cumsum(weights_c, axis=0).T  # (W, V), row k ends with S_k
    feature_mass = weights_q * tables[:, -1]  # |a_k| S_k, (N, W)
    feature_cdf = jnp.cumsum(feature_mass, axis=-1)
    feature_key, class_key = jax.random.split(key)
    shape = (query_features.shape[0], num_samples)
    # 1 - U lies in (0, 1]: a zero-mass entry is never chosen.
    u = (1.0 - jax.random.uniform(feature_key, shape, feature_cdf.dtype)) * feature_cdf[:, -1:]
    features = jnp.minimum(jax.vmap(jnp.searchsorted)(feature_cdf, u), feature_cdf.shape[-1] - 1)
    v = (1.0 - jax.random.uniform(class_key, shape, tables.dtype)) * tables[features, -1]
    samples = _first_at_least(tables, features, v)
    mass = jnp.einsum("nw,nmw->nm", weights_q, weights_c[samples])
    return samples, jnp.log(mass) - jnp.log(feature_cdf[:, -1:])


def sample_proposal(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_samples: int,
    **feature_options,
) -> tuple[jax.Array, jax.Array]:
    """Negatives for a sampled softmax: M classes per query and their log-proposal log Q.

    ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(q.e) of the loss logits (categorical
    over V per query). Kernel proposals: ``proposal_features`` (``feature_options`` are passed
    on) then ``sample_from_features``. Everything is computed on ``stop_gradient`` inputs.

    Args:
      key: PRNG key (projections and draws).
      queries: ``(N, d)``.
      embeddings: ``(V, d)``.
      proposal: one of ``PROPOSALS``.
      num_samples: M >= 1.
      **feature_options: ``num_features``, ``num_coefficient_features``, ``temperature``,
        ``coupling``, ``gaussian_bandwidth`` of ``proposal_features`` (kernel proposals only).

    Returns:
      ``(samples, log_probabilities)`` of shape ``(N, M)``.
    """
    proposal = check_choice("proposal", proposal, PROPOSALS)
    num_samples = check_int("num_samples", num_samples, minimum=1)
    queries = jax.lax.stop_gradient(check_inputs("queries", queries))
    embeddings = jax.lax.stop_gradient(
        check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    )
    shape = (queries.shape[0], num_samples)
    vocabulary = embeddings.shape[0]
    if proposal == "uniform":
        samples = jax.random.randint(key, shape, 0, vocabulary)
        return samples, jnp.full(shape, -math.log(vocabulary), queries.dtype)
    if proposal == "exact":
        log_q = jax.nn.log_softmax(queries @ embeddings.T, axis=-1)
        cdf = jnp.cumsum(jnp.exp(log_q), axis=-1)  # inverse CDF: O(V + M log V) per query
        u = (1.0 - jax.random.uniform(key, shape, cdf.dtype)) * cdf[:, -1:]
        samples = jnp.minimum(jax.vmap(jnp.searchsorted)(cdf, u), vocabulary - 1)
        return samples, jnp.take_along_axis(log_q, samples, axis=-1)
    projection_key, sample_key = jax.random.split(key)
    features = proposal_features(
        projection_key, queries, embeddings, proposal=proposal, **feature_options
    )
    return sample_from_features(sample_key, *features, num_samples)


def sampled_softmax_loss(
    queries: jax.Array,
    embeddings: jax.Array,
    targets: jax.Array,
    samples: jax.Array,
    log_proposal: jax.Array,
    *,
    remove_accidental_hits: bool = True,
) -> jax.Array:
    """Per-query sampled-softmax loss with the log-proposal correction.

      loss_n = log(exp(o_t) + sum_j [s_j != t] exp(o_{s_j} - log M - log Q(s_j))) - o_t,

    o_i = q_n.e_i (un-normalised). The bracket is an unbiased estimate of the full normaliser
    Z_n = sum_i exp(o_i) (with accidental hits removed; without removal, of Z_n + exp(o_t)), so
    exp(loss_n + o_t) averages to Z_n and loss_n tends to the full cross-entropy as M grows.
    Gradients flow through the logits only (the proposal is a constant).

    Args:
      queries: ``(N, d)``.
      embeddings: ``(V, d)``.
      targets: int ``(N,)`` target classes.
      samples: int ``(N, M)`` negatives drawn from Q.
      log_proposal: ``(N, M)`` log Q(s_j | q_n).
      remove_accidental_hits: drop negatives equal to the target.

    Returns:
      ``(N,)`` losses.
    """
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    if samples.ndim != 2 or samples.shape[0] != queries.shape[0]:
        raise ValueError(f"samples must have shape (N, M) with N = {queries.shape[0]}")
    if log_proposal.shape != samples.shape or targets.shape != queries.shape[:1]:
        raise ValueError(
            f"log_proposal must match samples {samples.shape} and targets have shape "
            f"({queries.shape[0]},); got {log_proposal.shape} and {targets.shape}"
        )
    target_logits = jnp.sum(queries * embeddings[targets], axis=-1)
    sampled = jnp.einsum("nd,nmd->nm", queries, embeddings[samples])
    sampled = sampled - jax.lax.stop_gradient(log_proposal) - math.log(samples.shape[1])
    if remove_accidental_hits:
        sampled = jnp.where(samples == targets[:, None], -jnp.inf, sampled)
    all_logits = jnp.concatenate([target_logits[:, None], sampled], axis=-1)
    return jax.nn.logsumexp(all_logits, axis=-1) - target_logits


def distribution_metrics(probabilities: jax.Array, estimates: jax.Array) -> dict[str, jax.Array]:
    """Distances between a true softmax distribution over classes and a kernel estimate of it.

    With class i placed at i / (V - 1) in [0, 1] (ids in vocabulary order) and the estimate
    normalised to sum to one, p-hat_i = K-hat_i / sum_j K-hat_j (signed when the estimator is),
    the cumulative distributions F and F-hat give the 1-Wasserstein distance
    W1 = sum_i |F(i) - F-hat(i)| / (V - 1) and the Kolmogorov-Smirnov statistic
    KS = max_i |F(i) - F-hat(i)|
    (Ramdas et al. 2017, as used by HRF Sec. 4.2); ``negative_fraction`` is the fraction of
    estimates K-hat_i < 0.

    Args:
      probabilities: ``(..., V)`` true distributions.
      estimates: ``(..., V)`` kernel estimates K-hat (un-normalised, any sign).

    Returns:
      dict of ``(...)`` arrays: ``wasserstein``, ``ks``, ``negative_fraction``.
    """
    estimated = estimates / jnp.sum(estimates, axis=-1, keepdims=True)
    gap = jnp.abs(jnp.cumsum(probabilities, axis=-1) - jnp.cumsum(estimated, axis=-1))
    return {
        "wasserstein": jnp.sum(gap, axis=-1) / max(gap.shape[-1] - 1, 1),
        "ks": jnp.max(gap, axis=-1),
        "negative_fraction": jnp.mean(estimates < 0, axis=-1),
    }
