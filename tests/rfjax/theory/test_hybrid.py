"""Tests of ``rfjax.theory._hybrid``: identities between the hybrid random features' closed forms
and their composition with jit and grad. The checks against Monte Carlo draws of the features
are in tests/rfjax/features/test_hybrid.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import theory
from tests.support.theory_points import DIM, PRF_X, RFF_Y, central_difference, pair

pytestmark = pytest.mark.usefixtures("float64")

HYBRID_DIM = 4
NUM_SIGNS = 4  # n


def test_hybrid_theory_composes_with_jit_and_grad():
    def total(scale):
        x, y = scale * PRF_X, scale * RFF_Y
        return (
            theory.angular_hybrid_mse(x, y, 8, 4, variant="shared")
            + theory.complex_exponential_mse(x, y, jnp.full(DIM, 1.2), 8)
            + theory.angular_hybrid_relative_error(1.0, scale, 8, 4)
        )

    np.testing.assert_allclose(jax.jit(total)(0.9), total(0.9), rtol=1e-14)
    slope = jax.jit(jax.grad(total))(0.9)
    np.testing.assert_allclose(slope, central_difference(total, 0.9), rtol=1e-7)


def test_theory_identities():
    r = 1.1
    thetas = np.linspace(0.0, math.pi, 2001)
    x = np.stack([np.full_like(thetas, r), np.zeros_like(thetas), *[np.zeros_like(thetas)] * 2], -1)
    y = np.stack([r * np.cos(thetas), r * np.sin(thetas), *[np.zeros_like(thetas)] * 2], -1)
    sm = np.exp(r * r * np.cos(thetas))
    hyb = theory.angular_hybrid_relative_error(thetas, r, 8, NUM_SIGNS)
    for variant in ("independent", "shared"):  # equal norms: the variants coincide
        np.testing.assert_allclose(
            np.sqrt(theory.angular_hybrid_mse(x, y, 8, NUM_SIGNS, variant=variant)) / sm,
            hyb,
            rtol=1e-9,
            atol=1e-12,
        )
    np.testing.assert_allclose(
        np.sqrt(theory.trigonometric_mse(x, y, 8)) / sm,
        theory.trigonometric_relative_error(thetas, r, 8),
        rtol=1e-9,
        atol=1e-12,
    )
    trig_max = theory.trigonometric_relative_error(thetas, r, 8).max()
    positive_max = theory.positive_relative_error(thetas, r, 8).max()
    np.testing.assert_allclose(
        [trig_max, positive_max], theory.max_relative_error(r, 8), rtol=1e-12
    )
    assert hyb[0] == 0.0 and hyb[-1] < 1e-12 and hyb.max() < trig_max
    # CE with A = iI has the trigonometric MSE, with A = I the plain positive (PRF) MSE.
    xa, ya = pair(HYBRID_DIM, 0.9, 0.5, math.cos(1.2))
    np.testing.assert_allclose(
        theory.complex_exponential_mse(xa, ya, 1j * np.eye(HYBRID_DIM), 8),
        theory.trigonometric_mse(xa, ya, 8),
        rtol=1e-9,
    )
    np.testing.assert_allclose(
        theory.complex_exponential_mse(xa, ya, np.eye(HYBRID_DIM), 8),
        theory.prf_mse(xa, ya, 8, kernel="softmax"),
        rtol=1e-9,
    )
