"""Which estimator of the softmax kernel to use: (feature map x coupling) pairs ranked by their
closed-form MSE for given inputs.

The pairs are those with closed forms in ``rfjax.theory`` (the others are left out, not guessed):
FAVOR+ with i.i.d., orthogonal and simplex rows (``prf_mse``, SimRF Eq. 11, 19-24); antithetic
positive and trigonometric features with i.i.d. rows (``positive_antithetic_mse``,
``trigonometric_mse``, HRF Lemma 2.2); OPRF/FAVOR++ (``oprf_variance``) and the DERF variants
(``dense_exponential_variance``) with i.i.d. rows, their parameters fitted to the inputs'
statistics as the feature maps fit them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import numpy as np
from numpy.typing import ArrayLike

from rfjax import features
from rfjax.theory import _exponential, _hybrid, _inputs, _mse


class RankedEstimator(NamedTuple):
    """One (feature map, coupling) pair with its predicted MSE.

    Attributes:
      feature_map: the name in ``rfjax.features.available()``.
      coupling: the name in ``rfjax.projections.available()``.
      mse: the closed-form MSE of the estimate of exp(x.y), averaged over the input pairs.
    """

    feature_map: str
    coupling: str
    mse: float


_PRF_COUPLINGS: tuple[Literal["gaussian", "orthogonal", "simplex"], ...] = (
    "gaussian",
    "orthogonal",
    "simplex",
)


def _prf_mse(
    x: jax.Array,
    y: jax.Array,
    *,
    num_features: int,
    coupling: Literal["gaussian", "orthogonal", "simplex"],
) -> jax.Array:
    return _mse.prf_mse(x, y, num_features, coupling=coupling, kernel="softmax")


def _dense_exponential_variance(
    x: jax.Array,
    y: jax.Array,
    *,
    num_features: int,
    parameters: features.DenseExponentialParameters,
) -> jax.Array:
    return _exponential.dense_exponential_variance(x, y, num_features, parameters=parameters)


def _closed_forms(
    statistics: features.InputStatistics, num_features: int
) -> dict[tuple[str, str], Callable[[jax.Array, jax.Array], jax.Array]]:
    m = num_features
    closed: dict[tuple[str, str], Callable[[jax.Array, jax.Array], jax.Array]] = {
        ("positive", coupling): functools.partial(_prf_mse, num_features=m, coupling=coupling)
        for coupling in _PRF_COUPLINGS
    }
    closed[("positive_antithetic", "gaussian")] = lambda x, y: _hybrid.positive_antithetic_mse(
        x, y, m
    )
    closed[("trigonometric", "gaussian")] = lambda x, y: _hybrid.trigonometric_mse(x, y, m)
    closed[("oprf", "gaussian")] = lambda x, y: _exponential.oprf_variance(
        x, y, m, statistics=statistics
    )
    variants: tuple[tuple[str, Literal["asymmetric", "symmetric", "simplified"]], ...] = (
        ("derf_asymmetric", "asymmetric"),
        ("derf_symmetric", "symmetric"),
        ("saderf", "simplified"),
    )
    for name, variant in variants:
        parameters = features.dense_exponential_parameters(statistics, variant=variant)
        closed[(name, "gaussian")] = functools.partial(
            _dense_exponential_variance, num_features=m, parameters=parameters
        )
    return closed


def rank_estimators(
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    *,
    statistics: features.InputStatistics | None = None,
    weights: ArrayLike | None = None,
) -> tuple[RankedEstimator, ...]:
    """The (feature map, coupling) pairs with closed forms, best (least predicted MSE) first.

    For queries ``x`` and keys ``y`` the predicted MSE of each pair's estimate of exp(x_i.y_j)
    is averaged over the pairs (i, j) given (``x`` and ``y`` broadcast against each other: pass
    ``x[:, None]`` and ``y[None]`` for all pairs). The data-fitted maps (OPRF, DERF) take their
    parameters from ``statistics`` (default ``input_statistics`` of the given x and y), as their
    ``fit`` does. Host-only: returns Python floats (it is a question a user asks, not a traced
    computation); each closed form is itself a JAX function.

    Args:
      x: queries ``(..., d)``, floating, finite.
      y: keys ``(..., d)``, broadcasting against ``x``.
      num_features: number of projection rows m (>= 1; the antithetic and trigonometric maps
        have width 2m from m rows).
      statistics: ``rfjax.features.input_statistics(queries, keys)`` of the data the maps are
        fitted to, or ``None`` for those of x and y.
      weights: nonnegative finite weights of the pairs, broadcasting against the pairs' shape
        (that of x and y broadcast, less the last axis), not all zero; the weighted mean
        sum(w MSE) / sum(w) is ranked. ``None``: the plain mean. E.g. w = exp(-|x|^2 - |y|^2)
        ranks by the Gaussian kernel's MSE (its estimate is the softmax one times
        exp(-|x|^2/2 - |y|^2/2)).

    Returns:
      ``RankedEstimator`` tuples sorted by ``mse`` (ascending).

    Raises:
      TypeError, ValueError: for inputs the closed forms reject (e.g. |x + y| > 100 with block
        couplings), m < 1 or bad ``weights``.

    Examples:
      >>> import jax
      >>> q = 0.5 * jax.random.normal(jax.random.key(0), (8, 4))
      >>> k = 0.5 * jax.random.normal(jax.random.key(1), (8, 4))
      >>> ranking = rank_estimators(q[:, None], k[None], 16)
      >>> len(ranking), ranking[0].mse <= ranking[-1].mse
      (9, True)
    """
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    if statistics is None:
        dim = x.shape[-1]
        statistics = features.input_statistics(x.reshape(-1, dim), y.reshape(-1, dim))
    pair_shape = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    weight = _pair_weights(weights, pair_shape)
    ranked = [
        RankedEstimator(name, coupling, float(np.average(np.asarray(mse(x, y)), weights=weight)))
        for (name, coupling), mse in _closed_forms(statistics, num_features).items()
    ]
    return tuple(sorted(ranked, key=lambda entry: entry.mse))


def _pair_weights(weights: ArrayLike | None, pair_shape: tuple[int, ...]) -> np.ndarray | None:
    """``weights`` broadcast to the pairs' shape, checked; ``None`` stays ``None``."""
    if weights is None:
        return None
    array = np.asarray(weights, dtype=np.float64)
    try:
        array = np.broadcast_to(array, pair_shape)
    except ValueError:
        raise ValueError(
            f"weights must broadcast against the pairs' shape {pair_shape}, got shape {array.shape}"
        ) from None
    if not np.all(np.isfinite(array)) or np.any(array < 0) or not np.any(array > 0):
        raise ValueError("weights must be finite, nonnegative and not all zero")
    return array
