"""``rfjax.sampled_softmax.sample_proposal`` (``_proposals``): the clipped sampler proposes the
estimates of the proposal's features, the exact and uniform proposals draw from softmax(q.e)
and 1/V, and bad arguments are named."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.sampled_softmax import (
    clipped_proposal_log_probabilities,
    proposal_estimates,
    proposal_features,
    sample_proposal,
)
from tests.support.sampled_softmax_checks import (
    FEATURE_OPTIONS,
    VOCAB,
    assert_frequencies_match,
    problem,
)


@pytest.mark.parametrize(
    ("proposal", "traced"),
    [("angular_hybrid", False), ("gaussian_hybrid", True), ("positive_antithetic", False)],
)
def test_the_clipped_sampler_proposes_the_estimates_of_the_features(proposal, traced):
    """``proposal_estimates`` (the hybrids from their factors, the Gaussian hybrid also with a
    traced tau) is ``query_features @ class_features.T``, and ``sample_proposal``'s clipped
    sampler reports the log-probabilities of the clipped estimate of those features, under
    the uniform floor it is given."""
    queries, embeddings = problem()
    options = {**FEATURE_OPTIONS, "temperature": jnp.float32(0.5) if traced else 0.5}
    key = jax.random.key(12)
    q_feat, e_feat = proposal_features(key, queries, embeddings, proposal=proposal, **options)
    estimates = proposal_estimates(key, queries, embeddings, proposal=proposal, **options)
    product = np.asarray(q_feat @ e_feat.T)
    np.testing.assert_allclose(estimates, product, rtol=1e-4, atol=1e-5 * np.abs(product).max())
    samples, log_q = sample_proposal(
        jax.random.key(13),
        queries,
        embeddings,
        proposal=proposal,
        num_samples=50,
        uniform_floor=0.2,  # not the default 0.01
        **options,
    )
    projection_key, _ = jax.random.split(jax.random.key(13))
    features = proposal_features(projection_key, queries, embeddings, proposal=proposal, **options)
    expected = clipped_proposal_log_probabilities(*features, uniform_floor=0.2)
    np.testing.assert_allclose(log_q, jnp.take_along_axis(expected, samples, axis=-1), atol=1e-4)


def test_exact_and_uniform_proposals():
    queries, embeddings = problem()
    log_softmax = jax.nn.log_softmax(queries @ embeddings.T, axis=-1)
    samples, log_q = sample_proposal(
        jax.random.key(5), queries, embeddings, proposal="exact", num_samples=20_000
    )
    np.testing.assert_allclose(log_q, jnp.take_along_axis(log_softmax, samples, axis=-1), atol=1e-6)
    assert_frequencies_match(samples, jnp.exp(log_softmax))
    samples, log_q = sample_proposal(
        jax.random.key(6), queries, embeddings, proposal="uniform", num_samples=20_000
    )
    np.testing.assert_allclose(log_q, -math.log(VOCAB))
    assert_frequencies_match(samples, jnp.full((3, VOCAB), 1.0 / VOCAB))


def test_the_kernel_proposal_is_the_softmax_of_the_cosines_over_the_temperature():
    """Q = softmax(q_bar.e_bar / tau), the cosines computed here by hand: tau = 0.25 (its
    square root 0.5, its square 0.0625: either in place of tau gives another proposal)."""
    queries, embeddings = problem()
    q, e = (np.asarray(x, np.float64) for x in (queries, embeddings))
    cosines = (q / np.linalg.norm(q, axis=-1, keepdims=True)) @ (
        e / np.linalg.norm(e, axis=-1, keepdims=True)
    ).T
    log_softmax = jax.nn.log_softmax(jnp.asarray(cosines / 0.25, jnp.float32), axis=-1)
    samples, log_q = sample_proposal(
        jax.random.key(5),
        queries,
        embeddings,
        proposal="kernel",
        num_samples=20_000,
        temperature=0.25,
    )
    np.testing.assert_allclose(log_q, jnp.take_along_axis(log_softmax, samples, axis=-1), atol=1e-5)
    assert_frequencies_match(samples, jnp.exp(log_softmax))


def test_bad_arguments_raise_naming_them():
    queries, embeddings = problem()
    with pytest.raises(ValueError, match="proposal"):
        sample_proposal(jax.random.key(0), queries, embeddings, proposal="bogus", num_samples=4)
    with pytest.raises(ValueError, match="num_samples"):
        sample_proposal(jax.random.key(0), queries, embeddings, proposal="uniform", num_samples=0)
    with pytest.raises(ValueError, match="temperature"):
        sample_proposal(jax.random.key(0), queries, embeddings, proposal="kernel", num_samples=4)
    uniform = functools.partial(
        sample_proposal, jax.random.key(0), queries, embeddings, proposal="uniform", num_samples=4
    )
    with pytest.raises(ValueError, match="sampler"):
        uniform(sampler="bogus")
    with pytest.raises(TypeError, match=r"unexpected feature options \['num_featuers'\]"):
        uniform(num_featuers=4)
    with pytest.raises(ValueError, match=r"'uniform' does not read .*\['num_features'\]"):
        uniform(num_features=4)
    # A bad uniform_floor was taken silently where it is not read (plain proposals, the
    # decomposition sampler).
    with pytest.raises(ValueError, match="uniform_floor"):
        uniform(uniform_floor=-3.0)
    with pytest.raises(ValueError, match="uniform_floor"):
        sample_proposal(
            jax.random.key(0),
            queries,
            embeddings,
            proposal="positive",
            num_samples=4,
            num_features=4,
            temperature=1.0,
            sampler="decomposition",
            uniform_floor=5.0,
        )
