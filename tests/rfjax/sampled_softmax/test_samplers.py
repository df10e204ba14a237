"""``rfjax.sampled_softmax``'s samplers (``_samplers``): the classes they draw follow the
distribution they report, the clipped proposal is the clipped kernel estimate with its uniform
floor, and for positive features the decomposition is the normalised estimate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.sampled_softmax import (
    clipped_proposal_log_probabilities,
    feature_proposal_probabilities,
    proposal_features,
    sample_from_features,
)
from tests.support.sampled_softmax_checks import (
    FEATURE_OPTIONS,
    VOCAB,
    assert_frequencies_match,
    problem,
)

# One sampler serves every feature proposal: the signed, two-sided angular hybrid runs by
# default, the others (same code path) with --runslow.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("proposal", "sampler"),
    [
        ("angular_hybrid", "clipped"),
        ("angular_hybrid", "decomposition"),
        pytest.param("positive_antithetic", "clipped", marks=SLOW),
        pytest.param("trigonometric", "decomposition", marks=SLOW),
        pytest.param("gaussian_hybrid", "clipped", marks=SLOW),
    ],
)
def test_feature_sampler_draws_from_the_proposal_it_reports(proposal, sampler):
    queries, embeddings = problem()
    features = proposal_features(
        jax.random.key(1), queries, embeddings, proposal=proposal, **FEATURE_OPTIONS
    )
    probabilities = feature_proposal_probabilities(*features, sampler=sampler)
    samples, log_q = sample_from_features(jax.random.key(2), *features, 10_000, sampler=sampler)
    assert_frequencies_match(samples, probabilities)
    expected = jnp.log(jnp.take_along_axis(probabilities, samples, axis=-1))
    np.testing.assert_allclose(log_q, expected, atol=1e-4)


def test_clipped_proposal_is_the_clipped_estimate_with_a_uniform_floor():
    """Q = (1 - eps) max(K-hat, 0) / sum + eps / V, computed by hand for a signed estimator
    whose estimates include negatives; a row with no positive estimate is uniform."""
    queries, embeddings = problem()
    q_feat, e_feat = proposal_features(
        jax.random.key(3), queries, embeddings, proposal="trigonometric", **FEATURE_OPTIONS
    )
    estimate = np.asarray(q_feat @ e_feat.T, np.float64)
    assert np.any(estimate < 0)  # the clipping matters here
    clipped = np.maximum(estimate, 0)
    expected = 0.9 * clipped / clipped.sum(-1, keepdims=True) + 0.1 / VOCAB
    got = feature_proposal_probabilities(q_feat, e_feat, sampler="clipped", uniform_floor=0.1)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    flipped = feature_proposal_probabilities(-jnp.abs(q_feat), jnp.abs(e_feat))
    np.testing.assert_allclose(flipped, np.full((3, VOCAB), 1 / VOCAB), rtol=1e-6)


def test_positive_proposal_is_the_normalised_kernel_estimate():
    queries, embeddings = problem()
    q_feat, e_feat = proposal_features(
        jax.random.key(3), queries, embeddings, proposal="positive_antithetic", **FEATURE_OPTIONS
    )
    estimate = q_feat @ e_feat.T
    np.testing.assert_allclose(
        feature_proposal_probabilities(q_feat, e_feat, sampler="decomposition"),
        estimate / estimate.sum(-1, keepdims=True),
        rtol=1e-5,
    )


def test_a_query_without_feature_mass_draws_uniformly():
    """Features all 0 (underflowed): both samplers draw uniformly, log Q = -log V (the
    decomposition gave NaN), and the other queries keep their own draws; the proposal they
    report for that query is uniform too (the decomposition's was NaN)."""
    queries, embeddings = problem()
    query_features, class_features = proposal_features(
        jax.random.key(1), queries, embeddings, proposal="angular_hybrid", **FEATURE_OPTIONS
    )
    zeroed = query_features.at[0].set(0.0)
    for sampler in ("clipped", "decomposition"):
        samples, log_q = sample_from_features(
            jax.random.key(2), zeroed, class_features, 4000, sampler=sampler
        )
        np.testing.assert_allclose(log_q[0], -np.log(VOCAB), rtol=1e-6)
        reported = feature_proposal_probabilities(zeroed, class_features, sampler=sampler)
        np.testing.assert_allclose(reported[0], 1.0 / VOCAB, rtol=1e-6)
        np.testing.assert_allclose(
            reported[1:],
            feature_proposal_probabilities(query_features, class_features, sampler=sampler)[1:],
        )
        assert_frequencies_match(samples[:1], jnp.full((1, VOCAB), 1.0 / VOCAB))
        _, kept = sample_from_features(
            jax.random.key(2), query_features, class_features, 4000, sampler=sampler
        )
        assert np.all(np.isfinite(log_q)) and np.all(np.isfinite(kept))


def test_bad_arguments_raise_naming_them():
    queries, embeddings = problem()
    with pytest.raises(ValueError, match="sampler"):
        sample_from_features(jax.random.key(0), queries, embeddings, 4, sampler="abs")
    with pytest.raises(ValueError, match="num_samples"):
        sample_from_features(jax.random.key(0), queries, embeddings, 0)
    with pytest.raises(ValueError, match="uniform_floor"):
        clipped_proposal_log_probabilities(queries, embeddings, uniform_floor=1.5)
