"""Tests of rfjax.theory._series: log 0F1 against mpmath and SciPy."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from rfjax import theory
from tests.support import mpmath_reference

pytestmark = pytest.mark.usefixtures("float64")


def test_log_hyp0f1_matches_mpmath_and_scipy_derivative():
    z = np.array([0.0, 1e-3, 0.7, 12.0, 300.0, 1e4])
    for b in (0.5, 3.0, 32.0):
        slope = jax.jit(jax.vmap(jax.grad(functools.partial(theory.log_hyp0f1, b))))
        exact = [float(mpmath_reference.mp.log(mpmath_reference.mp.hyp0f1(b, t))) for t in z]
        np.testing.assert_allclose(theory.log_hyp0f1(b, z), exact, rtol=1e-15, atol=1e-15)
        expected = special.hyp0f1(b + 1, z) / (b * special.hyp0f1(b, z))
        np.testing.assert_allclose(slope(jnp.asarray(z)), expected, rtol=1e-12)
    # Where 0F1 itself overflows (log 0F1 ~ 2 sqrt(z) = 2000): against the exponentially scaled
    # Bessel function, 0F1(; b; z) = Gamma(b) z^((1-b)/2) I_{b-1}(2 sqrt(z)).
    b, z = 2.5, 1e6
    expected = (
        math.lgamma(b) + 0.5 * (1 - b) * math.log(z) + math.log(special.ive(b - 1, 2e3)) + 2e3
    )
    np.testing.assert_allclose(theory.log_hyp0f1(b, z), expected, rtol=1e-14)
    with pytest.raises(ValueError, match="z must lie in"):
        theory.log_hyp0f1(1.0, -1.0)
    with pytest.raises(ValueError, match="b must be > 0"):
        theory.log_hyp0f1(0.0, 1.0)


def test_log_hyp0f1_static_bound_is_inclusive_up_to_1e8():
    z = np.array([0.7, 1e6])
    np.testing.assert_allclose(
        theory.log_hyp0f1(2.5, z, max_argument=1e8), theory.log_hyp0f1(2.5, z), rtol=1e-13
    )
    with pytest.raises(ValueError, match=r"max_argument must be <= 1e\+08, got 2e\+08"):
        theory.log_hyp0f1(2.5, z, max_argument=2e8)
    with pytest.raises(ValueError, match=r"z must lie in \[0, 10\]"):
        theory.log_hyp0f1(2.5, z, max_argument=10.0)
