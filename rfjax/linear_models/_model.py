"""``RandomFeatureRidgeModel``: the fitted state (transform, weights, intercept) and its fit."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.typing import DTypeLike
from numpy.typing import ArrayLike

from rfjax._validation import (
    check_array_size,
    check_input_type,
    check_inputs,
    check_int,
    check_representable,
)
from rfjax.linear_models._solve import solve_ridge
from rfjax.linear_models._statistics import ridge_statistics
from rfjax.linear_models._transform import Featurizer

# The rows of a predict block (``RandomFeatureRidgeModel.predict``) by default, and the smallest.
PREDICT_BLOCK_ROWS = 4096
MIN_PREDICT_BLOCK_ROWS = 256


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

    def predict(self, x: ArrayLike, *, block_rows: int = PREDICT_BLOCK_ROWS) -> jax.Array:
        """f(x): ``(..., d) -> (..., t)``, computed in the weights' dtype, in blocks of rows.

        Rows stream through one compiled program per block size in blocks of ``block_rows``,
        the last zero-padded (the padding's outputs dropped), so the features of only one block
        are held at a time and a new number of rows compiles nothing: inputs of at least
        ``block_rows`` rows use blocks of exactly ``block_rows``, fewer rows the next power of
        two from ``MIN_PREDICT_BLOCK_ROWS`` up (at most log2(``block_rows`` / 256) + 1 programs
        in all). Inside a trace (``jit``, ``vmap``), x goes through in one piece. Outside one,
        x beyond the range of the transform's dtype raises (the cast would make it infinite).
        """
        block_rows = check_int("block_rows", block_rows, minimum=1)
        dtype = np.dtype(self.transform.dtype)
        if isinstance(x, jax.core.Tracer):
            return _predict(self, check_inputs("x", x, dim=self.transform.dim).astype(dtype))
        # blocks are cut on the host: converting or slicing a device array of a new shape would
        # compile a program for it
        try:
            host = np.asarray(x)
        except (TypeError, ValueError) as error:
            raise TypeError(f"x must be a numeric array, got {type(x).__name__}") from error
        check_input_type("x", host.shape, host.dtype, dim=self.transform.dim)
        check_representable(
            host, dtype, name="x", remedy="use a float64 transform (jax_enable_x64)"
        )
        rows = host.reshape(-1, host.shape[-1])
        out = np.empty((rows.shape[0], self.weights.shape[1]), self.weights.dtype)
        size = bucket_rows(rows.shape[0], block_rows)
        width = self.transform.width
        check_array_size(
            "the features of a block", (size, width), dtype, {"block_rows": size, "width": width}
        )
        for start in range(0, rows.shape[0], size):
            valid = min(size, rows.shape[0] - start)
            block = np.zeros((size, rows.shape[1]), dtype)
            block[:valid] = rows[start : start + valid]
            out[start : start + valid] = np.asarray(_predict(self, block))[:valid]
        return jax.device_put(out.reshape(*host.shape[:-1], out.shape[-1]))


def bucket_rows(rows: int, block_rows: int) -> int:
    """The block size for ``rows`` rows: ``block_rows`` when there are at least that many,
    else the power of two >= rows (at least ``MIN_PREDICT_BLOCK_ROWS``, at most ``block_rows``)."""
    if rows >= block_rows:
        return block_rows
    return min(block_rows, max(MIN_PREDICT_BLOCK_ROWS, 1 << max(rows - 1, 0).bit_length()))


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
