"""Closed-form errors of the HRF estimators of the softmax kernel SM(x, y) = exp(x.y).

JAX functions (``jit``, ``vmap``, ``grad``) of inputs of shape (..., d) (batch shapes broadcast),
in float64 when ``jax_enable_x64`` is on and float32 otherwise. All results are for i.i.d.
Gaussian projections (the setting of the HRF paper). Notation: z = x + y,
Delta = x - y, theta the angle between x and y (pi/2 when either is zero, as in
``rfjax.kernels``), m projections for each base estimator, n for the angular coefficient.

References:
  Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Lemma 2.2, 3.2,
  3.4, Theorem 3.1, 3.5; docs/maths/hybrid.md (derivations of the exact expressions).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from rfjax._validation import check_choice, check_int, is_concrete
from rfjax.theory import _inputs

Variant = Literal["independent", "shared"]
VARIANTS: tuple[Variant, ...] = ("independent", "shared")


def _sq(v: jax.Array) -> jax.Array:
    return jnp.sum(v * v, axis=-1)


def _angle(x: jax.Array, y: jax.Array) -> jax.Array:
    """Angle between x and y; pi/2 when either is zero (the derivative there is then 0)."""
    norms2 = _sq(x) * _sq(y)
    positive = norms2 > 0
    safe = jnp.sqrt(jnp.where(positive, norms2, 1.0))
    cosine = jnp.where(positive, jnp.sum(x * y, axis=-1) / safe, 0.0)
    return jnp.arccos(jnp.clip(cosine, -1.0, 1.0))


def trigonometric_mse(x: ArrayLike, y: ArrayLike, num_features: int) -> jax.Array:
    """MSE of the trigonometric estimator SM-hat^{trig}_m (HRF Lemma 2.2, Eq. 7).

      MSE = (1/(2m)) e^{|z|^2} SM^{-2}(x, y) (1 - e^{-|Delta|^2})^2
          = (1/(2m)) e^{|x|^2 + |y|^2} (1 - e^{-|Delta|^2})^2,

    zero at x = y. Evaluated with ``expm1``.

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcasting against ``x``.
      num_features: m >= 1 (width 2m).

    Returns:
      Array of the broadcast batch shape.

    Raises:
      TypeError, ValueError: for non-floating, non-finite or mismatched inputs, or m < 1.

    Examples:
      >>> x = jnp.array([1.0, 0.0]); y = jnp.array([0.0, 1.0])
      >>> round(float(trigonometric_mse(x, y, 4)), 6)  # e^2 (1 - e^-2)^2 / 8
      0.690549

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 2.2.
    """
    m = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    # e^{(|x|^2 + |y|^2) / 2} squared: finite at x = y wherever SM(x, y) is (0 * inf before).
    return (jnp.exp(0.5 * (_sq(x) + _sq(y))) * jnp.expm1(-_sq(x - y))) ** 2 / (2 * m)


def positive_antithetic_mse(x: ArrayLike, y: ArrayLike, num_features: int) -> jax.Array:
    """MSE of the antithetic positive estimator SM-hat^{++}_m (HRF Lemma 2.2, Eq. 7).

      MSE = (1/(2m)) e^{|z|^2} SM^2(x, y) (1 - e^{-|z|^2})^2,

    zero at y = -x. (The plain positive estimator: ``prf_mse(..., kernel="softmax")``.)

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcasting against ``x``.
      num_features: m >= 1 (width 2m: the pairs +-w_i).

    Returns:
      Array of the broadcast batch shape.

    Examples:
      >>> x = jnp.array([1.0, 0.0]); y = jnp.array([0.0, 1.0])
      >>> round(float(positive_antithetic_mse(x, y, 4)), 6)  # e^2 (1 - e^-2)^2 / 8
      0.690549

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 2.2, Eq. 3.
    """
    m = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    z2 = _sq(x + y)
    return jnp.exp(z2 + 2.0 * jnp.sum(x * y, axis=-1)) * jnp.expm1(-z2) ** 2 / (2 * m)


def _check_matrix(matrix: ArrayLike, dim: int) -> jax.Array:
    """``matrix`` as a complex array of the working precision; values checked when concrete."""
    try:
        values = jnp.asarray(matrix)
    except TypeError as err:
        raise TypeError(f"matrix must be a real or complex array, got {matrix!r}") from err
    if not (
        jnp.issubdtype(values.dtype, jnp.floating)
        or jnp.issubdtype(values.dtype, jnp.complexfloating)
    ):
        raise TypeError(
            f"matrix must be a real or complex floating array, got dtype {values.dtype}"
        )
    if values.shape not in ((dim, dim), (dim,)):
        raise ValueError(
            f"matrix must have shape (d, d) = ({dim}, {dim}) or, for a diagonal, ({dim},); got "
            f"{values.shape}"
        )
    values = values.astype(jnp.result_type(_inputs.theory_dtype(), jnp.complex64))
    if is_concrete(values):
        _check_invertible(np.asarray(values, np.complex128))
    return values


def _check_invertible(values: np.ndarray) -> None:
    """Raises for non-finite entries or a condition number >= 1/eps (float64); host-side."""
    if not np.all(np.isfinite(values)):
        raise ValueError("matrix must contain only finite values (no NaN or inf)")
    if values.ndim == 1:
        smallest = np.abs(values).min()
        condition = np.abs(values).max() / smallest if smallest > 0 else math.inf
    else:
        condition = float(np.linalg.cond(values))
    if not condition < 1.0 / np.finfo(np.float64).eps:
        raise ValueError(f"matrix must be invertible, got condition number {condition:.3g}")


def complex_exponential_mse(
    x: ArrayLike, y: ArrayLike, matrix: ArrayLike, num_features: int
) -> jax.Array:
    """MSE of Re SM-hat^m_A, the real part of the complex-exponential estimator (HRF Eq. 16).

    With u = A x + A^{-T} y = a + i b (docs/maths/hybrid.md):

      MSE = (SM^2 / m) [ (e^{|a|^2 + |b|^2} + e^{|a|^2 - |b|^2} cos(2 a.b)) / 2 - 1 ],

    which is (SM^2 / m)(e^{|u|^2} - 1) for real A and zero iff u = 0 (Eq. 17). This is the MSE of
    ``complex_exponential_features`` (query side A, key side A^{-T}).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcasting against ``x``.
      matrix: A, shape ``(d, d)`` or a diagonal ``(d,)``, real or complex, invertible.
      num_features: m >= 1.

    Returns:
      Array of the broadcast batch shape.

    Raises:
      TypeError, ValueError: as ``trigonometric_mse``; a matrix of the wrong shape, non-finite
        or singular (condition number >= 1/eps of float64).

    Examples:
      >>> x = jnp.array([1.0, 0.0]); y = jnp.array([0.0, 1.0])
      >>> round(float(complex_exponential_mse(x, y, jnp.eye(2), 4)), 6)  # (e^2 - 1) / 4
      1.597264

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 2.4, Eq. 14-17.
    """
    m = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    a = _check_matrix(matrix, x.shape[-1])
    u = x * a + y / a if a.ndim == 1 else x @ a.T + y @ jnp.linalg.inv(a)
    re, im = u.real, u.imag
    re2, im2, cross = _sq(re), _sq(im), jnp.sum(re * im, axis=-1)
    # e^{s} cos t - 1 = expm1(s) cos t - 2 sin^2(t/2): no cancellation near u = 0.
    bracket = 0.5 * jnp.expm1(re2 + im2) + 0.5 * (
        jnp.expm1(re2 - im2) * jnp.cos(2 * cross) - 2 * jnp.sin(cross) ** 2
    )
    return jnp.exp(2 * jnp.sum(x * y, axis=-1)) * bracket / m


class AngularCoefficientMoments(NamedTuple):
    """Moments of lambda-hat of the angular hybrid (Lemma 3.2, Theorem D.1 Eq. 45-47).

    Attributes:
      mean: E[lambda-hat] = theta/pi.
      variance: Var[lambda-hat] = theta (pi - theta) / (n pi^2).
      second_moment: E[lambda-hat^2].
      complement_second_moment: E[(1 - lambda-hat)^2].
      cross_moment: E[lambda-hat (1 - lambda-hat)] = (1 - 1/n) theta (pi - theta) / pi^2.
    """

    mean: jax.Array
    variance: jax.Array
    second_moment: jax.Array
    complement_second_moment: jax.Array
    cross_moment: jax.Array


def _moments_from_angle(theta: jax.Array, n: int) -> AngularCoefficientMoments:
    mean = theta / math.pi
    variance = theta * (math.pi - theta) / (n * math.pi**2)
    return AngularCoefficientMoments(
        mean=mean,
        variance=variance,
        second_moment=mean**2 + variance,
        complement_second_moment=(1.0 - mean) ** 2 + variance,
        cross_moment=(1.0 - 1.0 / n) * theta * (math.pi - theta) / math.pi**2,
    )


def angular_coefficient_moments(
    x: ArrayLike, y: ArrayLike, num_sign_features: int
) -> AngularCoefficientMoments:
    """Moments of the angular coefficient lambda-hat = 1/2 - (1/2n) sum_l sgn(tau_l.x) sgn(tau_l.y).

    Lemma 3.2: E[lambda-hat] = theta/pi and Var[lambda-hat] = theta (pi - theta) / (n pi^2).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcasting against ``x``.
      num_sign_features: n >= 1.

    Returns:
      ``AngularCoefficientMoments`` of arrays of the broadcast batch shape.

    Examples:
      >>> moments = angular_coefficient_moments(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), 10)
      >>> round(float(moments.mean), 6), round(float(moments.variance), 6)  # 1/2, 1/40
      (0.5, 0.025)

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 19, Lemma 3.2, Theorem D.1.
    """
    n = check_int("num_sign_features", num_sign_features, minimum=1)
    x, y = _inputs.point_pair(x, y)
    return _moments_from_angle(_angle(x, y), n)


def angular_hybrid_mse(
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    num_sign_features: int,
    *,
    variant: Variant = "independent",
) -> jax.Array:
    """MSE of the angular hybrid estimator (HRF Theorem 3.1, Eq. 22-23).

    Variant I (``"independent"`` projections for SM-hat^{++} and SM-hat^{trig}):

      MSE = E[lambda-hat^2] MSE(SM-hat^{++}_m) + E[(1 - lambda-hat)^2] MSE(SM-hat^{trig}_m).  (22)

    Variant II (``"shared"``: the same w_1..w_m for both):

      MSE = (22) + (2/m) E[lambda-hat (1 - lambda-hat)] SM^2 (cos(|x|^2 - |y|^2) - 1) <= (22),

    from Cov(SM-hat^{++}, SM-hat^{trig}) = SM^2 (cos(|x|^2 - |y|^2) - 1)/m. The variants agree for
    |x| = |y|.

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcasting against ``x``.
      num_features: m >= 1 projections per base estimator.
      num_sign_features: n >= 1 projections of the coefficient.
      variant: ``"independent"`` or ``"shared"``.

    Returns:
      Array of the broadcast batch shape.

    Examples:
      >>> x = jnp.array([0.6, 0.0]); y = jnp.array([0.3, 0.4])
      >>> grad = jax.grad(lambda s: angular_hybrid_mse(s * x, s * y, 8, 4))(1.0)
      >>> bool(jnp.isfinite(grad))
      True

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Theorem 3.1, App. C-D (Eq. 31, 38, 45-47).
    """
    variant = check_choice("variant", variant, VARIANTS)
    m = _inputs.feature_count(num_features)
    n = check_int("num_sign_features", num_sign_features, minimum=1)
    x, y = _inputs.point_pair(x, y)
    moments = _moments_from_angle(_angle(x, y), n)
    mse = moments.second_moment * positive_antithetic_mse(
        x, y, m
    ) + moments.complement_second_moment * trigonometric_mse(x, y, m)
    if variant == "shared":
        sm2 = jnp.exp(2 * jnp.sum(x * y, axis=-1))
        covariance = sm2 * (jnp.cos(_sq(x) - _sq(y)) - 1.0) / m
        mse = mse + 2.0 * moments.cross_moment * covariance
    return mse


def _sphere_args(theta: ArrayLike, radius: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Validated angle(s) in [0, pi] and radii >= 0 (ranges checked when concrete), broadcast."""
    theta = _inputs.real_array("theta", theta)
    radius = _inputs.real_array("radius", radius)
    if is_concrete(theta) and (bool(jnp.any(theta < 0)) or bool(jnp.any(theta > math.pi))):
        raise ValueError(f"theta must lie in [0, pi], got {theta}")
    if is_concrete(radius) and bool(jnp.any(radius < 0)):
        raise ValueError(f"radius must be >= 0, got {radius}")
    theta, radius = jnp.broadcast_arrays(theta, radius)
    return theta, radius


def trigonometric_relative_error(
    theta: ArrayLike, radius: ArrayLike, num_features: int
) -> jax.Array:
    """Relative error sqrt(MSE)/SM of SM-hat^{trig}_m on the sphere S(r) (HRF Lemma 3.4, Eq. 25).

      epsilon_{theta, r}(trig) = sqrt(2/m) sinh(r^2 (1 - cos theta)),

    zero at theta = 0, maximal sqrt(2/m) sinh(2 r^2) at theta = pi.

    Args:
      theta: angle(s) in [0, pi].
      radius: r >= 0 (broadcasts against ``theta``).
      num_features: m >= 1.

    Returns:
      Array of the broadcast shape.

    Examples:
      >>> round(float(trigonometric_relative_error(math.pi / 2, 1.0, 8)), 6)  # sinh(1) / 2
      0.587601

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Definition 3.3, Lemma 3.4.
    """
    m = _inputs.feature_count(num_features)
    theta, radius = _sphere_args(theta, radius)
    return math.sqrt(2 / m) * jnp.sinh(radius**2 * (1 - jnp.cos(theta)))


def positive_relative_error(theta: ArrayLike, radius: ArrayLike, num_features: int) -> jax.Array:
    """Relative error of SM-hat^{++}_m on S(r) (HRF Lemma 3.4, Eq. 25).

      epsilon_{theta, r}(++) = sqrt(2/m) sinh(r^2 (1 + cos theta))  (= trig at pi - theta).

    Args:
      theta: angle(s) in [0, pi].
      radius: r >= 0.
      num_features: m >= 1.

    Returns:
      Array of the broadcast shape.

    Examples:
      >>> round(float(positive_relative_error(math.pi / 2, 1.0, 8)), 6)  # = trig at pi/2
      0.587601

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 3.4.
    """
    m = _inputs.feature_count(num_features)
    theta, radius = _sphere_args(theta, radius)
    return math.sqrt(2 / m) * jnp.sinh(radius**2 * (1 + jnp.cos(theta)))


def max_relative_error(radius: ArrayLike, num_features: int) -> jax.Array:
    """Max-relative-error of SM-hat^{trig}_m and SM-hat^{++}_m over S(r): sqrt(2/m) sinh(2 r^2).

    Equal for both estimators (Lemma 3.4, Eq. 25-26); it grows like e^{2 r^2} / sqrt(2m).

    Examples:
      >>> round(float(max_relative_error(1.0, 8)), 6)  # sinh(2) / 2
      1.81343

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 3.4, Eq. 26.
    """
    m = _inputs.feature_count(num_features)
    _, radius = _sphere_args(0.0, radius)
    return math.sqrt(2 / m) * jnp.sinh(2 * radius**2)


def angular_hybrid_relative_error(
    theta: ArrayLike, radius: ArrayLike, num_features: int, num_sign_features: int
) -> jax.Array:
    """Exact per-angle relative error of the angular hybrid on S(r) (HRF Theorem 3.5, Eq. 27).

      epsilon^2 = (2/m) [E lambda-hat^2 sinh^2(r^2 (1 + cos theta))
                         + E (1 - lambda-hat)^2 sinh^2(r^2 (1 - cos theta))],

    with the moments of Lemma 3.2; both variants (equal norms). It vanishes at theta = 0 and pi
    (like sqrt(2/(m n pi)) sinh(2 r^2) sqrt(theta) near 0). The paper's explicit upper bound
    was not recovered (docs/maths/hybrid.md, Eq. 27); this is the exact expression it bounds.

    Args:
      theta: angle(s) in [0, pi].
      radius: r >= 0.
      num_features: m >= 1.
      num_sign_features: n >= 1.

    Returns:
      Array of the broadcast shape.

    Examples:
      >>> float(angular_hybrid_relative_error(0.0, 1.0, 8, 4))  # exact at theta = 0
      0.0

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Theorem 3.5, Eq. 22, 24, 25.
    """
    m = _inputs.feature_count(num_features)
    n = check_int("num_sign_features", num_sign_features, minimum=1)
    theta, radius = _sphere_args(theta, radius)
    moments = _moments_from_angle(theta, n)
    positive = jnp.sinh(radius**2 * (1 + jnp.cos(theta))) ** 2
    trigonometric = jnp.sinh(radius**2 * (1 - jnp.cos(theta))) ** 2
    return jnp.sqrt(
        2
        / m
        * (moments.second_moment * positive + moments.complement_second_moment * trigonometric)
    )
