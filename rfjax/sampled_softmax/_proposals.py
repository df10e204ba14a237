"""Negatives for a sampled softmax from any proposal (``sample_proposal``): the plain ones
(``PLAIN_PROPOSALS``: uniform, the exact softmax, the kernel softmax computed exactly) and the
random-feature ones (``feature_proposals()``) through a sampler of ``_samplers``."""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from rfjax._validation import check_choice, check_inputs, check_int
from rfjax.sampled_softmax._proposal_features import (
    feature_proposals,
    normalize_for_proposal,
    proposal_estimates,
    proposal_features,
)
from rfjax.sampled_softmax._samplers import (
    SAMPLERS,
    check_uniform_floor,
    clipped_log_probabilities,
    inverse_cdf,
    sample_from_features,
)

PLAIN_PROPOSALS = ("uniform", "exact", "kernel")
# What ``proposal_features`` takes besides the proposal, and which of it each proposal reads.
FEATURE_OPTIONS = ("num_features", "num_coefficient_features", "temperature", "coupling")
_READS = {"uniform": (), "exact": (), "kernel": ("temperature",)}


def proposals() -> tuple[str, ...]:
    """Every proposal ``sample_proposal`` takes: ``feature_proposals()`` and
    ``PLAIN_PROPOSALS``."""
    return (*feature_proposals(), *PLAIN_PROPOSALS)


def sample_proposal(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_samples: int,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
    **feature_options: Any,
) -> tuple[jax.Array, jax.Array]:
    """Negatives for a sampled softmax: M classes per query and their log-proposal log Q.

    ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(q.e) of the loss logits (categorical
    over V per query). ``"kernel"``: Q = softmax(q_bar.e_bar / tau) exactly (needs
    ``temperature`` in ``feature_options``). Random-feature proposals: ``proposal_features``
    (``feature_options`` are passed on) then ``sample_from_features`` with ``sampler``.
    Everything is computed on ``stop_gradient`` inputs.

    Args:
      key: PRNG key (projections and draws).
      queries: ``(N, d)``.
      embeddings: ``(V, d)``.
      proposal: one of ``proposals()``.
      num_samples: M >= 1.
      sampler: ``"clipped"`` or ``"decomposition"`` (read by the random-feature proposals).
      uniform_floor: eps in (0, 1] of the ``"clipped"`` sampler (checked whatever the
        proposal and sampler).
      **feature_options: ``num_features``, ``num_coefficient_features``, ``temperature`` and
        ``coupling`` of ``proposal_features`` (random-feature proposals; ``"kernel"`` reads
        ``temperature`` only, ``"uniform"`` and ``"exact"`` none).

    Returns:
      ``(samples, log_probabilities)`` of shape ``(N, M)``.

    Raises:
      TypeError: for a feature option ``proposal_features`` does not take.
      ValueError: for an unknown proposal or sampler, M < 1, bad inputs, or a feature option
        that ``proposal`` does not read.
    """
    proposal = check_choice("proposal", proposal, proposals())
    num_samples = check_int("num_samples", num_samples, minimum=1)
    sampler = check_choice("sampler", sampler, SAMPLERS)
    check_uniform_floor(uniform_floor)
    _check_feature_options(proposal, feature_options)
    queries = jax.lax.stop_gradient(check_inputs("queries", queries))
    embeddings = jax.lax.stop_gradient(
        check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    )
    shape = (queries.shape[0], num_samples)
    vocabulary = embeddings.shape[0]
    if proposal == "uniform":
        samples = jax.random.randint(key, shape, 0, vocabulary)
        return samples, jnp.full(shape, -math.log(vocabulary), queries.dtype)
    if proposal in ("exact", "kernel"):
        if proposal == "kernel":
            temperature = feature_options.get("temperature")
            if temperature is None:
                raise ValueError("proposal='kernel' needs a temperature")
            queries, embeddings = (
                normalize_for_proposal(x, temperature) for x in (queries, embeddings)
            )
        log_q = jax.nn.log_softmax(queries @ embeddings.T, axis=-1)
        samples = inverse_cdf(key, jnp.exp(log_q), num_samples)
        return samples, jnp.take_along_axis(log_q, samples, axis=-1)
    projection_key, sample_key = jax.random.split(key)
    if sampler == "decomposition":
        features = proposal_features(
            projection_key, queries, embeddings, proposal=proposal, **feature_options
        )
        return sample_from_features(sample_key, *features, num_samples, sampler=sampler)
    estimates = proposal_estimates(
        projection_key, queries, embeddings, proposal=proposal, **feature_options
    )
    log_q = clipped_log_probabilities(estimates, uniform_floor)
    samples = inverse_cdf(sample_key, jnp.exp(log_q), num_samples)
    return samples, jnp.take_along_axis(log_q, samples, axis=-1)


def _check_feature_options(proposal: str, options: dict[str, Any]) -> None:
    """``TypeError`` for an option ``proposal_features`` does not take (a misspelt name), and
    ``ValueError`` for one that ``proposal`` does not read (it would be ignored)."""
    unknown = sorted(set(options) - set(FEATURE_OPTIONS))
    if unknown:
        raise TypeError(
            f"sample_proposal got unexpected feature options {unknown}; it takes "
            f"{', '.join(FEATURE_OPTIONS)}"
        )
    unread = sorted(set(options) - set(_READS.get(proposal, FEATURE_OPTIONS)))
    if unread:
        raise ValueError(
            f"proposal={proposal!r} does not read the feature options {unread} (it reads "
            f"{', '.join(_READS[proposal]) or 'none'})"
        )
