"""Tests of ``rfjax.theory._monte_carlo``: the Monte Carlo conformity against the closed forms
(within 4 standard errors, fixed keys) and its argument checks."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from rfjax import projections, theory
from tests.support.theory_points import DIM, PRF_X, PRF_Y, assert_within

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
def test_monte_carlo_conformity_matches_closed_forms(coupling):
    num_features = 9  # blocks (6, 3): 36 of the 72 ordered pairs share a block
    mean, se = theory.monte_carlo_conformity(
        jax.random.key(11),
        coupling,
        PRF_X,
        PRF_Y,
        num_features,
        num_samples=20_000,
        batch_size=20_000,
    )
    v = float(np.linalg.norm(PRF_X + PRF_Y))
    predicted = theory.effective_conformity(
        theory.conformity(coupling, DIM, v), v, theory.block_sizes(DIM, num_features)
    )
    assert_within(mean, se, float(predicted))


def test_monte_carlo_conformity_with_a_sampler_callable_and_general_angle():
    # Partial block as an r-vertex simplex (r = 3, cos = -1/2): pairs in it have the Eq. 21
    # conformity at theta = arccos(-1/2) (docs/maths/couplings.md: 1.689 at d = 6, v = 1).
    np.testing.assert_allclose(
        theory.conformity_at_angle(DIM, 1.0, math.acos(-0.5)), 1.689, atol=5e-4
    )

    def sampler(key, dim, num_features):
        return projections.simplex(key, dim, num_features, partial_block="simplex")

    mean, se = theory.monte_carlo_conformity(
        jax.random.key(3), sampler, PRF_X, PRF_Y, 9, num_samples=20_000, batch_size=20_000
    )
    v = float(np.linalg.norm(PRF_X + PRF_Y))
    pair_sum = (
        30 * theory.simplex_conformity(DIM, v)
        + 6 * theory.conformity_at_angle(DIM, v, math.acos(-0.5))
        + 36 * theory.iid_conformity(v)
    )
    assert_within(mean, se, float(pair_sum / 72))
    assert isinstance(mean, float) and isinstance(se, float) and se > 0


def test_monte_carlo_bad_inputs_raise():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="unknown coupling"):
        theory.monte_carlo_conformity(key, "nope", PRF_X, PRF_Y, 6, num_samples=10)
    with pytest.raises(ValueError, match="num_features"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X, PRF_Y, 1, num_samples=10)
    with pytest.raises(ValueError, match="num_samples"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X, PRF_Y, 6, num_samples=1)
    with pytest.raises(ValueError, match="shape"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X[None], PRF_Y, 6, num_samples=10)
    with pytest.raises(TypeError, match="key"):
        theory.monte_carlo_conformity(0, "gaussian", PRF_X, PRF_Y, 6, num_samples=10)
    with pytest.raises(TypeError, match="sampler"):
        theory.monte_carlo_conformity(key, 3, PRF_X, PRF_Y, 6, num_samples=10)
