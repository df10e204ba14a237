"""Norm-coupled orthogonal features (Reid et al., ICLR 2025, arXiv:2405.16541).

Marginals (each row N(0, I_d)) are also checked by the registry-wide tests of
``test_projections.py`` (the coupling is registered with exact marginals). Here: the partner norms
are chi_d quantile partners, estimates stay unbiased for positive and Fourier features (4 SE), and
the kernel MSE against plain orthogonal features, by paired Monte Carlo on common keys.
"""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammainc

from rfjax import features, projections
from rfjax.projections import _norm_coupled
from tests.support.representatives import representatives

NSIG = 4.0
NUM_DRAWS = 10_000


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("dim", [1, 3, 8, 64])
def test_partner_norms_are_the_opposite_chi_quantiles(dim):
    norms = jnp.sqrt(jnp.linspace(0.05, 4.0, 9) * dim)
    partners = _norm_coupled.antithetic_chi_norms(norms, dim)
    np.testing.assert_allclose(
        gammainc(dim / 2, partners**2 / 2), 1.0 - gammainc(dim / 2, norms**2 / 2), atol=1e-10
    )


@pytest.mark.parametrize("dim", [16, 64])
def test_partner_norms_of_the_upper_tail_keep_float32_precision(dim):
    """Norms 3 to 6 sd above the mean in float32 against float64: F(r) rounded to 1 in float32
    from about 5.5 sd (d = 64), where the partner came out 0 (4.379 is meant), and lost digits
    before (4.604 for 4.629 at 5.5 sd)."""
    norms = np.sqrt(dim - 0.5) + np.array([3.0, 4.0, 5.0, 5.5, 6.0]) * np.sqrt(0.5)
    single = projections.antithetic_chi_norms(jnp.asarray(norms, jnp.float32), dim)
    double = projections.antithetic_chi_norms(jnp.asarray(norms, jnp.float64), dim)
    assert single.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(single, np.float64), double, rtol=1e-4)


def test_partner_norms_refuse_bad_arguments_and_keep_nan():
    """dim = 0 gave partners of 1.6e-9, dim = -3 a math domain error, integer norms a scan
    carry error, and a NaN norm the finite partner 2e-9."""
    norms = jnp.array([1.0, 2.0])
    for dim in (0, -3):
        with pytest.raises(ValueError, match="dim must be an integer >= 1"):
            projections.antithetic_chi_norms(norms, dim)
    for dim in (4.5, "4", True):
        with pytest.raises(TypeError, match="dim must be an integer"):
            projections.antithetic_chi_norms(norms, dim)
    with pytest.raises(TypeError, match="norms must be a floating array"):
        projections.antithetic_chi_norms(jnp.array([1, 2]), 4)
    with pytest.raises(TypeError, match="norms must be a numeric array"):
        projections.antithetic_chi_norms("1.0", 4)
    partners = np.asarray(projections.antithetic_chi_norms(jnp.array([np.nan, 2.0]), 4))
    assert np.isnan(partners[0]) and np.isfinite(partners[1])


def test_pairs_are_coupled_and_directions_orthogonal():
    dim = 5
    w = projections.norm_coupled(jax.random.key(0), dim, 12, dtype=jnp.float64).matrix()
    block = w[:dim]
    gram = block @ block.T
    np.testing.assert_allclose(gram - jnp.diag(jnp.diag(gram)), 0.0, atol=1e-10)
    norms = jnp.linalg.norm(w, axis=-1)
    # Rows 2k, 2k+1 of every block, the partial one (rows 10, 11) too; row 4 of a block of 5
    # keeps its own norm (coupling the first block only passed when only it was checked).
    for first, second in ((0, 1), (2, 3), (5, 6), (7, 8), (10, 11)):
        np.testing.assert_allclose(
            gammainc(dim / 2, norms[second] ** 2 / 2),
            1.0 - gammainc(dim / 2, norms[first] ** 2 / 2),
            atol=1e-10,
        )
    # Same key: the same rotations and first norms as ``orthogonal`` (common random numbers),
    # in every block (each block its own rotation; the partial one of rows 10 and 11 too).
    plain = projections.orthogonal(jax.random.key(0), dim, 12, dtype=jnp.float64).matrix()
    for row in (0, dim, 2 * dim):
        np.testing.assert_allclose(w[row], plain[row], rtol=1e-12)
    assert projections.info("norm_coupled").exact_marginals


def _pair(dim, norm, cosine):
    x, y = np.zeros(dim), np.zeros(dim)
    x[0] = norm
    y[0], y[1] = norm * cosine, norm * np.sqrt(1.0 - cosine**2)
    return jnp.asarray(x), jnp.asarray(y)


def _paired_squared_errors(feature_map, x, y, truth, dim):
    """Squared errors of orthogonal and norm-coupled estimates on common keys (m = d)."""

    def estimate(key):
        out = []
        for sampler in (projections.orthogonal, projections.norm_coupled):
            w = sampler(key, dim, dim, dtype=jnp.float64)
            out.append(feature_map(x, w) @ feature_map(y, w))
        return jnp.stack(out)

    keys = jax.random.split(jax.random.key(1), NUM_DRAWS)
    estimates = np.asarray(jax.jit(jax.vmap(estimate))(keys))
    return estimates, (estimates - truth) ** 2


@pytest.mark.parametrize(  # one softmax and the Gaussian case by default, all in CI's suite
    ("kernel", "dim", "norm", "cosine"),
    representatives(
        [("softmax", 4, 0.5, 0.8), ("softmax", 6, 0.4, 0.9), ("gaussian", 4, 0.7, 0.0)],
        (("softmax", 4), ("gaussian", 4)),
        key=lambda case: case[:2],
        unpack=True,
    ),
)
def test_norm_coupled_estimates_are_unbiased(kernel, dim, norm, cosine):
    x, y = _pair(dim, norm, cosine)
    if kernel == "softmax":
        feature_map, truth = features.positive_features, float(jnp.exp(x @ y))
    else:
        feature_map, truth = features.fourier_features, float(jnp.exp(-jnp.sum((x - y) ** 2) / 2))
    estimates, _ = _paired_squared_errors(feature_map, x, y, truth, dim)
    coupled = estimates[:, 1]
    assert abs(coupled.mean() - truth) <= NSIG * coupled.std(ddof=1) / np.sqrt(NUM_DRAWS)


@pytest.mark.parametrize(
    ("dim", "norm", "cosine"),
    representatives([(2, 0.5, 0.5), (8, 0.6, 0.5)], (2,), key=lambda case: case[0], unpack=True),
)
def test_norm_coupling_lowers_the_fourier_kernel_mse(dim, norm, cosine):
    # Measured claim for this construction (negative monotone pairs) with random Fourier features:
    # paired MSE difference below zero by more than 4 SE (the measured reduction is 25-45%).
    x, y = _pair(dim, norm, cosine)
    truth = float(jnp.exp(-jnp.sum((x - y) ** 2) / 2))
    _, squared = _paired_squared_errors(features.fourier_features, x, y, truth, dim)
    difference = squared[:, 1] - squared[:, 0]
    assert difference.mean() < -NSIG * difference.std(ddof=1) / np.sqrt(NUM_DRAWS)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="dim"):
        projections.norm_coupled(jax.random.key(0), 0, 4)
    with pytest.raises(TypeError, match="key"):
        projections.norm_coupled(0, 3, 4)


def test_docstring_examples_run():
    with jax.enable_x64(False):
        result = doctest.testmod(_norm_coupled)
    assert result.failed == 0 and result.attempted > 0
