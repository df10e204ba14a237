"""Random features for polynomial kernels with non-negative coefficients (Kakade, corrected)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from rfjax._validation import check_coefficients
from rfjax.features._common import check_projection, project
from rfjax.projections import Projection


def polynomial_features(
    x: jax.Array, projection: Projection, *, coefficients: Sequence[float]
) -> jax.Array:
    """Random features for K(x, y) = sum_{i=1}^l c_i (x . y)^i, c_i >= 0.

    Each of the M output features uses T = l(l+1)/2 projection vectors w_{ij} (1 <= j <= i <= l):

      phi_k(x) = (1/sqrt(M)) sum_{i=1}^l sqrt(c_i) prod_{j=1}^i (w_{ij,k} . x).

    If the T vectors of one feature are independent with E[w w^T] = I, then
    E[phi(x).phi(y)] = K(x, y): products over different degrees vanish (a factor appears once,
    with mean 0) and E[prod_j (w_ij.x)(w_ij.y)] = (x.y)^i.

    Layout: the projection must have ``num_features == T * M`` rows, read as T groups of M:
    factor t of output feature k is row ``t * M + k``. The T factors of one feature are then
    rows M apart, so they lie in different (independent) coupled blocks exactly when
    M >= ``projection.block_size``; for l >= 2 this is required (coupled rows within a block
    are not independent and would bias the estimate) and checked. A fully coupled projection
    (such as ``halton``, one block) therefore only works for l = 1.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and ``num_features = M * l(l+1)/2``.
      coefficients: (c_1, ..., c_l), l >= 1, each finite and >= 0 (static).

    Returns:
      Features of shape ``(..., M)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: for empty or negative coefficients, a ``num_features`` that is not a multiple
        of l(l+1)/2, M < ``block_size`` when l >= 2, or ``x.shape[-1] != projection.dim``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.gaussian(jax.random.key(0), 4, 6 * 10)  # l = 3: T = 6, M = 10
      >>> polynomial_features(jax.numpy.ones(4), w, coefficients=(1.0, 0.5, 0.25)).shape
      (10,)

    References:
      Kar & Karnick, "Random Feature Maps for Dot Product Kernels", AISTATS 2012; Kakade,
      lecture notes on random features, polynomial kernels, with the corrections of
      docs/maths/fourier_features.md (degree i in the product, |W| = l(l+1)/2).
    """
    coefficients = check_coefficients(coefficients)
    projection = check_projection(projection)
    degree = len(coefficients)
    per_feature = degree * (degree + 1) // 2
    width, remainder = divmod(projection.num_features, per_feature)
    if remainder or width == 0:
        raise ValueError(
            f"projection.num_features must be a positive multiple of l(l+1)/2 = "
            f"{per_feature} for {degree} coefficients, got "
            f"{projection.num_features}"
        )
    if per_feature > 1 and width < projection.block_size:
        raise ValueError(
            f"polynomial_features needs independent factors: the number of output "
            f"features M = num_features / {per_feature} = {width} must be >= "
            f"projection.block_size = {projection.block_size}; draw at least "
            f"{per_feature * projection.block_size} rows or use an i.i.d. coupling"
        )
    _, projected = project(x, projection)
    factors = projected.reshape(*projected.shape[:-1], per_feature, width)
    # The i factors of the degree-i term are groups i(i-1)/2 .. i(i+1)/2 - 1.
    features = sum(
        (
            math.sqrt(c) * jnp.prod(factors[..., i * (i - 1) // 2 : i * (i + 1) // 2, :], axis=-2)
            for i, c in enumerate(coefficients, start=1)
        ),
        start=jnp.zeros((), projected.dtype),
    )
    return features / math.sqrt(width)
