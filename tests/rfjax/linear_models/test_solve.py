"""Tests of ``rfjax.linear_models._solve``: the regularisation path equals one solve per alpha."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.linear_models import (
    RidgeStatistics,
    array_blocks,
    ridge_statistics,
    solve_ridge,
    solve_ridge_path,
)
from tests.support.ridge_data import data, transform64


def test_the_path_equals_one_solve_per_alpha(float64):
    x, y = data()
    statistics = ridge_statistics(transform64(), array_blocks(x, y), dtype=jnp.float64)
    alphas = [1e-3, 0.1, 10.0]
    path_weights, path_intercepts = solve_ridge_path(statistics, alphas)
    for index, alpha in enumerate(alphas):
        weights, intercept = solve_ridge(statistics, alpha)
        np.testing.assert_allclose(path_weights[index], weights, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(path_intercepts[index], intercept, rtol=1e-7, atol=1e-9)


def test_a_singular_float64_system_does_not_advise_float64(float64):
    """At alpha = 0 with more features than rows, in float64, the error advised summing the
    statistics in float64; it now advises only what can help (in float32, both)."""
    x, y = data(n=10)
    for dtype, advice in ((jnp.float64, False), (jnp.float32, True)):
        statistics = ridge_statistics(transform64(), array_blocks(x, y), dtype=dtype)
        with pytest.raises(ValueError, match="not numerically positive definite") as error:
            solve_ridge(statistics, 0.0)
        assert ("in float64" in str(error.value).split(": ", 1)[1]) is advice


@pytest.mark.parametrize("seed", range(12))
def test_both_solvers_refuse_a_singular_system_whatever_the_sign_of_its_rounding(float64, seed):
    """16 features and an intercept on 16 rows: the centred Gram matrix is singular, its
    smallest eigenvalue rounding's noise (+1e-17 to +7e-16 in 8 of these 12 seeds). The path
    refused only a negative one and the Cholesky solve only a failed factorisation, so at
    alpha = 0 both returned weights for some seeds (noise over noise along the null direction,
    the two solvers' weights 10% apart). Both now refuse it in every seed, and still solve at
    an alpha that lifts it."""
    x, y = data(n=16, seed=seed)
    statistics = ridge_statistics(transform64(), array_blocks(x, y), dtype=jnp.float64)
    with pytest.raises(ValueError, match="not numerically positive definite"):
        solve_ridge(statistics, 0.0)
    with pytest.raises(ValueError, match=r"not numerically positive definite for alphas \[0.0\]"):
        solve_ridge_path(statistics, [0.0, 1e-3])
    weights, _ = solve_ridge(statistics, 1e-3)
    path_weights, _ = solve_ridge_path(statistics, [1e-3])
    np.testing.assert_allclose(path_weights[0], weights, rtol=1e-6, atol=1e-9)


def test_the_path_refuses_the_alphas_below_the_smallest_eigenvalue():
    """Statistics whose Gram matrix has eigenvalues -1 and 3 (e.g. rows removed by hand): the
    path refuses exactly the alphas with lambda_min + alpha <= 0 (0.5 and 1.0, not 2.0), and
    solves alpha = 2 as W = (G + 2 I)^{-1} C."""
    gram = jnp.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues -1 and 3
    cross = jnp.array([[1.0], [0.0]])
    statistics = RidgeStatistics(gram, cross, jnp.zeros(2), jnp.zeros(1), jnp.array(4, jnp.int32))
    with pytest.raises(ValueError, match=r"alphas \[0.5, 1.0\] \(eigenvalues from -1 to 3 "):
        solve_ridge_path(statistics, [0.5, 1.0, 2.0], fit_intercept=False)
    weights, intercepts = solve_ridge_path(statistics, [2.0], fit_intercept=False)
    np.testing.assert_allclose(weights[0], np.linalg.solve(gram + 2 * np.eye(2), cross), rtol=1e-6)
    np.testing.assert_array_equal(intercepts, 0.0)
