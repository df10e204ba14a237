"""Feature maps phi(x, projection, ...): ``(..., d) -> (..., width)`` with E[phi(x).phi(y)] = K.

Each map takes a drawn ``rfjax.projections.Projection`` (any coupling) and documents its width,
the kernel it estimates and the maths. ``estimate(phi_x, phi_y)`` forms pairwise estimates; a
Gram matrix of estimates is ``phi_x @ phi_y.T``.
"""

from rfjax.features._common import estimate
from rfjax.features._fourier import (
    cosine_features,
    fourier_features,
    random_offsets,
    trigonometric_features,
)
from rfjax.features._pointwise import angular_features, arccos_features, linear_features
from rfjax.features._polynomial import polynomial_features
from rfjax.features._positive import positive_features

__all__ = [
    "angular_features",
    "arccos_features",
    "cosine_features",
    "estimate",
    "fourier_features",
    "linear_features",
    "polynomial_features",
    "positive_features",
    "random_offsets",
    "trigonometric_features",
]
