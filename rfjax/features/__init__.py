"""Feature maps phi(x, projection, ...): ``(..., d) -> (..., width)`` with E[phi(x).phi(y)] = K.

Each map takes a drawn ``rfjax.projections.Projection`` (any coupling) and documents its width,
the kernel it estimates and the maths. ``estimate(phi_x, phi_y)`` forms pairwise estimates; a
Gram matrix of estimates is ``phi_x @ phi_y.T``.

Asymmetric estimators (complex-exponential and hybrid features, HRF arXiv:2110.04367) take
``side="query"`` or ``side="key"``: the estimate is query features . key features.

Named maps: every estimator that attention, models, scikit-learn and configs take by name is a
``FeatureMap`` (the protocol: ``features``, the log-space form ``scaled_features``, parameters by
``init``/``fit``; ``FeatureMapPair`` joins two maps) registered here: ``get("positive")()`` makes
one, ``build(name, **options)`` makes one from the options its factory takes, ``available()``
lists the names, ``info(name)`` gives the kernel and label, ``register`` adds one.
"""

import functools

from rfjax.features._clustering import (
    ClusterHybridFeatureMap,
    ClusterHybridParameters,
    assign_clusters,
    cluster_adapted_diagonals,
    cluster_hybrid_features,
    cluster_hybrid_log_features,
    cluster_hybrid_parameters,
    fit_cluster_hybrid,
    kmeans,
)
from rfjax.features._common import estimate, gaussian_kernel_features
from rfjax.features._complex_exponential import complex_exponential_features
from rfjax.features._dense_exponential import (
    DenseExponentialFeatureMap,
    DenseExponentialParameters,
    dense_exponential_features,
    dense_exponential_log_features,
    dense_exponential_parameters,
    fit_dense_exponential,
)
from rfjax.features._fourier import (
    FourierFeatureMap,
    TrigonometricFeatureMap,
    cosine_features,
    fourier_features,
    random_offsets,
    trigonometric_features,
)
from rfjax.features._generalized_exponential import (
    InputStatistics,
    OptimizedPositiveFeatureMap,
    generalized_exponential_features,
    generalized_exponential_log_features,
    input_statistics,
    mean_squared_sum,
    optimal_gerf_parameter,
    optimized_positive_features,
)
from rfjax.features._hybrid import (
    AngularHybridFeatureMap,
    FeaturePair,
    GaussianHybridFeatureMap,
    HybridParts,
    angular_hybrid_features,
    gaussian_hybrid_features,
    hybrid_estimate,
    hybrid_features,
    hybrid_gram,
    hybrid_key_features,
    hybrid_query_features,
)
from rfjax.features._pointwise import (
    ReluFeatureMap,
    angular_features,
    arccos_features,
    linear_features,
    relu_features,
)
from rfjax.features._polynomial import polynomial_features
from rfjax.features._positive import PositiveFeatureMap, positive_features, positive_log_features
from rfjax.features._protocol import (
    SIDES,
    AffineLogForm,
    ExponentialFeatureMap,
    FeatureMap,
    FeatureMapPair,
    ScaledFeatures,
    Side,
    exponential_side,
)
from rfjax.features._registry import FeatureMapInfo, available, build, get, info, register

register("positive", PositiveFeatureMap, kernel="softmax", label="FAVOR+ (positive)")
register(
    "positive_antithetic",
    functools.partial(PositiveFeatureMap, antithetic=True),
    kernel="softmax",
    label="FAVOR+ (antithetic)",
)
register("trigonometric", TrigonometricFeatureMap, kernel="softmax", label="trigonometric")
register("angular_hybrid", AngularHybridFeatureMap, kernel="softmax", label="HRF angular hybrid")
register("cluster_hybrid", ClusterHybridFeatureMap, kernel="softmax", label="HRF cluster hybrid")
register("gaussian_hybrid", GaussianHybridFeatureMap, kernel="softmax", label="HRF Gaussian hybrid")
register("fourier", FourierFeatureMap, kernel="gaussian", label="random Fourier")
register("relu", ReluFeatureMap, kernel=None, label="ReLU (generalised)")
register("oprf", OptimizedPositiveFeatureMap, kernel="softmax", label="OPRF (FAVOR++)")
register(
    "derf_asymmetric",
    functools.partial(DenseExponentialFeatureMap, variant="asymmetric"),
    kernel="softmax",
    label="ADERF",
)
register(
    "derf_symmetric",
    functools.partial(DenseExponentialFeatureMap, variant="symmetric"),
    kernel="softmax",
    label="SDERF",
)
register(
    "saderf",
    functools.partial(DenseExponentialFeatureMap, variant="simplified"),
    kernel="softmax",
    label="SADERF (FAVOR#)",
)

__all__ = [
    "SIDES",
    "AffineLogForm",
    "AngularHybridFeatureMap",
    "ClusterHybridFeatureMap",
    "ClusterHybridParameters",
    "DenseExponentialFeatureMap",
    "DenseExponentialParameters",
    "ExponentialFeatureMap",
    "FeatureMap",
    "FeatureMapInfo",
    "FeatureMapPair",
    "FeaturePair",
    "FourierFeatureMap",
    "GaussianHybridFeatureMap",
    "HybridParts",
    "InputStatistics",
    "OptimizedPositiveFeatureMap",
    "PositiveFeatureMap",
    "ReluFeatureMap",
    "ScaledFeatures",
    "Side",
    "TrigonometricFeatureMap",
    "angular_features",
    "angular_hybrid_features",
    "arccos_features",
    "assign_clusters",
    "available",
    "build",
    "cluster_adapted_diagonals",
    "cluster_hybrid_features",
    "cluster_hybrid_log_features",
    "cluster_hybrid_parameters",
    "complex_exponential_features",
    "cosine_features",
    "dense_exponential_features",
    "dense_exponential_log_features",
    "dense_exponential_parameters",
    "estimate",
    "exponential_side",
    "fit_cluster_hybrid",
    "fit_dense_exponential",
    "fourier_features",
    "gaussian_hybrid_features",
    "gaussian_kernel_features",
    "generalized_exponential_features",
    "generalized_exponential_log_features",
    "get",
    "hybrid_estimate",
    "hybrid_features",
    "hybrid_gram",
    "hybrid_key_features",
    "hybrid_query_features",
    "info",
    "input_statistics",
    "kmeans",
    "linear_features",
    "mean_squared_sum",
    "optimal_gerf_parameter",
    "optimized_positive_features",
    "polynomial_features",
    "positive_features",
    "positive_log_features",
    "random_offsets",
    "register",
    "relu_features",
    "trigonometric_features",
]
