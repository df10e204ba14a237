"""Shared pieces of the feature maps: input checks, projection, pointwise maps, estimates."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax._validation import check_inputs, check_real
from rfjax.features._protocol import FeatureMap
from rfjax.projections import Projection


def check_projection(projection: object, name: str = "projection") -> Projection:
    """Returns ``projection`` if it is a drawn ``rfjax.projections.Projection``, else raises
    naming the argument ``name``."""
    if not isinstance(projection, Projection):
        raise TypeError(
            f"{name} must be an rfjax.projections.Projection (drawn with a "
            f"sampler such as rfjax.projections.gaussian), got "
            f"{type(projection).__name__}"
        )
    return projection


def project(
    x: jax.Array, projection: Projection, *, lengthscale: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Validates ``x: (..., d)``, rescales it by 1/lengthscale and projects it.

    Returns:
      ``(x / lengthscale, (x / lengthscale) W^T)`` of shapes ``(..., d)`` and ``(..., m)``.
    """
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    lengthscale = check_real("lengthscale", lengthscale, positive=True)
    if lengthscale != 1.0:
        x = x / jnp.asarray(lengthscale, x.dtype)
    return x, projection(x)


def pointwise_features(
    x: jax.Array,
    projection: Projection,
    function: Callable[[jax.Array], jax.Array],
    *,
    multiplier: float = 1.0,
    lengthscale: float = 1.0,
) -> jax.Array:
    """sqrt(multiplier / m) f(W x / l): the map of Choromanski & Fagan Eq. 2 with a pointwise f.

    ``function`` maps the projections ``(..., m)`` to ``(..., width)``; the scale uses m, the
    number of projection vectors, not the width.
    """
    _, projected = project(x, projection, lengthscale=lengthscale)
    scale = math.sqrt(multiplier / projected.shape[-1])
    return scale * function(projected)


def gaussian_kernel_features(
    feature_map: FeatureMap, u: jax.Array, projection: Projection
) -> jax.Array:
    """Features of the Gaussian kernel exp(-|u - v|^2 / 2) from ``feature_map``, a map of the
    softmax kernel exp(u.v) (one with ``scaled_features``, such as ``positive``), by
    K_gauss(u, v) = e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2}: its log-space form (psi, s) becomes
    psi exp(s - |u|^2/2), which never overflows for positive features.

    Args:
      feature_map: a softmax-kernel ``FeatureMap`` with ``scaled_features``.
      u: ``(..., d)`` inputs, already divided by the lengthscale.
      projection: the drawn ``Projection``.

    Returns:
      ``(..., width)`` features whose inner products estimate exp(-|u - v|^2 / 2).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from rfjax import features, projections
      >>> projection = projections.orthogonal(jax.random.key(0), 3, 4096)
      >>> u, v = jnp.array([0.3, -0.2, 0.1]), jnp.array([0.1, 0.2, 0.0])
      >>> positive = features.get("positive")()
      >>> phi = lambda x: features.gaussian_kernel_features(positive, x, projection)
      >>> estimate = float(phi(u) @ phi(v))
      >>> exact = float(jnp.exp(-jnp.sum((u - v) ** 2) / 2))
      >>> abs(estimate - exact) < 0.02
      True
    """
    psi, log_scale = feature_map.scaled_features(u, projection, side="query")
    return psi * jnp.exp(log_scale - 0.5 * jnp.sum(u * u, axis=-1))[..., None]


def merge_trailing_axes(x: jax.Array, count: int) -> jax.Array:
    """``(..., a_1, ..., a_count) -> (..., a_1 ... a_count)``, also for empty leading axes.

    (``reshape(..., -1)`` cannot infer the size when a leading axis is 0.)
    """
    return x.reshape(*x.shape[:-count], math.prod(x.shape[-count:]))


def estimate(features_x: jax.Array, features_y: jax.Array) -> jax.Array:
    """Kernel estimate phi(x) . phi(y) from two feature arrays.

    Pairs are matched along the leading axes (which broadcast). For a Gram matrix of estimates
    use ``features_x @ features_y.T`` (one matmul) instead of broadcasting here.

    Args:
      features_x: phi(x), shape ``(..., width)``.
      features_y: phi(y), shape ``(..., width)``, from the same feature map and projection.

    Returns:
      The estimates sum_j phi_j(x) phi_j(y), shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    Raises:
      TypeError: if either input is not a floating array.
      ValueError: if the widths differ.

    Examples:
      >>> import jax
      >>> from rfjax import features, projections
      >>> w = projections.gaussian(jax.random.key(0), 3, 16)
      >>> x = jax.numpy.ones((5, 3))
      >>> phi = features.fourier_features(x, w)
      >>> estimate(phi, phi).shape, (phi @ phi.T).shape
      ((5,), (5, 5))
    """
    features_x = check_inputs("features_x", features_x)
    features_y = check_inputs("features_y", features_y)
    if features_x.shape[-1] != features_y.shape[-1]:
        raise ValueError(
            f"features_x and features_y must have the same width (last axis), got "
            f"shapes {features_x.shape} and {features_y.shape}"
        )
    try:
        jnp.broadcast_shapes(features_x.shape, features_y.shape)
    except ValueError:
        raise ValueError(
            f"the batch axes of features_x and features_y must broadcast (for all pairs use "
            f"features_x @ features_y.T), got shapes {features_x.shape} and {features_y.shape}"
        ) from None
    return jnp.sum(features_x * features_y, axis=-1)
