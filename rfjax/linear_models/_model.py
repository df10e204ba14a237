"""``RandomFeatureRidgeModel``: the fitted state (transform, weights, intercept) and its fit."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.typing import DTypeLike
from numpy.typing import ArrayLike

from rfjax._validation import check_inputs
from rfjax.linear_models._solve import solve_ridge
from rfjax.linear_models._statistics import ridge_statistics
from rfjax.linear_models._transform import Featurizer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RandomFeatureRidgeModel:
    """A fitted random-feature ridge model: f(x) = W^T phi(x) + b.

    The linear model on random features of Rahimi & Recht ("Random Features for Large-Scale
    Kernel Machines", NIPS 2007; Kakade's Stat 991 notes, lecture 8): ridge regression on phi
    approximates kernel ridge regression with the kernel phi estimates, at O(n m^2) instead of
    O(n^3). A pytree: the projection is part of the fitted state, so the model passes through
    ``jit`` and checkpoints whole.

    Attributes:
      transform: the features phi (a ``Featurizer``: e.g. a ``RandomFeatureTransform`` of a
        projection, feature map, lengthscale and kernel).
      weights: W, shape ``(width, t)``.
      intercept: b, shape ``(t,)``.
    """

    transform: Featurizer
    weights: jax.Array
    intercept: jax.Array

    def predict(self, x: ArrayLike) -> jax.Array:
        """f(x): ``(n, d) -> (n, t)``, computed in the weights' dtype."""
        x = check_inputs("x", x, dim=self.transform.dim)
        return _predict(self, x.astype(self.transform.dtype))


@jax.jit
def _predict(model: RandomFeatureRidgeModel, x: jax.Array) -> jax.Array:
    phi = model.transform(x).astype(model.weights.dtype)
    return jnp.matmul(phi, model.weights, precision=jax.lax.Precision.HIGHEST) + model.intercept


def fit_random_feature_ridge(
    transform: Featurizer,
    blocks: Iterable[tuple[ArrayLike, ArrayLike]],
    alpha: float,
    *,
    fit_intercept: bool = True,
    block_rows: int = 4096,
    mesh: Mesh | None = None,
    axis_name: str = "data",
    dtype: DTypeLike = jnp.float32,
) -> RandomFeatureRidgeModel:
    """Fits ridge regression on random features in one streaming pass and one Cholesky solve.

    ``ridge_statistics`` (streaming, sharded over ``mesh``, summed over processes) followed by
    ``solve_ridge``; for a grid of alphas call those two with ``solve_ridge_path`` instead.

    Args:
      transform: the features phi (a ``Featurizer``).
      blocks: ``(x, y)`` row blocks, e.g. ``array_blocks(x, y)`` of arrays or memory maps.
      alpha: the ridge alpha >= 0 (penalty alpha |W|^2 on the summed squared error).
      fit_intercept: whether to fit an unpenalised intercept.
      block_rows, mesh, axis_name, dtype: as ``ridge_statistics``.

    Returns:
      The fitted model (weights in ``dtype``).

    Examples:
      >>> import jax, numpy as np
      >>> from rfjax import features, projections
      >>> from rfjax.linear_models import (
      ...     RandomFeatureTransform, array_blocks, fit_random_feature_ridge)
      >>> x = np.random.default_rng(0).normal(size=(200, 2)).astype(np.float32)
      >>> y = np.sin(x[:, 0])
      >>> transform = RandomFeatureTransform(
      ...     projections.get("orthogonal")(jax.random.key(0), 2, 64),
      ...     features.get("fourier")(), kernel="gaussian")
      >>> model = fit_random_feature_ridge(transform, array_blocks(x, y), alpha=1e-3)
      >>> bool(np.abs(np.asarray(model.predict(x))[:, 0] - y).max() < 0.05)
      True
    """
    statistics = ridge_statistics(
        transform, blocks, block_rows=block_rows, mesh=mesh, axis_name=axis_name, dtype=dtype
    )
    weights, intercept = solve_ridge(statistics, alpha, fit_intercept=fit_intercept)
    return RandomFeatureRidgeModel(transform, weights, intercept)
