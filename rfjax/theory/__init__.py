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

Reference: Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856.
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
    "block_sizes",
    "conformity",
    "conformity_at_angle",
    "effective_conformity",
    "iid_conformity",
    "monte_carlo_conformity",
    "orthogonal_conformity",
    "prf_mse",
    "prf_orthogonality_gap",
    "rff_mse",
    "rff_orthogonal_mse_ratio_asymptotic",
    "rff_orthogonality_gap",
    "simplex_conformity",
    "small_v_prefactor",
]
