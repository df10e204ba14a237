"""Feature maps phi(x, projection, ...): ``(..., d) -> (..., width)`` with E[phi(x).phi(y)] = K.

Each map takes a drawn ``rfjax.projections.Projection`` (any coupling) and documents its width,
the kernel it estimates and the maths. ``estimate(phi_x, phi_y)`` forms pairwise estimates; a
Gram matrix of estimates is ``phi_x @ phi_y.T``.

Asymmetric estimators (complex-exponential and hybrid features, HRF arXiv:2110.04367) take
``side="query"`` or ``side="key"``: the estimate is query features . key features.
"""

from rfjax.features._clustering import (
    ClusterHybridParameters,
    assign_clusters,
    cluster_adapted_diagonals,
    cluster_hybrid_features,
    cluster_hybrid_parameters,
    fit_cluster_hybrid,
    kmeans,
)
from rfjax.features._common import estimate
from rfjax.features._complex_exponential import complex_exponential_features
from rfjax.features._fourier import (
    cosine_features,
    fourier_features,
    random_offsets,
    trigonometric_features,
)
from rfjax.features._hybrid import (
    FeaturePair,
    angular_hybrid_features,
    gaussian_hybrid_features,
    hybrid_estimate,
    hybrid_features,
    hybrid_key_features,
    hybrid_query_features,
)
from rfjax.features._pointwise import angular_features, arccos_features, linear_features
from rfjax.features._polynomial import polynomial_features
from rfjax.features._positive import positive_features

__all__ = [
    "ClusterHybridParameters",
    "FeaturePair",
    "angular_features",
    "angular_hybrid_features",
    "arccos_features",
    "assign_clusters",
    "cluster_adapted_diagonals",
    "cluster_hybrid_features",
    "cluster_hybrid_parameters",
    "complex_exponential_features",
    "cosine_features",
    "estimate",
    "fit_cluster_hybrid",
    "fourier_features",
    "gaussian_hybrid_features",
    "hybrid_estimate",
    "hybrid_features",
    "hybrid_key_features",
    "hybrid_query_features",
    "kmeans",
    "linear_features",
    "polynomial_features",
    "positive_features",
    "random_offsets",
    "trigonometric_features",
]
