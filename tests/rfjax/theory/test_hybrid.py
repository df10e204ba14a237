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


def test_complex_exponential_mse_of_a_complex_matrix_is_the_integral():
    """A general complex A (u = a + i b with a.b != 0; A = iI and A = I above give a.b = 0)
    against the MSE as an integral: one feature's Re X = exp(w.a - Re c) cos(w.b - Im c),
    c = (Ax.Ax + A^-T y.A^-T y) / 2 (bilinear), depends on w ~ N(0, I) only through the
    jointly Gaussian (w.a, w.b), so E[(Re X - SM)^2] is a 2-d Gauss-Hermite sum (60^2 nodes,
    exact to rounding here); m features divide it by m. The cos(2 a.b) term written as
    cos(a.b) passed every test."""
    from tests.support.hybrid_points import COMPLEX_A

    x, y = pair(HYBRID_DIM, 1.2, 0.5, math.cos(0.9))
    matrix = np.exp(0.25j * math.pi) * COMPLEX_A.astype(np.complex128)
    ax, by = matrix @ x, np.linalg.inv(matrix.T) @ y
    u = ax + by
    a, b = u.real, u.imag
    assert abs(a @ b) > 0.1
    c = (ax @ ax + by @ by) / 2
    # (w.a, w.b) = L (g1, g2) with L the Cholesky factor of [[a.a, a.b], [a.b, b.b]].
    chol = np.linalg.cholesky(np.array([[a @ a, a @ b], [a @ b, b @ b]]))
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    g = np.stack(np.meshgrid(nodes, nodes, indexing="ij"))
    wa, wb = np.einsum("ij,jkl->ikl", chol, g)
    real_x = np.exp(wa - c.real) * np.cos(wb - c.imag)
    weight = np.outer(weights, weights) / (2 * math.pi)
    kernel = math.exp(x @ y)
    assert np.sum(weight * real_x) == pytest.approx(kernel, rel=1e-12)  # unbiased
    want = np.sum(weight * (real_x - kernel) ** 2)
    for m in (1, 8):
        got = float(theory.complex_exponential_mse(x, y, matrix, m))
        assert got == pytest.approx(want / m, rel=1e-10)


def test_complex_exponential_mse_of_a_diagonal_is_that_of_the_diagonal_matrix():
    """A diagonal given as (d,) takes the branch u = A x + A^{-1} y elementwise; it must equal
    the full diag(A) (a complex diagonal, so A^{-T} != A^T and A^{-1} != A)."""
    x, y = pair(HYBRID_DIM, 0.9, 0.7, math.cos(1.1))
    diagonal = np.array([1.2 + 0.3j, 0.7 - 0.5j, 2.0, -0.8 + 0.1j])
    np.testing.assert_allclose(
        theory.complex_exponential_mse(x, y, diagonal, 8),
        theory.complex_exponential_mse(x, y, np.diag(diagonal), 8),
        rtol=1e-12,
    )


def test_complex_exponential_mse_takes_an_ill_conditioned_matrix_below_float64s_limit():
    """Condition number 1e9 < 1/eps of float64 (4.5e15) is accepted, as documented (a limit at
    float32's 1/eps, 8.4e6, would refuse it)."""
    x, y = pair(HYBRID_DIM, 0.5, 0.5, 0.3)
    matrix = np.diag([1.0, 1.0, 1.0, 1e-9])
    assert np.isfinite(theory.complex_exponential_mse(x, y, matrix, 4))


def test_the_angle_with_a_zero_input_is_a_right_angle():
    """theta = pi/2 when x or y is 0 (as in rfjax.kernels): lambda-hat has mean 1/2 and the
    largest variance 1/(4n)."""
    moments = theory.angular_coefficient_moments(np.zeros(HYBRID_DIM), np.ones(HYBRID_DIM), 4)
    np.testing.assert_allclose([moments.mean, moments.variance], [0.5, 1 / 16], rtol=1e-12)


@pytest.mark.parametrize(
    ("theta", "radius", "argument"), [(-0.1, 1.0, "theta"), (1.0, -0.5, "radius")]
)
def test_sphere_errors_refuse_a_negative_angle_or_radius(theta, radius, argument):
    for function in (theory.trigonometric_relative_error, theory.positive_relative_error):
        with pytest.raises(ValueError, match=f"{argument} must"):
            function(theta, radius, 8)
    with pytest.raises(ValueError, match=f"{argument} must"):
        theory.angular_hybrid_relative_error(theta, radius, 8, NUM_SIGNS)
    if argument == "radius":
        with pytest.raises(ValueError, match="radius must"):
            theory.max_relative_error(radius, 8)


def test_complex_exponential_mse_refuses_a_scalar_matrix():
    x, y = pair(HYBRID_DIM, 0.5, 0.5, 0.3)
    with pytest.raises(ValueError, match=r"matrix must have shape \(d, d\) = \(4, 4\)"):
        theory.complex_exponential_mse(x, y, 2.0, 4)


def test_the_angle_of_parallel_inputs_is_exact_despite_rounding():
    """x and 3x (or -2x): the computed cosine can round past +-1 (1 + 2e-16), where arccos is
    NaN; it is clipped, so theta is 0 (pi) and lambda-hat's mean 0 (1) with no variance."""
    xs = np.random.default_rng(0).normal(size=(20, HYBRID_DIM))
    for scale, mean in ((3.0, 0.0), (-2.0, 1.0)):
        moments = theory.angular_coefficient_moments(xs, scale * xs, NUM_SIGNS)
        np.testing.assert_allclose(moments.mean, mean, atol=1e-7)
        np.testing.assert_allclose(moments.variance, 0.0, atol=1e-7)
