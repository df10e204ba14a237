"""``rfjax.sampled_softmax``'s proposal features (``_proposal_features``): every softmax map of
the ``rfjax.features`` registry is a proposal, its features estimate the proposal kernel without
bias, and a traced temperature gives the library's Gaussian hybrid."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.sampled_softmax import (
    feature_proposal_probabilities,
    feature_proposals,
    normalize_for_proposal,
    proposal_features,
    proposals,
)
from tests.support.compiled import jitted
from tests.support.sampled_softmax_checks import DIM, FEATURE_OPTIONS, problem


def test_every_registered_softmax_map_is_a_proposal():
    """The proposals come from the ``rfjax.features`` registry: maps the sampled softmax never
    named (OPRF, fitted to the inputs; SADERF) propose through the same path, with the widths of
    their maps."""
    from rfjax import features

    assert feature_proposals() == features.available(kernel="softmax")
    assert {"oprf", "saderf", "positive_antithetic"} <= set(proposals())
    queries, embeddings = problem()
    for proposal in ("oprf", "saderf"):
        q_feat, e_feat = jitted(proposal_features)(
            jax.random.key(3),
            queries,
            embeddings,
            proposal=proposal,
            **FEATURE_OPTIONS,
        )
        assert q_feat.shape == (3, FEATURE_OPTIONS["num_features"])
        probabilities = jitted(feature_proposal_probabilities)(q_feat, e_feat)
        np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-5)


def test_signed_proposals_estimate_the_kernel_without_bias():
    """phi(q).psi(e) averages to exp(q_bar.e_bar / tau) over draws, every one of the 80 cells
    within 4.5 SE (4 SE Bonferroni-widened for 80 cells); tau = 2 keeps the estimators' tails
    light enough for the sample SE to be reliable."""
    queries, embeddings = problem(num_queries=2)
    options = {**FEATURE_OPTIONS, "temperature": 2.0}
    tau = options["temperature"]
    truth = jnp.exp(
        normalize_for_proposal(queries, tau) @ normalize_for_proposal(embeddings, tau).T
    )
    # The two wirings: symmetric features (positive; trigonometric is the same code path) and
    # query/key hybrid sides (angular; the Gaussian hybrid is the same code path).
    for proposal in ("positive_antithetic", "angular_hybrid"):

        def draw(key, proposal=proposal):
            q_feat, e_feat = proposal_features(
                key, queries, embeddings, proposal=proposal, **options
            )
            return q_feat @ e_feat.T

        estimates = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.key(4), 2_000))
        se = estimates.std(0) / math.sqrt(estimates.shape[0])
        assert jnp.all(jnp.abs(estimates.mean(0) - truth) <= 4.5 * se + 1e-5), proposal


@pytest.mark.parametrize("traced", [True, False])
def test_gaussian_hybrid_matches_the_library_map(traced):
    """With bandwidth = radius, ``proposal_features`` (tau a traced array, or a Python float:
    the map built with that radius) equals ``gaussian_hybrid_features`` on the normalised
    inputs with r = 1/sqrt(tau) as a number."""
    from rfjax import projections
    from rfjax.features import gaussian_hybrid_features

    queries, embeddings = problem()
    tau = 0.5
    radius = 1 / math.sqrt(tau)
    options = {**FEATURE_OPTIONS, "temperature": tau}
    features_at = functools.partial(
        proposal_features, jax.random.key(4), queries, embeddings, proposal="gaussian_hybrid"
    )
    options.pop("temperature")
    if traced:
        got = jax.jit(lambda t: features_at(**options, temperature=t))(jnp.float32(tau))
    else:
        got = features_at(**options, temperature=tau)
    base_key, coefficient_key = jax.random.split(jax.random.key(4))
    base = projections.gaussian(base_key, DIM, options["num_features"])
    coefficient = projections.gaussian(coefficient_key, DIM, options["num_coefficient_features"])

    @functools.partial(jax.jit, static_argnames="side")
    def library_map(x, base, coefficient, side):
        return gaussian_hybrid_features(
            normalize_for_proposal(x, tau),
            base,
            base,
            coefficient,
            side=side,
            bandwidth=radius,
            radius=radius,
        )

    for x, side, features in zip((queries, embeddings), ("query", "key"), got, strict=True):
        expected = library_map(x, base, coefficient, side=side)
        np.testing.assert_allclose(features, expected, rtol=2e-5, atol=1e-6)


def test_bad_arguments_raise_naming_them():
    queries, embeddings = problem()
    with pytest.raises(ValueError, match="proposal"):
        proposal_features(
            jax.random.key(0), queries, embeddings, proposal="uniform", num_features=4
        )
    positive = functools.partial(
        proposal_features, jax.random.key(0), queries, embeddings, proposal="positive"
    )
    with pytest.raises(ValueError, match="temperature"):
        positive(num_features=4, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        normalize_for_proposal(queries, jnp.ones(2))
    # A concrete array of 0 or -1 was not checked: NaN features, then an error about x.
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite real > 0"):
            normalize_for_proposal(queries, jnp.asarray(bad))
        with pytest.raises(ValueError, match="temperature must be a finite real > 0"):
            positive(num_features=4, temperature=jnp.asarray(bad))
