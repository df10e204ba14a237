"""Closed-form error theory of random features: RF-conformity and MSEs, as JAX functions.

* RF-conformity (SimRF Eq. 10) of one block: ``iid_conformity`` (Eq. 19),
  ``orthogonal_conformity`` (Eq. 23), ``simplex_conformity`` (Eq. 24), ``conformity_at_angle``
  (Eq. 21 by quadrature), ``conformity`` and ``log_conformity`` (by coupling name); over several
  independent blocks: ``effective_conformity`` with ``block_sizes``.
* MSEs: ``prf_mse`` (positive features, Eq. 11; Gaussian and softmax kernels), ``rff_mse``
  (Fourier features, sin/cos and cosine+bias embeddings), the orthogonality gaps
  ``prf_orthogonality_gap`` (Eq. 25) and ``rff_orthogonality_gap`` (Eq. 26),
  ``rff_orthogonal_mse_ratio_asymptotic`` (Eq. 27) and ``small_v_prefactor`` (Sec. 5.1).
* Structured (P-model) features, Choromanski & Fagan: ``coherence_graphs`` of a P-model,
  ``chromatic_number`` (exact when certified, else a greedy upper bound) and
  ``p_model_chromatic_number`` (Eq. 4); deviation bounds ``chromatic_deviation_bound`` (the
  paper's k/chi mechanism) and ``structured_fourier_bound`` with ``row_covariance`` (Gaussian
  concentration for any P-model); for i.i.d. random Fourier features ``rff_pointwise_bound``
  (Kakade's notes) and ``rff_uniform_bound`` with ``sutherland_schneider_beta`` (Sutherland &
  Schneider).
* Hybrid random features (softmax kernel, i.i.d. projections): ``trigonometric_mse`` and
  ``positive_antithetic_mse`` (Lemma 2.2), ``complex_exponential_mse`` (real part of the CE
  estimator), ``angular_coefficient_moments`` (Lemma 3.2), ``angular_hybrid_mse`` (Theorem 3.1,
  both variants), relative errors on the sphere ``trigonometric_relative_error``,
  ``positive_relative_error``, ``max_relative_error`` (Lemma 3.4) and
  ``angular_hybrid_relative_error`` (Theorem 3.5, exact per-angle expression).
* Generalised and dense exponential features (softmax kernel, i.i.d. rows): ``gerf_variance``
  and ``gerf_log_second_moment`` (GERF, arXiv:2205.15317), ``oprf_variance`` (OPRF /
  FAVOR++ at the optimal A), ``dense_exponential_variance`` and
  ``dense_exponential_log_second_moment`` (DERF / FAVOR#, arXiv:2302.00787).
* ``rank_estimators``: the (feature map x coupling) pairs with closed forms ranked by predicted
  MSE for given inputs (or input statistics), host-only.
* ``log_hyp0f1``: log 0F1(; b; z), the radial average behind RF-conformity (Eq. 10, 31-33).
* ``monte_carlo_conformity``: the Monte Carlo check for any coupling; ``COUPLINGS`` (those with
  closed forms) and ``no_closed_form_reason`` (why the others, e.g. SimRF+, have none).

JAX composition. Every closed form above is a JAX function of its array arguments: it runs under
``jax.jit``, ``jax.vmap`` and ``jax.grad`` (series are summed in ``lax.while_loop`` with exact
``custom_jvp`` derivative rules), in float64 when ``jax_enable_x64`` is on and float32 otherwise,
with no NumPy or SciPy on traced values. Names, dimensions and feature counts are static Python
arguments. Value checks (finite inputs, ranges such as |x + y| <= 100 for the series-based forms)
raise ``ValueError`` on concrete inputs; under tracing an out-of-range element is NaN instead.
``small_v_prefactor`` and ``block_sizes`` take only static arguments and return Python numbers.

Host-only: ``monte_carlo_conformity``, which draws projections with a jitted kernel but
returns Python floats (mean and standard error, averaged in float64 on the host), so it cannot be
traced (it is a check on the closed forms, not a closed form); and the structured (P-model)
functions, which colour graphs (networkx) and bound tails of concrete matrices.

References: Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856; Choromanski et al.
2022, "Hybrid Random Features", arXiv:2110.04367; Choromanski & Fagan 2016, "Fast nonlinear
embeddings via structured matrices", arXiv:1604.07356; Sutherland & Schneider 2015, "On the
Error of Random Fourier Features", arXiv:1506.02785.
"""

from rfjax.theory._conformity import (
    block_sizes,
    conformity,
    conformity_at_angle,
    effective_conformity,
    iid_conformity,
    log_conformity,
    orthogonal_conformity,
    simplex_conformity,
)
from rfjax.theory._exponential import (
    dense_exponential_log_second_moment,
    dense_exponential_variance,
    gerf_log_second_moment,
    gerf_variance,
    oprf_variance,
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
from rfjax.theory._inputs import COUPLINGS, no_closed_form_reason
from rfjax.theory._monte_carlo import monte_carlo_conformity
from rfjax.theory._mse import (
    prf_mse,
    prf_orthogonality_gap,
    rff_mse,
    rff_orthogonal_mse_ratio_asymptotic,
    rff_orthogonality_gap,
    small_v_prefactor,
)
from rfjax.theory._ranking import RankedEstimator, rank_estimators
from rfjax.theory._series import log_hyp0f1
from rfjax.theory._structured import (
    chromatic_deviation_bound,
    chromatic_number,
    coherence_graphs,
    p_model_chromatic_number,
    rff_pointwise_bound,
    rff_uniform_bound,
    row_covariance,
    structured_fourier_bound,
    sutherland_schneider_beta,
)

__all__ = [
    "COUPLINGS",
    "AngularCoefficientMoments",
    "RankedEstimator",
    "angular_coefficient_moments",
    "angular_hybrid_mse",
    "angular_hybrid_relative_error",
    "block_sizes",
    "chromatic_deviation_bound",
    "chromatic_number",
    "coherence_graphs",
    "complex_exponential_mse",
    "conformity",
    "conformity_at_angle",
    "dense_exponential_log_second_moment",
    "dense_exponential_variance",
    "effective_conformity",
    "gerf_log_second_moment",
    "gerf_variance",
    "iid_conformity",
    "log_conformity",
    "log_hyp0f1",
    "max_relative_error",
    "monte_carlo_conformity",
    "no_closed_form_reason",
    "oprf_variance",
    "orthogonal_conformity",
    "p_model_chromatic_number",
    "positive_antithetic_mse",
    "positive_relative_error",
    "prf_mse",
    "prf_orthogonality_gap",
    "rank_estimators",
    "rff_mse",
    "rff_orthogonal_mse_ratio_asymptotic",
    "rff_orthogonality_gap",
    "rff_pointwise_bound",
    "rff_uniform_bound",
    "row_covariance",
    "simplex_conformity",
    "small_v_prefactor",
    "structured_fourier_bound",
    "sutherland_schneider_beta",
    "trigonometric_mse",
    "trigonometric_relative_error",
]
