"""Tests of ``rfjax.theory._mse``: the PRF and RFF MSEs, the orthogonality gaps and ratio
(Eq. 25-27), the small-v prefactor, Monte Carlo checks and composition with jit / vmap / grad.

Checked in float64 (the Monte Carlo draws are float32, as the samplers' default). Statistical
checks use fixed keys and pass when |measured - predicted| <= 4 standard errors.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import theory
from tests.support.theory_points import (
    DIM,
    NUM_DRAWS,
    PRF_X,
    PRF_Y,
    RFF_X,
    RFF_Y,
    assert_within,
    central_difference,
    mean_se,
    prf_estimates,
    prf_kernel,
    projected,
)

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize(
    ("dim", "printed", "digits"), [(6, 0.07961, 5), (64, 0.007782, 6), (128, 0.003899, 6)]
)
def test_small_v_prefactor_reference(dim, printed, digits):
    assert round(theory.small_v_prefactor("simplex", dim, dim), digits) == printed
    assert theory.small_v_prefactor("gaussian", dim, dim) == 1.0
    assert theory.small_v_prefactor("orthogonal", dim, dim) == 1.0


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
@pytest.mark.parametrize("num_features", [2, 4, 6])
def test_small_v_prefactor_is_the_limit_of_prf_mse(coupling, num_features):
    v = 1e-3
    x = np.full(DIM, v / (2 * math.sqrt(DIM)))  # x = y, |x + y| = v
    scaled = (
        num_features
        * math.exp(4 * x @ x)
        * theory.prf_mse(x, x, num_features, coupling=coupling)
        / v**2
    )
    np.testing.assert_allclose(
        scaled, theory.small_v_prefactor(coupling, DIM, num_features), rtol=1e-5
    )


@pytest.mark.parametrize(("dim", "num_features"), [(6, 1), (6, 3), (6, 6), (64, 40)])
def test_prf_gap_eq25_equals_mse_difference(dim, num_features):
    rng = np.random.default_rng(dim + num_features)
    x = 0.3 * rng.standard_normal((5, dim))
    y = 0.3 * rng.standard_normal((5, dim))
    difference = theory.prf_mse(x, y, num_features) - theory.prf_mse(
        x, y, num_features, coupling="orthogonal"
    )
    gap = theory.prf_orthogonality_gap(x, y, num_features)
    np.testing.assert_allclose(gap, difference, rtol=1e-9, atol=1e-15)
    if num_features > 1:
        assert np.all(gap > 0)


@pytest.mark.parametrize(("dim", "num_features"), [(6, 6), (16, 9)])
def test_rff_gap_eq26_equals_mse_difference(dim, num_features):
    z = np.array([0.3, 1.0, 1.7, 3.0])
    x = np.zeros((z.size, dim))
    x[:, 0] = z
    difference = theory.rff_mse(x, np.zeros(dim), num_features) - theory.rff_mse(
        x, np.zeros(dim), num_features, coupling="orthogonal"
    )
    np.testing.assert_allclose(
        theory.rff_orthogonality_gap(z, dim, num_features), difference, rtol=1e-9, atol=1e-15
    )


def test_rff_asymptotic_ratio_eq27_converges_like_one_over_d():
    z = 1.2
    errors = []
    for dim in (64, 256, 1024):
        x = np.zeros(dim)
        x[0] = z
        y = np.zeros(dim)
        exact = theory.rff_mse(x, y, dim, coupling="orthogonal") / theory.rff_mse(x, y, dim)
        errors.append(abs(exact - theory.rff_orthogonal_mse_ratio_asymptotic(z, dim, dim)))
    assert errors[0] > errors[1] > errors[2]
    assert 3.0 < errors[0] / errors[1] < 5.0 and 3.0 < errors[1] / errors[2] < 5.0
    np.testing.assert_allclose(theory.rff_orthogonal_mse_ratio_asymptotic(0.0, 8, 5), 0.5)


def test_rff_simplex_is_worse_than_orthogonal():
    # docs/maths/fourier_features.md: MSE/MSE_IID at z = 1, m = d: ORF 0.300 vs SimRF 0.465 (d = 6).
    for dim, orf, sim in ((6, 0.300, 0.465), (64, 0.098, 0.112)):
        x = np.zeros(dim)
        x[0] = 1.0
        y = np.zeros(dim)
        iid = theory.rff_mse(x, y, dim)
        assert round(float(theory.rff_mse(x, y, dim, coupling="orthogonal") / iid), 3) == orf
        assert round(float(theory.rff_mse(x, y, dim, coupling="simplex") / iid), 3) == sim


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
@pytest.mark.parametrize("num_features", [6, pytest.param(9, marks=pytest.mark.statistical)])
def test_prf_mse_matches_monte_carlo(coupling, num_features):
    for kernel in ("gaussian", "softmax"):
        estimates = prf_estimates(coupling, num_features, kernel)
        truth = prf_kernel(kernel)
        assert_within(*mean_se(estimates), truth)  # unbiased
        mse, se = mean_se((estimates - truth) ** 2)
        predicted = theory.prf_mse(PRF_X, PRF_Y, num_features, coupling=coupling, kernel=kernel)
        assert_within(mse, se, float(predicted))


def test_prf_monte_carlo_discriminates_simplex_from_orthogonal():
    estimates = prf_estimates("simplex", DIM, "gaussian")
    mse, se = mean_se((estimates - prf_kernel("gaussian")) ** 2)
    orthogonal_prediction = float(theory.prf_mse(PRF_X, PRF_Y, DIM, coupling="orthogonal"))
    assert abs(mse - orthogonal_prediction) > 20 * se


@pytest.mark.parametrize(
    ("coupling", "num_features"),
    [("gaussian", 6), ("orthogonal", 6), ("orthogonal", 9), ("simplex", 6), ("simplex", 9)],
)
def test_rff_sincos_mse_matches_monte_carlo(coupling, num_features):
    proj = projected(coupling, num_features)
    estimates = np.mean(np.cos(proj[:, 2] - proj[:, 3]), axis=-1)
    truth = math.exp(-np.sum((RFF_X - RFF_Y) ** 2) / 2)
    mse, se = mean_se((estimates - truth) ** 2)
    assert_within(mse, se, float(theory.rff_mse(RFF_X, RFF_Y, num_features, coupling=coupling)))


def test_rff_cosine_bias_mse_matches_monte_carlo():
    num_features = 6
    proj = projected("gaussian", num_features)
    bias = (
        2
        * math.pi
        * np.asarray(
            jax.random.uniform(jax.random.key(7), (NUM_DRAWS, num_features)), dtype=np.float64
        )
    )
    estimates = np.mean(2 * np.cos(proj[:, 2] + bias) * np.cos(proj[:, 3] + bias), axis=-1)
    truth = math.exp(-np.sum((RFF_X - RFF_Y) ** 2) / 2)
    mse, se = mean_se((estimates - truth) ** 2)
    predicted = theory.rff_mse(RFF_X, RFF_Y, num_features, embedding="cosine_bias")
    assert_within(mse, se, float(predicted))
    # psi is worse than phi for the Gaussian kernel (docs/maths/fourier_features.md, Eq. 3)
    assert predicted > theory.rff_mse(RFF_X, RFF_Y, num_features)


def test_rff_cosine_bias_mse_at_its_two_ends():
    """Exact, with no draws: at x = y the estimate is (2/m) sum_i cos^2(theta_i) with theta_i =
    w_i.x + b_i uniform mod 2 pi, its error (1/m) sum_i cos(2 theta_i) of variance 1/(2m);
    far apart (k -> 0) the terms 2 cos(theta_i) cos(theta'_i) have phases independent and
    uniform, second moment 1, so the MSE is 1/m. The Monte Carlo check above, at
    e^{-2 z^2} = 0.045, cannot tell the 1/2 of e^{-2 z^2}/2 from 1/4."""
    for m in (1, 6):
        assert float(theory.rff_mse(RFF_X, RFF_X, m, embedding="cosine_bias")) == pytest.approx(
            1 / (2 * m), rel=1e-12
        )
        far = float(theory.rff_mse(RFF_X, RFF_X + 30.0, m, embedding="cosine_bias"))
        assert far == pytest.approx(1 / m, rel=1e-12)


def test_prf_mse_under_jit_and_vmap_matches_eager():
    # The call, then a user's vmap over inputs (PRF and RFF in one function).
    jitted = jax.jit(lambda a, b: theory.prf_mse(a, b, 8, coupling="simplex"))(PRF_X, PRF_Y)
    np.testing.assert_allclose(
        jitted, theory.prf_mse(PRF_X, PRF_Y, 8, coupling="simplex"), rtol=1e-14
    )
    assert jitted.dtype == jnp.float64
    rng = np.random.default_rng(5)
    xs = 0.4 * rng.standard_normal((7, DIM))

    def both(a):
        return jnp.stack(
            [
                theory.prf_mse(a, PRF_Y, 9, coupling="orthogonal"),
                theory.rff_mse(a, RFF_Y, 9, coupling="simplex"),
            ]
        )

    eager = np.stack(
        [
            theory.prf_mse(xs, PRF_Y, 9, coupling="orthogonal"),
            theory.rff_mse(xs, RFF_Y, 9, coupling="simplex"),
        ],
        axis=-1,
    )
    np.testing.assert_allclose(jax.jit(jax.vmap(both))(xs), eager, rtol=1e-13)


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
def test_prf_mse_gradient_in_temperature_matches_finite_differences(coupling):
    # MSE of the softmax-kernel estimate of exp(x.y / tau) (inputs scaled by 1/sqrt(tau)), the
    # quantity one tunes a temperature on; blocks (6, 3).
    def mse(tau):
        scale = 1.0 / jnp.sqrt(tau)
        return theory.prf_mse(scale * PRF_X, scale * PRF_Y, 9, coupling=coupling, kernel="softmax")

    slope = jax.jit(jax.grad(mse))
    for tau in (0.5, 1.0, 2.0):
        np.testing.assert_allclose(slope(tau), central_difference(mse, tau), rtol=1e-7)


def test_rff_mse_gap_and_angle_are_differentiable():
    def rff(scale):
        return theory.rff_mse(scale * RFF_X, scale * RFF_Y, 9, coupling="orthogonal") + (
            theory.rff_mse(scale * RFF_X, scale * RFF_Y, 9, coupling="simplex")
        )

    def gap(scale):
        return theory.prf_orthogonality_gap(scale * PRF_X, scale * PRF_Y, DIM)

    def angle(theta):
        return theory.conformity_at_angle(DIM, 2.0, theta)

    for f, t in ((rff, 1.3), (gap, 0.7), (angle, 1.9)):
        # The finite differences evaluate f compiled once, not op by op.
        np.testing.assert_allclose(
            jax.jit(jax.grad(f))(t), central_difference(jax.jit(f), t), rtol=1e-7
        )
    # At v = 0 (x = -y) the derivatives are finite (no sqrt of v^2 inside).
    grads = jax.jit(jax.grad(lambda a: theory.prf_mse(a, -a, 6, coupling="simplex")))(
        jnp.asarray(PRF_X)
    )
    assert np.all(np.isfinite(grads))


def test_prf_mse_keeps_its_digits_at_small_v():
    """At x = y, |x + y| = v, the Gaussian-kernel MSE is expm1(v^2) / m exactly (log-prefactor
    0): e^{v^2} - 1 computed as a difference loses ~|log10 v^2| digits (1e-6 relative at
    v^2 = 1e-10), ``exp_difference`` keeps them."""
    x = np.full(DIM, 1e-5 / (2 * math.sqrt(DIM)))
    v2 = float(np.sum((2 * x) ** 2))
    np.testing.assert_allclose(theory.prf_mse(x, x, 4), math.expm1(v2) / 4, rtol=1e-12)


def test_closed_forms_reject_inputs_beyond_their_range():
    # |x - y| <= 20 for the simplex RFF block, 100 for the orthogonal one; |x + y| <= 100 for
    # the PRF block couplings (beyond it the traced path would silently return NaN).
    far, zero = np.zeros(DIM), np.zeros(DIM)
    far[0] = 30.0
    with pytest.raises(ValueError, match=r"\|x - y\| = 30 is beyond the range \|x - y\| <= 20"):
        theory.rff_mse(far, zero, 6, coupling="simplex")
    assert np.isfinite(theory.rff_mse(far, zero, 6, coupling="orthogonal"))
    for coupling in ("orthogonal", "simplex"):
        with pytest.raises(ValueError, match=r"\|x \+ y\| = 150 is beyond the range"):
            theory.prf_mse(5 * far, zero, 6, coupling=coupling)
    with pytest.raises(ValueError, match=r"\|x \+ y\| = 150 is beyond the range"):
        theory.prf_orthogonality_gap(5 * far, zero, DIM)
    with pytest.raises(ValueError, match="z = 150 is beyond the range z <= 100"):
        theory.rff_orthogonality_gap(150.0, DIM, DIM)
    # i.i.d. rows have no range limit: (e^0 - e^-22500) / m.
    np.testing.assert_allclose(theory.prf_mse(5 * far, zero, 6), 1 / 6, rtol=1e-14)
