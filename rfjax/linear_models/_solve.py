"""Ridge weights from the statistics: one Cholesky solve, or a path of ridges by one eigh."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rfjax._validation import check_bool, check_real
from rfjax.linear_models._statistics import RidgeStatistics

_HIGHEST = jax.lax.Precision.HIGHEST


def solve_ridge(
    statistics: RidgeStatistics, alpha: float, *, fit_intercept: bool = True
) -> tuple[jax.Array, jax.Array]:
    """The ridge weights and intercept for one ``alpha``, by a Cholesky solve.

    Minimises |Y - Phi W - 1 b^T|^2 + alpha |W|^2 (the intercept b unpenalised, as
    ``sklearn.linear_model.Ridge``): with mu = Phi^T 1 / n and ybar = Y^T 1 / n,

      W = (Phi^T Phi - n mu mu^T + alpha I)^{-1} (Phi^T Y - n mu ybar^T),   b = ybar - W^T mu

    (without intercept: W = (Phi^T Phi + alpha I)^{-1} Phi^T Y, b = 0). The centred Gram matrix
    is formed from the sums, so in float32 features with a large mean (positive features) lose
    digits to cancellation; sum in float64 where that matters.

    Args:
      statistics: from ``ridge_statistics``.
      alpha: the ridge alpha >= 0 (0 needs a positive definite centred Gram matrix).
      fit_intercept: whether to fit b.

    Returns:
      ``(weights (m, t), intercept (t,))``.

    Raises:
      ValueError: for a negative or non-finite alpha, or if the regularised Gram matrix is not
        numerically positive definite (then increase alpha, or sum in float64 if in float32).
    """
    alpha = _check_alpha("alpha", alpha)
    _check_statistics(statistics, fit_intercept)
    weights, intercept = _cholesky_solve(statistics, alpha, fit_intercept)
    if not bool(jnp.all(jnp.isfinite(weights))):
        remedy = "" if weights.dtype == jnp.float64 else " or sum the statistics in float64"
        raise ValueError(
            f"Phi^T Phi + alpha I is not numerically positive definite at alpha={alpha} in "
            f"{weights.dtype}: increase alpha{remedy}"
        )
    return weights, intercept


def solve_ridge_path(
    statistics: RidgeStatistics, alphas: Sequence[float], *, fit_intercept: bool = True
) -> tuple[jax.Array, jax.Array]:
    """The ridge weights and intercepts for a grid of alphas, by one eigendecomposition.

    With the centred Gram matrix G = Q diag(lambda) Q^T (one ``eigh``, O(m^3)), every alpha
    costs O(m^2 t): W(alpha) = Q diag(1 / (lambda + alpha)) Q^T C. The maths otherwise as
    ``solve_ridge``.

    Args:
      statistics: from ``ridge_statistics``.
      alphas: L ridge alphas >= 0.
      fit_intercept: whether to fit the intercepts.

    Returns:
      ``(weights (L, m, t), intercepts (L, t))``.

    Raises:
      ValueError: for an empty grid or a negative or non-finite alpha, or if some
        lambda + alpha is not positive (naming those alphas).
    """
    if isinstance(alphas, str) or not isinstance(alphas, Sequence | np.ndarray) or not len(alphas):
        raise ValueError(f"alphas must be a non-empty sequence of reals >= 0, got {alphas!r}")
    alphas = [_check_alpha(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
    _check_statistics(statistics, fit_intercept)
    smallest, weights, intercepts = _eigen_path(statistics, jnp.asarray(alphas), fit_intercept)
    bad = [a for a in alphas if not float(smallest) + a > 0]
    if bad:
        raise ValueError(
            f"Phi^T Phi + alpha I is not positive definite for alphas {bad} (smallest eigenvalue "
            f"{float(smallest):.3g} in {weights.dtype}): use larger alphas"
        )
    return weights, intercepts


def _check_alpha(name: str, alpha: object) -> float:
    alpha = check_real(name, alpha)
    if alpha < 0:
        raise ValueError(f"{name} must be >= 0, got {alpha}")
    return alpha


def _check_statistics(statistics: object, fit_intercept: object) -> None:
    if not isinstance(statistics, RidgeStatistics):
        raise TypeError(
            f"statistics must be RidgeStatistics (from ridge_statistics), got "
            f"{type(statistics).__name__}"
        )
    check_bool("fit_intercept", fit_intercept)


def _centre(statistics: RidgeStatistics, fit_intercept: bool):
    """(G, C, mu, ybar): the centred Gram and cross matrices and the means (zeros without
    intercept)."""
    gram, cross = statistics.gram, statistics.cross
    if not fit_intercept:
        zeros = jnp.zeros(gram.shape[:1], gram.dtype), jnp.zeros(cross.shape[1:], gram.dtype)
        return gram, cross, *zeros
    n = statistics.count.astype(gram.dtype)
    mean, target_mean = statistics.feature_sum / n, statistics.target_sum / n
    gram = gram - n * jnp.outer(mean, mean)
    cross = cross - n * jnp.outer(mean, target_mean)
    return gram, cross, mean, target_mean


@functools.partial(jax.jit, static_argnums=2)
def _cholesky_solve(statistics: RidgeStatistics, alpha: float, fit_intercept: bool):
    gram, cross, mean, target_mean = _centre(statistics, fit_intercept)
    regularised = gram + jnp.asarray(alpha, gram.dtype) * jnp.eye(gram.shape[0], dtype=gram.dtype)
    factor = jax.scipy.linalg.cho_factor(regularised, lower=True)
    weights = jax.scipy.linalg.cho_solve(factor, cross)
    return weights, target_mean - jnp.matmul(mean, weights, precision=_HIGHEST)


@functools.partial(jax.jit, static_argnums=2)
def _eigen_path(statistics: RidgeStatistics, alphas: jax.Array, fit_intercept: bool):
    """(smallest eigenvalue, weights (L, m, t), intercepts (L, t)) from G = Q diag(lambda) Q^T."""
    gram, cross, mean, target_mean = _centre(statistics, fit_intercept)
    eigenvalues, eigenvectors = jnp.linalg.eigh(gram)
    rotated = jnp.matmul(eigenvectors.T, cross, precision=_HIGHEST)
    grid = alphas.astype(gram.dtype)
    weights = jnp.einsum(
        "ij,ljt->lit",
        eigenvectors,
        rotated[None] / (eigenvalues[None, :, None] + grid[:, None, None]),
        precision=_HIGHEST,
    )
    intercepts = target_mean[None] - jnp.einsum("i,lit->lt", mean, weights, precision=_HIGHEST)
    return eigenvalues[0], weights, intercepts
