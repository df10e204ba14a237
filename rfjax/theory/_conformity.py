"""RF-conformity (SimRF paper Eq. 10) in closed form for i.i.d., orthogonal and simplex couplings.

rho(x, y) = 1/(m(m-1)) sum_{i != j} E[exp((w_i + w_j)^T (x + y))] depends on x, y only through
v = |x + y|. All functions are NumPy/SciPy float64 oracles, vectorised over ``v`` (and
``theta``), and evaluated in log-space: no overflow for d up to (at least) 1024 and v up to ~3
(and well beyond; the series lengths adapt to v, see ``_numerics.num_terms``).

References:
  Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856, Eq. 10, 19-24.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from rfjax._validation import check_int
from rfjax.theory import _inputs, _numerics


def iid_conformity(v: ArrayLike) -> np.ndarray:
    """RF-conformity of i.i.d. Gaussian projections: rho_IID = exp(v^2).

    For independent w_i, w_j ~ N(0, I_d), w_i + w_j ~ N(0, 2 I_d), so
    E[exp((w_i + w_j)^T (x + y))] = exp(|x + y|^2).

    Args:
      v: |x + y|, any shape.

    Returns:
      float64 array of the shape of ``v``.

    Raises:
      ValueError: if ``v`` holds NaN or infinity.

    Examples:
      >>> float(iid_conformity(1.0))
      2.718281828459045

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 19.
    """
    v = _inputs.real_array("v", v)
    return np.exp(v * v)


def orthogonal_conformity(dim: int, v: ArrayLike) -> np.ndarray:
    """RF-conformity of orthogonal random features (ORF): pairs at angle pi/2 with chi_d norms.

    rho_ORF = Gamma(d/2)/Gamma(d) sum_k (v^2/2)^k Gamma(k+d) / (k! Gamma(k+d/2))
            = 1F1(d; d/2; v^2/2).

    The series has positive terms; it is summed in log-space with log-Gamma coefficients and
    truncated adaptively (at least 200 terms, see ``_numerics.num_terms``).

    Args:
      dim: input dimension d >= 1.
      v: |x + y|, any shape.

    Returns:
      float64 array of the shape of ``v``.

    Examples:
      >>> round(float(orthogonal_conformity(6, 1.0)), 10)
      2.5795618214

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 23 (= Eq. 65).
    """
    dim = _inputs.dimension(dim)
    v = _inputs.real_array("v", v)
    log_value, sign = _numerics.log_kummer_m(dim, 0.5 * v * v)
    return sign * np.exp(log_value)


@functools.lru_cache(maxsize=64)
def _simplex_inner_sums(dim: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """log|S_k| and sign(S_k), k < count, for the inner sum of Eq. 24:

    S_k = sum_{p=0}^{k} (-1/(d-1))^p Gamma((d+p)/2) / Gamma((d+p+1)/2) / (p! (k-p)!).

    The sum alternates in p; it is formed as a signed log-sum-exp. Its exact value is positive
    (S_k = 2/(sqrt(pi) k!) int (sin 2phi)^(d-1) (1 - sin 2phi/(d-1))^k dphi), and rounding
    cancellation grows like ((d)/(d-2))^k, but it only matters where the outer factor
    (v^2)^k/k! is tiny: the absolute error of rho_SimRF stays near eps * exp((1 + 1/(d-1)) v^2).
    """
    k = np.arange(count, dtype=np.float64)[:, None]
    p = np.arange(count, dtype=np.float64)[None, :]
    valid = p <= k
    k_minus_p = np.where(valid, k - p, 0.0)
    log_terms = (
        -p * math.log(dim - 1)
        + special.gammaln((dim + p) / 2)
        - special.gammaln((dim + p + 1) / 2)
        - special.gammaln(p + 1)
        - special.gammaln(k_minus_p + 1)
    )
    log_terms = np.where(valid, log_terms, -np.inf)
    signs = np.where(valid, (-1.0) ** p, 0.0)
    return special.logsumexp(log_terms, axis=1, b=signs, return_sign=True)


def simplex_conformity(dim: int, v: ArrayLike) -> np.ndarray:
    """RF-conformity of simplex random features (SimRF): pairs at angle arccos(-1/(d-1)).

    rho_SimRF = sqrt(pi) / (Gamma(d/2) 2^(d-1)) sum_k Gamma(k+d)/Gamma(k+d/2) (v^2/2)^k
                sum_{p=0}^{k} (-1/(d-1))^p Gamma((d+p)/2)/Gamma((d+p+1)/2) / (p! (k-p)!).

    The double series is evaluated in log-space: the inner alternating sums in p (independent of
    v, cached per d) by a signed log-sum-exp, the outer sum over k likewise, with log-Gamma
    coefficients throughout. The outer series is truncated adaptively (at least 200 terms). The
    result agrees with quadrature of Eq. 21 (``conformity_at_angle``) to ~1e-12 relative.

    Args:
      dim: input dimension d >= 2.
      v: |x + y|, any shape.

    Returns:
      float64 array of the shape of ``v``.

    Examples:
      >>> round(float(simplex_conformity(6, 1.0)), 10)
      2.1818260611

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 24 (= Eq. 67).
    """
    dim = _inputs.dimension(dim, "simplex")
    v = _inputs.real_array("v", v)
    v2 = v * v
    count = _numerics.num_terms(float(np.max(v2, initial=0.0)))
    log_inner, sign_inner = _simplex_inner_sums(dim, count)
    k = np.arange(count, dtype=np.float64)
    log_prefactor = 0.5 * math.log(math.pi) - special.gammaln(dim / 2) - (dim - 1) * math.log(2.0)
    log_terms = (
        log_prefactor
        + special.gammaln(k + dim)
        - special.gammaln(k + dim / 2)
        + log_inner
        + special.xlogy(k, 0.5 * v2[..., None])
    )
    log_value, sign = special.logsumexp(log_terms, axis=-1, b=sign_inner, return_sign=True)
    return sign * np.exp(log_value)


def conformity_at_angle(dim: int, v: ArrayLike, theta: ArrayLike) -> np.ndarray:
    """RF-conformity of pairs with chi_d norms at a fixed angle theta, by quadrature of Eq. 21.

    rho_theta = 1/(2^(d-2) Gamma(d/2)) sum_k (v^2/2)^k Gamma(k+d)/(k! Gamma(k+d/2))
                int_0^{pi/2} (sin 2phi)^(d-1) (1 + sin 2phi cos theta)^k dphi.

    The sum over k is taken inside the integral, where it is Kummer's 1F1(d; d/2; .), and the
    phi-integral is done by a 128-node Gauss-Legendre rule on the region where the weight
    (sin 2phi)^(d-1) is non-negligible (exponentially convergent for every d). theta = pi/2
    gives ``orthogonal_conformity`` and theta = arccos(-1/(d-1)) gives ``simplex_conformity``.

    Args:
      dim: input dimension d >= 1.
      v: |x + y|; broadcasts against ``theta``.
      theta: angle between the paired projection directions, in radians.

    Returns:
      float64 array of the broadcast shape of ``v`` and ``theta``.

    Examples:
      >>> round(float(conformity_at_angle(6, 1.0, np.pi / 2)), 10)
      2.5795618214

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 21 (= Eq. 63) and Eq. 22.
    """
    dim = _inputs.dimension(dim)
    v = _inputs.real_array("v", v)
    theta = _inputs.real_array("theta", theta)
    return _numerics.angular_conformity(dim, v * v, np.cos(theta))


def conformity(coupling: str, dim: int, v: ArrayLike) -> np.ndarray:
    """RF-conformity of one block of the named coupling.

    Args:
      coupling: ``"gaussian"`` (Eq. 19), ``"orthogonal"`` (Eq. 23) or ``"simplex"`` (Eq. 24); the
        names of the samplers in ``rfjax.projections``.
      dim: input dimension d (>= 2 for ``"simplex"``).
      v: |x + y|, any shape.

    Returns:
      float64 array of the shape of ``v``.

    Raises:
      ValueError: for an unknown coupling (the message lists the allowed ones).

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10, 19, 23, 24.
    """
    coupling = _inputs.coupling_name(coupling)
    dim = _inputs.dimension(dim, coupling)
    if coupling == "gaussian":
        return iid_conformity(v)
    if coupling == "orthogonal":
        return orthogonal_conformity(dim, v)
    return simplex_conformity(dim, v)


def block_sizes(dim: int, num_features: int) -> tuple[int, ...]:
    """Block sizes (d, ..., d, r) of the truncate rule: ceil(m/d) blocks, the last of r = m mod d.

    This is the layout of ``rfjax.projections.orthogonal``/``simplex`` (``Projection.block_sizes``).

    Args:
      dim: input dimension d >= 1.
      num_features: number of projections m >= 1.

    Returns:
      A tuple of positive ints summing to m.

    Examples:
      >>> block_sizes(6, 15)
      (6, 6, 3)
    """
    dim = _inputs.dimension(dim)
    num_features = _inputs.feature_count(num_features)
    full, rest = divmod(num_features, dim)
    return (dim,) * full + ((rest,) if rest else ())


def _check_block_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence) or not sizes:
        raise TypeError(f"block_sizes must be a non-empty sequence of positive ints, got {sizes!r}")
    return tuple(check_int("block_sizes entries", size, minimum=1) for size in sizes)


def same_block_pairs(sizes: Sequence[int]) -> int:
    """sum_j b_j (b_j - 1): the number of ordered pairs i != j in the same block."""
    return sum(size * (size - 1) for size in sizes)


def effective_conformity(
    block_conformity: ArrayLike, v: ArrayLike, block_sizes: Sequence[int]
) -> np.ndarray:
    """RF-conformity averaged over all ordered pairs of m rows drawn in independent blocks.

    rho_eff = [S rho_block + (m(m-1) - S) e^{v^2}] / (m(m-1)),  S = sum_j b_j (b_j - 1),

    since rows in different blocks are independent and behave like i.i.d. pairs (Eq. 19). For
    m = 1 there are no pairs; the value is then e^{v^2} by convention (it is multiplied by m - 1
    = 0 in Eq. 11).

    Args:
      block_conformity: rho of a pair inside one block (e.g. ``simplex_conformity(d, v)``).
      v: |x + y|; broadcasts against ``block_conformity``.
      block_sizes: the block sizes b_1..b_B, e.g. ``projection.block_sizes()`` or
        ``block_sizes(d, m)``.

    Returns:
      float64 array of the broadcast shape.

    Examples:
      >>> round(float(effective_conformity(2.0, 0.0, (2, 2))), 12)  # 4 of 12 pairs in a block
      1.333333333333

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10-11 and footnote 2 (multi-block form derived in
      EQUATIONS.md).
    """
    rho_block = _inputs.real_array("block_conformity", block_conformity)
    v = _inputs.real_array("v", v)
    sizes = _check_block_sizes(block_sizes)
    m = sum(sizes)
    iid = np.exp(v * v)
    if m < 2:
        return np.broadcast_to(iid, np.broadcast_shapes(iid.shape, rho_block.shape)).copy()
    weight = same_block_pairs(sizes) / (m * (m - 1))
    return weight * rho_block + (1.0 - weight) * iid
