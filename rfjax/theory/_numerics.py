"""Series and quadrature kernels shared by the closed forms (NumPy/SciPy, float64, log-space).

Everything here works on log-magnitudes and signs so that the Gamma-function ratios of the SimRF
paper (which overflow for d in the hundreds) never leave log-space.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

MIN_TERMS = 200
"""Smallest truncation of every power series."""

QUADRATURE_NODES = 128
"""Gauss-Legendre nodes used for the angular integral of Eq. 21."""

_LOG_WEIGHT_CUTOFF = 50.0
"""The angular weight cos(t)^(d-1) is dropped where it is below exp(-50) of its peak."""


def num_terms(scale: float) -> int:
    """Number of series terms for a series whose k-th term is bounded by ``(2 scale)^k / k!``.

    Since (2s)^k/k! <= (2 e s / k)^k, every term past k = 4 e s is below 2^-k of the first; with
    at least ``MIN_TERMS`` (200) terms and 60 beyond 4 e s, the dropped tail is below double
    precision rounding of the leading terms.
    """
    return max(MIN_TERMS, math.ceil(4.0 * math.e * float(scale)) + 60)


def _log_hyp1f1_coefficients(a: float, b: float, count: int) -> tuple[np.ndarray, np.ndarray]:
    """log|c_k| and sign(c_k) of c_k = (a)_k / ((b)_k k!), k < count, for b > 0."""
    j = np.arange(count - 1, dtype=np.float64)
    factors = (a + j) / ((b + j) * (j + 1.0))
    with np.errstate(divide="ignore"):
        log_factors = np.log(np.abs(factors))
    log_abs = np.concatenate([[0.0], np.cumsum(log_factors)])
    sign = np.concatenate([[1.0], np.cumprod(np.sign(factors))])
    return log_abs, sign


def _log_series(a: float, b: float, y: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """log|M(a, b, y)| and its sign by the power series, for y >= 0 (elementwise)."""
    log_coef, sign = _log_hyp1f1_coefficients(a, b, count)
    k = np.arange(count, dtype=np.float64)
    log_terms = log_coef + special.xlogy(k, y[..., None])
    return special.logsumexp(log_terms, axis=-1, b=sign, return_sign=True)


def log_kummer_m(dim: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log|M(d, d/2, x)| and sign, for real x of any sign (M is Kummer's 1F1).

    M(d, d/2, v^2/2) is the ORF conformity (Eq. 23):
    Gamma(d/2)/Gamma(d) sum_k (v^2/2)^k Gamma(k+d) / (k! Gamma(k+d/2)).

    For x >= 0 all terms are positive and are summed in log-space. For x < 0 (the RFF case,
    v^2 -> -z^2) the alternating series would lose about x/ln(10) digits, so Kummer's transform
    M(a, b, x) = e^x M(b-a, b, -x) is used instead: the terms of M(-d/2, d/2, |x|) are bounded by
    |x|^k/k!, and after the factor e^{-|x|} the absolute error is a few ulp.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.abs(x)
    count = num_terms(float(np.max(y, initial=0.0)))
    a, b = float(dim), dim / 2.0
    log_abs, sign = _log_series(a, b, y, count)
    negative = x < 0
    if np.any(negative):
        log_abs_neg, sign_neg = _log_series(b - a, b, y, count)
        log_abs = np.where(negative, log_abs_neg - y, log_abs)
        sign = np.where(negative, sign_neg, sign)
    return log_abs, sign


@functools.lru_cache(maxsize=64)
def _angular_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes s_n = sin(u_n) and log-weights for E[f(sin u)], u with density sin(u)^(d-1) on
    [0, pi/2] (the law of sin(2 phi) in Eq. 21, folded about phi = pi/4).

    Written as t = pi/2 - u, the weight cos(t)^(d-1) ~ exp(-(d-1) t^2/2) is negligible
    (< e^-50) beyond t_max = min(pi/2, sqrt(100/(d-1))), so Gauss-Legendre runs on [0, t_max]:
    the integrand is analytic there and the rule converges exponentially for every d. The
    log-weights are normalised analytically with
    int_0^{pi/2} sin(u)^(d-1) du = sqrt(pi) Gamma(d/2) / (2 Gamma((d+1)/2))  (Eq. 64).
    """
    t_max = (
        math.pi / 2 if dim <= 1 else min(math.pi / 2, math.sqrt(2 * _LOG_WEIGHT_CUTOFF / (dim - 1)))
    )
    nodes, weights = np.polynomial.legendre.leggauss(QUADRATURE_NODES)
    t = 0.5 * t_max * (nodes + 1.0)
    log_weights = np.log(0.5 * t_max * weights) + (dim - 1) * np.log(np.cos(t))
    log_norm = (
        0.5 * math.log(math.pi)
        + special.gammaln(dim / 2)
        - math.log(2.0)
        - special.gammaln((dim + 1) / 2)
    )
    return np.cos(t), log_weights - log_norm


def angular_conformity(dim: int, signed_v2: np.ndarray, cos_theta: np.ndarray) -> np.ndarray:
    """Eq. 21 by quadrature: E_u[M(d, d/2, (v^2/2)(1 + cos(theta) sin u))].

    Eq. 21 is sum_k (v^2/2)^k Gamma(k+d)/(k! Gamma(k+d/2)) int (sin 2phi)^(d-1)
    (1 + sin 2phi cos theta)^k dphi / (2^(d-2) Gamma(d/2)); exchanging the (absolutely
    convergent) sum and integral gives the average above, whose inner sum is Kummer's M.
    ``signed_v2`` may be negative (v^2 -> -z^2 for RFFs). Broadcasts ``signed_v2`` and
    ``cos_theta``.
    """
    sin_u, log_weights = _angular_rule(dim)
    signed_v2, cos_theta = np.broadcast_arrays(
        np.asarray(signed_v2, np.float64), np.asarray(cos_theta, np.float64)
    )
    x = 0.5 * signed_v2[..., None] * (1.0 + cos_theta[..., None] * sin_u)
    log_m, sign_m = log_kummer_m(dim, x)
    log_value, sign = special.logsumexp(log_m + log_weights, axis=-1, b=sign_m, return_sign=True)
    return sign * np.exp(log_value)
