"""Ridge weights from the statistics: one Cholesky solve, or a path of ridges by one eigh."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rfjax._validation import check_bool, check_real
from rfjax.linear_models._statistics import RidgeStatistics

_HIGHEST = jax.lax.Precision.HIGHEST
_ITERATIONS = 4  # of inverse and power iteration in solve_ridge's check of the system


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
        numerically positive definite (then increase alpha, or sum in float64 if in float32):
        its smallest eigenvalue at most ``singular_tolerance`` times its largest (estimated by
        a few steps of inverse and power iteration on the factor), the bound of
        ``solve_ridge_path``; a singular system, such as one with more features than rows, is
        refused whatever the sign of its rounding.
    """
    alpha = _check_alpha("alpha", alpha)
    _check_statistics(statistics, fit_intercept)
    weights, intercept, smallest, largest = _cholesky_solve(statistics, alpha, fit_intercept)
    tolerance = singular_tolerance(weights.shape[0], weights.dtype)
    singular = not float(smallest) > tolerance * float(largest)
    if singular or not bool(jnp.all(jnp.isfinite(weights))):
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
        lambda_min + alpha is not above ``singular_tolerance`` times lambda_max + alpha
        (naming those alphas): the system is singular to rounding.
    """
    if isinstance(alphas, str) or not isinstance(alphas, Sequence | np.ndarray) or not len(alphas):
        raise ValueError(f"alphas must be a non-empty sequence of reals >= 0, got {alphas!r}")
    alphas = [_check_alpha(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
    _check_statistics(statistics, fit_intercept)
    extremes, weights, intercepts = _eigen_path(statistics, jnp.asarray(alphas), fit_intercept)
    smallest, largest = (float(value) for value in extremes)
    tolerance = singular_tolerance(weights.shape[1], weights.dtype)
    bad = [a for a in alphas if not smallest + a > tolerance * (largest + a)]
    if bad:
        raise ValueError(
            f"Phi^T Phi + alpha I is not numerically positive definite for alphas {bad} "
            f"(eigenvalues from {smallest:.3g} to {largest:.3g} in {weights.dtype}): use larger "
            "alphas"
        )
    return weights, intercepts


def singular_tolerance(size: int, dtype: jnp.dtype) -> float:
    """sqrt(m) eps: a symmetric (m, m) system whose smallest eigenvalue is at most this times
    its largest is singular to rounding in ``dtype`` (the typical size of a backward-stable
    eigensolver's or Cholesky factorisation's error relative to the largest eigenvalue;
    ``numpy.linalg.matrix_rank``'s worst case, m eps, would refuse float32 systems of
    condition number 500 at m = 16,384, which solve to about four digits)."""
    return math.sqrt(size) * float(jnp.finfo(dtype).eps)


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
    intercept = target_mean - jnp.matmul(mean, weights, precision=_HIGHEST)
    return weights, intercept, *_extreme_eigenvalues(regularised, factor)


def _extreme_eigenvalues(matrix: jax.Array, factor) -> tuple[jax.Array, jax.Array]:
    """Estimates of the smallest and largest eigenvalue of the symmetric ``matrix`` whose
    Cholesky ``factor`` is given, as Rayleigh quotients after a few steps of inverse and of
    power iteration (O(m^2) each, beside the factorisation's O(m^3)): an upper bound on the
    smallest, a lower bound on the largest, both within rounding of the true ones where the
    smallest is far below the next (a singular system)."""
    size = matrix.shape[0]
    start = jnp.cos(jnp.arange(1, size + 1, dtype=matrix.dtype) * 2.1)  # fixed, no zero entry
    smallest = largest = start / jnp.linalg.norm(start)
    for _ in range(_ITERATIONS):
        smallest = jax.scipy.linalg.cho_solve(factor, smallest)
        smallest = smallest / jnp.linalg.norm(smallest)
        largest = jnp.matmul(matrix, largest, precision=_HIGHEST)
        largest = largest / jnp.linalg.norm(largest)

    def rayleigh_quotient(vector: jax.Array) -> jax.Array:
        return jnp.dot(vector, jnp.matmul(matrix, vector, precision=_HIGHEST), precision=_HIGHEST)

    return rayleigh_quotient(smallest), rayleigh_quotient(largest)


@functools.partial(jax.jit, static_argnums=2)
def _eigen_path(statistics: RidgeStatistics, alphas: jax.Array, fit_intercept: bool):
    """((smallest, largest eigenvalue), weights (L, m, t), intercepts (L, t)) from
    G = Q diag(lambda) Q^T."""
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
    return (eigenvalues[0], eigenvalues[-1]), weights, intercepts
