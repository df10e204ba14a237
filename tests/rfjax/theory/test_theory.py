"""Tests across rfjax.theory: vectorisation over batches, float32 without x64 and the argument
checks of every closed form. The tests of each module are in the file named for it
(``test_conformity.py``, ``test_mse.py``, ...).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import theory
from tests.support.theory_points import DIM, PRF_X, PRF_Y

pytestmark = pytest.mark.usefixtures("float64")


def test_vectorised_over_batches():
    rng = np.random.default_rng(0)
    x = 0.4 * rng.standard_normal((4, 3, DIM))
    y = 0.4 * rng.standard_normal((DIM,))
    for coupling in ("gaussian", "orthogonal", "simplex"):
        batch = theory.prf_mse(x, y, 9, coupling=coupling, kernel="softmax")
        assert batch.shape == (4, 3)
        single = theory.prf_mse(x[2, 1], y, 9, coupling=coupling, kernel="softmax")
        np.testing.assert_allclose(batch[2, 1], single, rtol=1e-13)
        rff = theory.rff_mse(x, y, 9, coupling=coupling)
        assert rff.shape == (4, 3)
        np.testing.assert_allclose(
            rff[0, 2], theory.rff_mse(x[0, 2], y, 9, coupling=coupling), rtol=1e-13
        )
    v = np.array([0.5, 1.0, 2.0])
    theta = np.array([0.3, 1.0, 2.0, 3.0])
    grid = theory.conformity_at_angle(DIM, v[:, None], theta[None, :])
    assert grid.shape == (3, 4)
    np.testing.assert_allclose(grid[1, 2], theory.conformity_at_angle(DIM, 1.0, 2.0), rtol=1e-13)
    np.testing.assert_allclose(
        theory.simplex_conformity(DIM, v)[2], theory.simplex_conformity(DIM, 2.0), rtol=1e-13
    )


def test_float32_without_x64():
    with jax.enable_x64(False):
        value = theory.prf_mse(PRF_X, PRF_Y, 9, coupling="simplex")
        rho = theory.simplex_conformity(DIM, 2.0)
    assert value.dtype == jnp.float32 and rho.dtype == jnp.float32
    np.testing.assert_allclose(
        value, theory.prf_mse(PRF_X, PRF_Y, 9, coupling="simplex"), rtol=1e-5
    )
    np.testing.assert_allclose(rho, theory.simplex_conformity(DIM, 2.0), rtol=1e-5)


@pytest.mark.parametrize("radius", [7.0, 20.0, 49.0])
def test_float32_is_finite_wherever_the_error_is(radius):
    """Where one factor of a closed form underflows and another overflows while the error is
    in float32's range, each against float64: the PRF MSE at |x| = |y| = r, x . y = 0 (1/m to
    float32's rounding: (1 - e^{-2 r^2}) / m, the coupled rows' term below e^{-r^2}); the
    FAVOR+ variance at x . y = -s^2, |x + y| = s, s = r / 7 (e^{-2 s^2} expm1(s^2) / m, about
    e^{-s^2} / m, where e^{-2 s^2} underflows at s = 7); the trigonometric MSE at x = y (0,
    where e^{|x|^2 + |y|^2} overflows at |x| = 7)."""
    x, y = np.array([radius, 0.0]), np.array([0.0, radius])  # float32 without x64
    near = np.array([radius, radius]) / 7.0, np.array([-radius, 0.0]) / 7.0
    cases = [
        *(lambda c=c: theory.prf_mse(x, y, 4, coupling=c) for c in ("gaussian", "orthogonal")),
        lambda: theory.prf_mse(x, y, 4, coupling="simplex"),
        lambda: theory.gerf_variance(*near, 4, a=0.0),
        lambda: theory.trigonometric_mse(x / 7.0, x / 7.0, 4),
    ]
    for case in cases:
        with jax.enable_x64(False):
            value = case()
        assert value.dtype == jnp.float32
        np.testing.assert_allclose(value, case(), rtol=1e-6, atol=1e-38)
    np.testing.assert_allclose(theory.prf_mse(x, y, 4), 0.25, rtol=1e-12)


def test_bad_inputs_raise():
    x, y = PRF_X, PRF_Y
    with pytest.raises(ValueError, match="coupling"):
        theory.conformity("circulant", DIM, 1.0)
    with pytest.raises(ValueError, match="'gaussian', 'orthogonal', 'simplex'"):
        theory.prf_mse(x, y, 6, coupling="iid")
    with pytest.raises(ValueError, match="kernel"):
        theory.prf_mse(x, y, 6, kernel="laplace")
    with pytest.raises(ValueError, match="embedding"):
        theory.rff_mse(x, y, 6, embedding="complex")
    with pytest.raises(ValueError, match="only supports coupling='gaussian'"):
        theory.rff_mse(x, y, 6, coupling="orthogonal", embedding="cosine_bias")
    with pytest.raises(ValueError, match="dim"):
        theory.orthogonal_conformity(0, 1.0)
    with pytest.raises(ValueError, match="dim"):
        theory.simplex_conformity(1, 1.0)
    with pytest.raises(TypeError, match="dim"):
        theory.orthogonal_conformity(2.5, 1.0)
    with pytest.raises(ValueError, match="num_features"):
        theory.prf_mse(x, y, 0)
    with pytest.raises(ValueError, match="num_features"):
        theory.block_sizes(DIM, 0)
    with pytest.raises(ValueError, match="v must contain only finite"):
        theory.simplex_conformity(DIM, np.nan)
    with pytest.raises(ValueError, match="v must contain only finite"):
        theory.iid_conformity(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="theta"):
        theory.conformity_at_angle(DIM, 1.0, np.nan)
    with pytest.raises(ValueError, match="x must contain only finite"):
        theory.prf_mse(np.full(DIM, np.nan), y, 6)
    with pytest.raises(ValueError, match="same last axis"):
        theory.prf_mse(x, y[:4], 6)
    with pytest.raises(ValueError, match="same last axis"):
        theory.rff_mse(x[:5], y, 6)
    with pytest.raises(TypeError, match="x must be a floating array"):
        theory.prf_mse(np.ones(DIM, dtype=int), y, 6)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.prf_orthogonality_gap(x, y, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.rff_orthogonality_gap(1.0, DIM, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.rff_orthogonal_mse_ratio_asymptotic(1.0, DIM, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.small_v_prefactor("simplex", DIM, DIM + 1)
    with pytest.raises(ValueError, match="z must contain only finite"):
        theory.rff_orthogonality_gap(np.nan, DIM, DIM)
    with pytest.raises(TypeError, match="block_sizes"):
        theory.effective_conformity(1.0, 1.0, ())
    with pytest.raises(ValueError, match="block_sizes"):
        theory.effective_conformity(1.0, 1.0, (3, 0))
