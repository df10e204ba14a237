"""``rfjax.sampled_softmax.sampled_softmax_loss`` (``_loss``): its normaliser is unbiased with
and without accidental hits, and the loss tends to the full cross-entropy."""

import math

import jax
import jax.numpy as jnp
import pytest

from rfjax.sampled_softmax import feature_proposals, sample_proposal, sampled_softmax_loss
from tests.support.sampled_softmax_checks import FEATURE_OPTIONS, problem

SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("proposal", "remove_hits"),
    [
        ("uniform", False),
        ("exact", True),
        ("angular_hybrid", True),
        pytest.param("positive_antithetic", True, marks=SLOW),
    ],
)
def test_sampled_normaliser_is_unbiased(proposal, remove_hits):
    """exp(loss + o_t) estimates Z = sum_i exp(o_i) (Z + exp(o_t) when hits are kept)."""
    queries, embeddings = problem(num_queries=4)
    targets = jnp.array([0, 5, 17, 39])
    logits = queries @ embeddings.T
    target_logits = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    options = FEATURE_OPTIONS if proposal in feature_proposals() else {}

    def normaliser(key):
        samples, log_q = sample_proposal(
            key, queries, embeddings, proposal=proposal, num_samples=5, **options
        )
        loss = sampled_softmax_loss(
            queries,
            embeddings,
            targets,
            samples,
            log_q,
            remove_accidental_hits=remove_hits,
        )
        return jnp.exp(loss + target_logits)

    values = jax.jit(jax.vmap(normaliser))(jax.random.split(jax.random.key(7), 2_000))
    truth = jnp.exp(jax.nn.logsumexp(logits, axis=-1))
    if not remove_hits:
        truth = truth + jnp.exp(target_logits)
    se = values.std(0) / math.sqrt(values.shape[0])
    assert jnp.all(jnp.abs(values.mean(0) - truth) <= 4 * se + 1e-5 * truth)


def test_sampled_loss_tends_to_the_full_cross_entropy():
    queries, embeddings = problem(num_queries=4)
    targets = jnp.array([1, 2, 3, 4])
    samples, log_q = sample_proposal(
        jax.random.key(8), queries, embeddings, proposal="uniform", num_samples=50_000
    )
    loss = sampled_softmax_loss(queries, embeddings, targets, samples, log_q)
    logits = queries @ embeddings.T
    full = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], axis=-1)[:, 0]
    # loss = log Z_hat - o_t with Z_hat = exp(o_t) + mean_j w_j: by the delta method the SE of
    # the loss is SE(mean w) / Z, from the samples' own spread.
    weights = jnp.where(
        samples == targets[:, None],
        0.0,
        jnp.exp(jnp.take_along_axis(logits, samples, axis=-1) - log_q),
    )
    se = weights.std(-1) / math.sqrt(samples.shape[1]) / jnp.exp(jax.nn.logsumexp(logits, -1))
    assert jnp.all(jnp.abs(loss - full) <= 4 * se), (loss - full, se)


def test_bad_shapes_raise_naming_the_argument():
    queries, embeddings = problem(num_queries=2)
    targets = jnp.array([0, 1])
    samples = jnp.zeros((2, 3), jnp.int32)
    log_q = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="samples"):
        sampled_softmax_loss(queries, embeddings, targets, samples[:1], log_q)
    with pytest.raises(ValueError, match="log_proposal"):
        sampled_softmax_loss(queries, embeddings, targets, samples, log_q[:, :2])
    with pytest.raises(ValueError, match="embeddings"):
        sampled_softmax_loss(queries, embeddings[:, :2], targets, samples, log_q)


def test_ids_outside_the_vocabulary_raise_or_give_nan():
    """Concrete ids outside [0, V) raise naming their argument; traced ones (unknown until
    run) give NaN losses in their rows only, where indexing clamped them to a real class."""
    queries, embeddings = problem(num_queries=2)
    vocabulary = embeddings.shape[0]
    targets, samples = jnp.array([0, 1]), jnp.zeros((2, 3), jnp.int32)
    log_q = jnp.zeros((2, 3))
    for bad_targets, bad_samples, name in [
        (jnp.array([0, vocabulary]), samples, "targets"),
        (jnp.array([0, -1]), samples, "targets"),
        (targets, samples.at[1, 2].set(vocabulary), "samples"),
    ]:
        with pytest.raises(ValueError, match=rf"{name} must hold ids in \[0, {vocabulary}\)"):
            sampled_softmax_loss(queries, embeddings, bad_targets, bad_samples, log_q)
        traced = jax.jit(sampled_softmax_loss)(queries, embeddings, bad_targets, bad_samples, log_q)
        assert jnp.isfinite(traced[0]) and jnp.isnan(traced[1])
    with pytest.raises(TypeError, match="samples must be an integer array"):
        sampled_softmax_loss(queries, embeddings, targets, samples.astype(jnp.float32), log_q)
    as_lists = sampled_softmax_loss(queries, embeddings, [0, 1], samples.tolist(), log_q)
    assert jnp.array_equal(
        as_lists, sampled_softmax_loss(queries, embeddings, targets, samples, log_q)
    )


def test_gradients_flow_through_the_logits_only():
    """The log-proposal is a constant of the loss (as the docstring says): its gradient is 0,
    and a log-proposal computed from the queries leaves the queries' gradient that of a
    constant one."""
    queries, embeddings = problem(num_queries=2)
    targets = jnp.array([0, 1])
    samples = jnp.array([[2, 3, 0], [4, 4, 5]])
    log_q = jnp.full((2, 3), -math.log(embeddings.shape[0]))

    def loss(queries, log_q):
        return jnp.sum(sampled_softmax_loss(queries, embeddings, targets, samples, log_q))

    assert jnp.all(jax.grad(loss, argnums=1)(queries, log_q) == 0)
    constant = jax.grad(loss)(queries, log_q)
    # log Q plus a term of value 0 whose derivative in the queries is 1
    follows = jax.grad(lambda q: loss(q, log_q + jnp.sum(q - jax.lax.stop_gradient(q))))
    assert jnp.array_equal(follows(queries), constant)
    assert jnp.any(constant != 0)
