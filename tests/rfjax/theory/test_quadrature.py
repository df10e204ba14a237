"""Tests of ``rfjax.theory._quadrature``: the quadrature of SimRF Eq. 21 against the series and
mpmath, at any angle. Checked in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rfjax import theory
from tests.support import mpmath_reference
from tests.support.theory_points import relative_error

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("dim", [2, 3, 6, 16, 64, 256])
def test_series_agree_with_quadrature_of_eq21(dim):
    # simplex_conformity is the quadrature of Eq. 21; Eq. 24 (the paper's series) is summed in
    # exact arithmetic by mpmath. ORF: the 1F1 series (Eq. 23) against the quadrature.
    v = np.array([0.0, 0.3, 0.5, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(
        theory.simplex_conformity(dim, v),
        np.exp(mpmath_reference.log_simplex_series(dim, v)),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        theory.orthogonal_conformity(dim, v),
        theory.conformity_at_angle(dim, v, math.pi / 2),
        rtol=1e-9,
    )


def test_conformity_at_any_angle_matches_mpmath():
    # Both signs of cos(theta), the peak at the boundary (theta = 0), d = 1, large v.
    for dim, v, theta in [(1, 5.0, 2.0), (6, 20.0, 0.0), (6, 12.0, 2.5), (64, 20.0, math.pi)]:
        reference = mpmath_reference.log_conformity_quadrature(dim, v, math.cos(theta))
        log_rho = np.log(theory.conformity_at_angle(dim, v, theta))
        assert relative_error(log_rho, reference) <= 1e-12, (dim, v, theta)
