"""The sampled-softmax loss with the log-proposal correction (``sampled_softmax_loss``)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rfjax._validation import as_array, check_ids, check_inputs


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
      targets: int ``(N,)`` target classes, in ``[0, V)``.
      samples: int ``(N, M)`` negatives drawn from Q, in ``[0, V)``. Ids outside it raise
        ``ValueError`` (inside ``jit``, where they are unknown, their rows' losses are NaN).
      log_proposal: ``(N, M)`` log Q(s_j | q_n).
      remove_accidental_hits: drop negatives equal to the target.

    Returns:
      ``(N,)`` losses.
    """
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    targets = check_ids("targets", targets, embeddings.shape[0])
    samples = check_ids("samples", samples, embeddings.shape[0])
    log_proposal = as_array("log_proposal", log_proposal)
    if samples.ndim != 2 or samples.shape[0] != queries.shape[0]:
        raise ValueError(f"samples must have shape (N, M) with N = {queries.shape[0]}")
    if log_proposal.shape != samples.shape or targets.shape != queries.shape[:1]:
        raise ValueError(
            f"log_proposal must match samples {samples.shape} and targets have shape "
            f"({queries.shape[0]},); got {log_proposal.shape} and {targets.shape}"
        )
    target_logits = jnp.sum(queries * _rows(embeddings, targets), axis=-1)
    sampled = jnp.einsum("nd,nmd->nm", queries, _rows(embeddings, samples))
    sampled = sampled - jax.lax.stop_gradient(log_proposal) - math.log(samples.shape[1])
    if remove_accidental_hits:
        sampled = jnp.where(samples == targets[:, None], -jnp.inf, sampled)
    all_logits = jnp.concatenate([target_logits[:, None], sampled], axis=-1)
    return jax.nn.logsumexp(all_logits, axis=-1) - target_logits


def _rows(embeddings: jax.Array, ids: jax.Array) -> jax.Array:
    """``embeddings[ids]``, NaN for an id outside ``[0, V)`` (where JAX's indexing would clamp
    it, or wrap a negative one, to a real class)."""
    return embeddings.at[ids].get(mode="fill", fill_value=jnp.nan, wrap_negative_indices=False)
