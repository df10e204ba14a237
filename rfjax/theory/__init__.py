"""Closed-form error theory of random features: RF-conformity and MSEs (NumPy float64 oracles).

* RF-conformity (SimRF Eq. 10) of one block: ``iid_conformity`` (Eq. 19),
  ``orthogonal_conformity`` (Eq. 23), ``simplex_conformity`` (Eq. 24), ``conformity_at_angle``
  (Eq. 21 by quadrature), ``conformity`` (by coupling name); over several independent blocks:
  ``effective_conformity`` with ``block_sizes``.
* MSEs: ``prf_mse`` (positive features, Eq. 11; Gaussian and softmax kernels), ``rff_mse``
  (Fourier features, sin/cos and cosine+bias embeddings), the orthogonality gaps
  ``prf_orthogonality_gap`` (Eq. 25) and ``rff_orthogonality_gap`` (Eq. 26),
  ``rff_orthogonal_mse_ratio_asymptotic`` (Eq. 27) and ``small_v_prefactor`` (Sec. 5.1).
* ``monte_carlo_conformity``: the JAX Monte Carlo check for any coupling.
* Hybrid random features (softmax kernel, i.i.d. projections): ``trigonometric_mse`` and
  ``positive_antithetic_mse`` (Lemma 2.2), ``complex_exponential_mse`` (real part of the CE
  estimator), ``angular_coefficient_moments`` (Lemma 3.2), ``angular_hybrid_mse`` (Theorem 3.1,
  both variants), relative errors on the sphere ``trigonometric_relative_error``,
  ``positive_relative_error``, ``max_relative_error`` (Lemma 3.4) and
  ``angular_hybrid_relative_error`` (Theorem 3.5, exact per-angle expression).

References: Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856; Choromanski et al.
2022, "Hybrid Random Features", arXiv:2110.04367.
"""

from rfjax.theory._conformity import (
    block_sizes,
    conformity,
    conformity_at_angle,
    effective_conformity,
    iid_conformity,
    orthogonal_conformity,
    simplex_conformity,
)
from rfjax.theory._hybrid import (
    AngularCoefficientMoments,
    angular_coefficient_moments,
    angular_hybrid_mse,
    angular_hybrid_relative_error,
    complex_exponential_mse,
    max_relative_error,
    positive_antithetic_mse,
    positive_relative_error,
    trigonometric_mse,
    trigonometric_relative_error,
)
from rfjax.theory._monte_carlo import monte_carlo_conformity
from rfjax.theory._mse import (
    prf_mse,
    prf_orthogonality_gap,
    rff_mse,
    rff_orthogonal_mse_ratio_asymptotic,
    rff_orthogonality_gap,
    small_v_prefactor,
)

__all__ = [
    "AngularCoefficientMoments",
    "angular_coefficient_moments",
    "angular_hybrid_mse",
    "angular_hybrid_relative_error",
    "block_sizes",
    "complex_exponential_mse",
    "conformity",
    "conformity_at_angle",
    "effective_conformity",
    "iid_conformity",
    "max_relative_error",
    "monte_carlo_conformity",
    "orthogonal_conformity",
    "positive_antithetic_mse",
    "positive_relative_error",
    "prf_mse",
    "prf_orthogonality_gap",
    "rff_mse",
    "rff_orthogonal_mse_ratio_asymptotic",
    "rff_orthogonality_gap",
    "simplex_conformity",
    "small_v_prefactor",
    "trigonometric_mse",
    "trigonometric_relative_error",
]
