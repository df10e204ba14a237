"""Mean squared errors of positive and Fourier random-feature estimators of the Gaussian kernel.

Kernel conventions: K(x, y) = exp(-|x - y|^2 / 2) (Gaussian), SM(x, y) = exp(x^T y) (softmax).
m = ``num_features`` counts projection vectors; coupled projections come in independent blocks of
d rows, the last one truncated when d does not divide m (``block_sizes``). All functions are JAX
functions of the inputs of shape (..., d) (``jit``, ``vmap``, ``grad``), in float64 when
``jax_enable_x64`` is on and float32 otherwise; ``num_features``, ``coupling``, ``kernel`` and
``embedding`` are static Python values.

References:
  Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856, Eq. 3, 11, 19-27, Sec. 5.1.
  Sutherland & Schneider 2015, "On the Error of Random Fourier Features", arXiv:1506.02785.
  Yu et al. 2016, "Orthogonal Random Features", arXiv:1610.09072.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
from numpy.typing import ArrayLike

from rfjax._validation import check_choice
from rfjax.theory import _conformity, _inputs, _kernels, _quadrature
from rfjax.theory._exponential import exp_difference
from rfjax.theory._inputs import Coupling

Kernel = Literal["gaussian", "softmax"]
Embedding = Literal["sincos", "cosine_bias"]


def _sq(v: jax.Array) -> jax.Array:
    return jnp.sum(v * v, axis=-1)


def _same_block_pairs(coupling: Coupling, dim: int, num_features: int) -> int:
    """S = sum_j b_j (b_j - 1) over the blocks (0 for i.i.d. rows)."""
    if coupling == "gaussian":
        return 0
    return _conformity.same_block_pairs(_conformity.block_sizes(dim, num_features))


def prf_mse(
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    *,
    coupling: Coupling = "gaussian",
    kernel: Kernel = "gaussian",
) -> jax.Array:
    """Exact MSE of the positive-random-feature (PRF) kernel estimate phi(x)^T phi(y).

    With v = |x + y| and rho_eff the conformity averaged over all ordered pairs of rows
    (``effective_conformity``: pairs in one block have the coupling's rho, pairs in different
    blocks the i.i.d. value e^{v^2}):

      MSE = e^{-2|x|^2 - 2|y|^2} / m [(e^{2 v^2} - e^{v^2}) + (m - 1)(rho_eff - e^{v^2})]

    for the Gaussian kernel, features f(w, x) = exp(w^T x - |x|^2); the softmax kernel (features
    exp(w^T x - |x|^2/2)) multiplies this by e^{|x|^2 + |y|^2}. With P = -2|x|^2 - 2|y|^2 + v^2
    it is evaluated as (e^{P + v^2} - e^P) / m + S e^P expm1(log rho_block - v^2) / m^2
    (``exp_difference``; S = sum_j b_j (b_j - 1)), so that no term overflows or underflows
    where the MSE does not (the MSE of the Gaussian kernel at |x| = |y| = 7, x . y = 0, is
    about 1/m).

    A JAX function of ``x`` and ``y``: ``jax.jit(lambda a, b: prf_mse(a, b, 8,
    coupling="simplex"))`` compiles, ``jax.vmap`` maps it and ``jax.grad`` differentiates it
    (e.g. with respect to a temperature that scales the inputs).

    SimRF+ (``coupling="simplex_plus"``) has no closed form and is rejected with the reason: its
    directions are re-optimised for each draw of the norms (Eq. 16-17), so its pair angles are
    random, norm-dependent outputs of an optimisation rather than the one fixed angle of Eq. 21.

    Args:
      x: inputs, shape (..., d), floating.
      y: inputs, shape (..., d), broadcasting against ``x``; |x + y| <= 100 for the block
        couplings.
      num_features: number of projections m >= 1.
      coupling: ``"gaussian"`` (i.i.d.), ``"orthogonal"`` or ``"simplex"`` (blocks of d rows,
        last one truncated, as ``rfjax.projections`` draws them).
      kernel: ``"gaussian"`` or ``"softmax"``.

    Returns:
      Array of the broadcast batch shape of ``x`` and ``y``.

    Raises:
      ValueError: unknown coupling/kernel (with the reason for ``"simplex_plus"``),
        num_features < 1, non-finite or mismatched inputs, dim < 2 for the simplex coupling.

    Examples:
      >>> x = jnp.array([0.5, 0.0]); y = jnp.array([0.0, 0.5])
      >>> bool(prf_mse(x, y, 2, coupling="orthogonal") < prf_mse(x, y, 2))
      True

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 11 (= Eq. 34), Eq. 19, 23, 24 and footnote 2.
    """
    coupling = _inputs.coupling_name(coupling)
    kernel = check_choice("kernel", kernel, ("gaussian", "softmax"))
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    dim = _inputs.dimension(x.shape[-1], coupling)
    v2 = _sq(x + y)
    if coupling != "gaussian":
        _inputs.check_norm("|x + y|", v2)
    log_prefactor = -(1.0 if kernel == "softmax" else 2.0) * (_sq(x) + _sq(y)) + v2
    m = num_features
    diagonal = exp_difference(log_prefactor + v2, log_prefactor) / m
    same = _same_block_pairs(coupling, dim, m)
    if same == 0:
        return diagonal
    log_rho = _conformity.log_block_conformity(coupling, dim, v2)
    return diagonal + same / m**2 * jnp.exp(log_prefactor) * jnp.expm1(log_rho - v2)


def _rff_block_conformity(coupling: Coupling, dim: int, z2: jax.Array) -> jax.Array:
    """E[cos(w_i^T delta) cos(w_j^T delta)] for two rows of one block, |delta|^2 = z2.

    Orthogonal: Eq. 23 with v^2 -> -z^2, i.e. 1F1(d; d/2; -z^2/2), summed through Kummer's
    transform. Simplex: w_i + w_j and w_i - w_j subtend theta and pi - theta, so
    rho = [rho_theta + rho_(pi - theta)] / 2 with v^2 -> -z^2 (docs/maths/fourier_features.md).
    """
    if coupling == "orthogonal":
        return _kernels.rff_orthogonal(dim, z2)
    return _kernels.rff_simplex(dim, z2)


def rff_mse(
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    *,
    coupling: Coupling = "gaussian",
    embedding: Embedding = "sincos",
) -> jax.Array:
    """Exact MSE of the random Fourier feature (RFF) estimate of K(x, y) = exp(-|x - y|^2/2).

    With z = |x - y| and a_i = cos(w_i^T (x - y)):

    * ``"sincos"``: phi(x) = m^{-1/2} [sin(w_i^T x), cos(w_i^T x)]_{i<=m} (2m outputs), so
      phi(x)^T phi(y) = (1/m) sum_i a_i and

        MSE = (1 - e^{-z^2})^2 / (2m) + S (rho_RFF - e^{-z^2}) / m^2,

      S = sum_j b_j (b_j - 1) over the blocks, rho_RFF = E[a_i a_j] for two rows of one block:
      e^{-z^2} for i.i.d. rows (so the second term vanishes; the first is Sutherland &
      Schneider's (1/D)[1 + k(2 delta) - 2 k(delta)^2] with D = 2m), Eq. 23 with v^2 -> -z^2 for
      ORF (for m = d this is the full MSE of Eq. 26), and [rho_theta + rho_(pi-theta)]/2 with
      v^2 -> -z^2 for simplex blocks (not in the paper; SimRF is worse than ORF here).
    * ``"cosine_bias"``: psi(x) = sqrt(2/m) [cos(w_i^T x + b_i)]_{i<=m}, b_i ~ U[0, 2 pi]
      (m outputs), i.i.d. rows only: MSE = (1/m)[1 + k(2 delta)/2 - k(delta)^2]
      = (1/m)[1 + e^{-2 z^2}/2 - e^{-z^2}].

    A JAX function of ``x`` and ``y`` (``jit``, ``vmap``, ``grad``). The simplex block uses a
    fixed 128-node rule, accurate (to 1e-14 absolute) for z <= 20, where the kernel is e^-200.

    Args:
      x: inputs, shape (..., d), floating.
      y: inputs, shape (..., d), broadcasting against ``x``; |x - y| <= 100 for the orthogonal
        coupling and <= 20 for the simplex one.
      num_features: number of projections m >= 1.
      coupling: ``"gaussian"``, ``"orthogonal"`` or ``"simplex"`` (``"sincos"`` only).
      embedding: ``"sincos"`` or ``"cosine_bias"``.

    Returns:
      Array of the broadcast batch shape of ``x`` and ``y``.

    Raises:
      ValueError: unknown names, a non-i.i.d. coupling with ``"cosine_bias"``, bad inputs.

    Examples:
      >>> x = jnp.array([1.0, 0.0]); y = jnp.zeros(2)
      >>> round(float(rff_mse(x, y, 1)), 6)  # (1 - e^-1)^2 / 2
      0.199788

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 3, 23, 26 (= Eq. 72-76);
      Sutherland & Schneider 2015, arXiv:1506.02785.
    """
    coupling = _inputs.coupling_name(coupling)
    embedding = check_choice("embedding", embedding, ("sincos", "cosine_bias"))
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    if embedding == "cosine_bias" and coupling != "gaussian":
        raise ValueError(
            f"embedding='cosine_bias' only supports coupling='gaussian' (i.i.d. "
            f"rows); got coupling={coupling!r}"
        )
    dim = _inputs.dimension(x.shape[-1], coupling)
    z2 = _sq(x - y)
    if coupling != "gaussian":
        limit = (
            _kernels.SIMPLEX_RFF_MAX_DISTANCE if coupling == "simplex" else _inputs.MAX_NORM_OF_SUM
        )
        _inputs.check_norm("|x - y|", z2, limit=limit)
    m = num_features
    if embedding == "cosine_bias":
        return (1.0 + 0.5 * jnp.exp(-2.0 * z2) - jnp.exp(-z2)) / m
    diagonal = jnp.expm1(-z2) ** 2 / (2 * m)
    same = _same_block_pairs(coupling, dim, m)
    if same == 0:
        return diagonal
    excess = _rff_block_conformity(coupling, dim, z2) - jnp.exp(-z2)
    return diagonal + same / m**2 * excess


def prf_orthogonality_gap(x: ArrayLike, y: ArrayLike, num_features: int) -> jax.Array:
    """MSE_IID - MSE_ORF of the Gaussian-kernel PRF estimate, for one block (m <= d).

      gap = (m-1)/m e^{-2|x|^2-2|y|^2} sum_k v^{2k}/k! (1 - prod_{j<k} (d+j)/(d+2j)) > 0,

    v = |x + y|. Each bracket is non-negative, so ORF never does worse than i.i.d. The series has
    positive terms (the brackets by a positive recurrence) and is summed in a while loop (no
    cancellation for small v); its derivative is the same series shifted by one.

    Args:
      x: inputs, shape (..., d), floating.
      y: inputs, shape (..., d), broadcasting against ``x``; |x + y| <= 100.
      num_features: m with 1 <= m <= d.

    Returns:
      Array of the broadcast batch shape.

    Raises:
      ValueError: if num_features > d (several blocks), or bad inputs.

    Examples:
      >>> x = jnp.array([0.3, 0.0]); y = jnp.array([0.0, 0.3])
      >>> bool(prf_orthogonality_gap(x, y, 2) > 0)
      True

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 25 (= Eq. 68-70).
    """
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    _inputs.single_block(num_features, x.shape[-1], "The orthogonality gap (Eq. 25)")
    v2 = _sq(x + y)
    _inputs.check_norm("|x + y|", v2)
    m = num_features
    log_prefactor = -2.0 * (_sq(x) + _sq(y))
    return (m - 1) / m * _kernels.orthogonal_gap(x.shape[-1], v2, log_prefactor)


def rff_orthogonality_gap(z: ArrayLike, dim: int, num_features: int) -> jax.Array:
    """MSE_IID - MSE_ORF of the sin/cos RFF estimate of exp(-z^2/2), for one block (m <= d).

      gap = (m-1)/m (e^{-z^2} - Gamma(d/2)/Gamma(d) sum_k (-z^2/2)^k Gamma(k+d)/(k! Gamma(k+d/2))),

    the PRF result (Eq. 25) with v^2 -> -z^2 and without the norm prefactor. The alternating
    series is 1F1(d; d/2; -z^2/2) and is summed through Kummer's transform (absolute error of a
    few ulp for any z).

    Args:
      z: |x - y|, any shape, |z| <= 100.
      dim: input dimension d >= 1.
      num_features: m with 1 <= m <= d.

    Returns:
      Array of the shape of ``z``.

    Raises:
      ValueError: if num_features > dim, or bad arguments.

    Examples:
      >>> bool(rff_orthogonality_gap(1.0, 6, 6) > 0)
      True

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 26 (= Eq. 76).
    """
    z = _inputs.real_array("z", z)
    dim = _inputs.dimension(dim)
    num_features = _inputs.feature_count(num_features)
    _inputs.single_block(num_features, dim, "The RFF orthogonality gap (Eq. 26)")
    _inputs.check_norm("z", z * z)
    z2 = z * z
    m = num_features
    return (m - 1) / m * (jnp.exp(-z2) - _kernels.rff_orthogonal(dim, z2))


def rff_orthogonal_mse_ratio_asymptotic(z: ArrayLike, dim: int, num_features: int) -> jax.Array:
    """Large-d approximation of MSE_ORF / MSE_IID for sin/cos RFFs, one block (m <= d).

      MSE_ORF / MSE_IID = 1 - (m-1) e^{-z^2} z^4 / (d (1 - e^{-z^2})^2) + O(1/d^2),

    with the removable singularity at z = 0 filled in (z^4/(1 - e^{-z^2})^2 -> 1). Compare with
    the exact ratio ``rff_mse(..., coupling="orthogonal") / rff_mse(...)``.

    Args:
      z: |x - y|, any shape.
      dim: input dimension d >= 1.
      num_features: m with 1 <= m <= d.

    Returns:
      Array of the shape of ``z``.

    Examples:
      >>> round(float(rff_orthogonal_mse_ratio_asymptotic(0.0, 8, 5)), 6)
      0.5

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 27 (= Eq. 86); Yu et al. 2016, arXiv:1610.09072.
    """
    z = _inputs.real_array("z", z)
    dim = _inputs.dimension(dim)
    num_features = _inputs.feature_count(num_features)
    _inputs.single_block(num_features, dim, "The asymptotic ratio (Eq. 27)")
    z2 = z * z
    positive = z2 > 0
    safe = jnp.where(positive, z2, 1.0)  # keeps the derivative at z = 0 finite
    ratio = jnp.where(positive, safe / -jnp.expm1(-safe), 1.0)
    return 1.0 - (num_features - 1) / dim * jnp.exp(-z2) * ratio**2


def small_v_prefactor(coupling: Coupling, dim: int, num_features: int) -> float:
    """Coefficient c of v^2 in m e^{2|x|^2 + 2|y|^2} MSE = c v^2 + O(v^4) (PRF, one block).

    IID and ORF: c = 1. SimRF with m <= d rows in one block:
    c = 1 - (m-1) 2 Gamma((d+1)/2)^2 / (d (d-1) Gamma(d/2)^2), which for m = d is
    1 - 2 Gamma((d+1)/2)^2 / (d Gamma(d/2)^2) (0.0796 at d = 6, 0.00778 at d = 64).

    Every argument is static (a name and two ints), so the result is a Python float, a
    constant under ``jit``.

    Args:
      coupling: ``"gaussian"``, ``"orthogonal"`` or ``"simplex"``.
      dim: input dimension d (>= 2 for ``"simplex"``).
      num_features: m with 1 <= m <= d (the expansion is stated for a single block).

    Returns:
      The prefactor as a float.

    Raises:
      ValueError: if num_features > dim, or bad arguments.

    Examples:
      >>> round(small_v_prefactor("simplex", 6, 6), 5)
      0.07961

    References:
      Reid et al. 2023, arXiv:2301.13856, Sec. 5.1.
    """
    coupling = _inputs.coupling_name(coupling)
    dim = _inputs.dimension(dim, coupling)
    num_features = _inputs.feature_count(num_features)
    _inputs.single_block(num_features, dim, "The small-v expansion (Sec. 5.1)")
    if coupling != "simplex":
        return 1.0
    # Gamma((d+1)/2)^2 / Gamma(d/2)^2 = (sqrt(pi)/2)^2 / exp(2 log_weight_normaliser(d)).
    log_ratio = 2.0 * (
        0.5 * math.log(math.pi) - math.log(2.0) - _quadrature.log_weight_normaliser(dim)
    )
    return 1.0 - (num_features - 1) * 2.0 * math.exp(log_ratio) / (dim * (dim - 1))
