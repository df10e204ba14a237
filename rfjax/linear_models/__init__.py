"""Linear models on random features: ridge regression and classification that scale out.

A linear model on phi(x) in place of an n x n kernel (Rahimi & Recht, NIPS 2007; Kakade's Stat
991 notes, lecture 8): with m features, fitting costs O(n m^2) time and O(m^2) memory.

* ``RandomFeatureTransform``: phi, a projection (any coupling, ``rfjax.projections.get``) and a
  symmetric feature map (``rfjax.features.get``) bound into one pytree; any ``Featurizer``
  (a pytree with ``dim``, ``width``, ``dtype`` and ``__call__``) serves as well.
* ``ridge_statistics``: one streaming pass over row blocks (``array_blocks`` of NumPy arrays or
  ``numpy.memmap`` files, or any iterator of blocks) summing Phi^T Phi and Phi^T Y, rows sharded
  over a mesh, one ``psum`` over devices and processes at the end.
* ``solve_ridge`` (one Cholesky solve) and ``solve_ridge_path`` (a grid of alphas by one
  eigendecomposition).
* ``RandomFeatureRidgeModel``: the fitted state (transform, weights, intercept);
  ``fit_random_feature_ridge`` = statistics + solve.

``rfjax.sklearn.RandomFeatureRidge`` and ``RandomFeatureRidgeClassifier`` are the scikit-learn
front door.
"""

from rfjax.linear_models._blocks import array_blocks
from rfjax.linear_models._model import RandomFeatureRidgeModel, fit_random_feature_ridge
from rfjax.linear_models._solve import solve_ridge, solve_ridge_path
from rfjax.linear_models._statistics import RidgeStatistics, ridge_statistics
from rfjax.linear_models._transform import (
    KERNELS,
    Featurizer,
    RandomFeatureTransform,
    native_kernel,
)

__all__ = [
    "KERNELS",
    "Featurizer",
    "RandomFeatureRidgeModel",
    "RandomFeatureTransform",
    "RidgeStatistics",
    "array_blocks",
    "fit_random_feature_ridge",
    "native_kernel",
    "ridge_statistics",
    "solve_ridge",
    "solve_ridge_path",
]
