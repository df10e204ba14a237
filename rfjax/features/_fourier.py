"""Fourier-type feature maps: sin/cos random Fourier features, cos + offset, trigonometric softmax.

Sin/cos maps lay out their output as ``[sin(Wx), cos(Wx)]`` (all sines, then all cosines; HRF
Eq. 2). The SimRF paper's Eq. 3 interleaves the pairs instead; the estimate phi(x).phi(y) is the
same.
"""

from __future__ import annotations

import abc
import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import (
    as_array,
    check_array_size,
    check_finite,
    check_float_dtype,
    check_int,
    check_key,
    is_concrete,
)
from rfjax.features._common import check_projection, pointwise_features, project
from rfjax.features._protocol import FeatureMap, ScaledFeatures, Side
from rfjax.ops import shifted_cos, sin_cos
from rfjax.projections import Projection


def fourier_features(
    x: jax.Array, projection: Projection, *, lengthscale: float = 1.0
) -> jax.Array:
    """Random Fourier features (sin/cos) for the Gaussian kernel.

    phi(x) = (1/sqrt(m)) [sin(W x / l), cos(W x / l)], so that
    phi(x).phi(y) = (1/m) sum_i cos(w_i.(x - y) / l), an unbiased estimate of
    K(x, y) = exp(-|x - y|^2 / (2 l^2)) for every coupling whose rows are marginally N(0, I_d)
    (Bochner's theorem). IID MSE: (1 - K^2)^2 / (2m) (SimRF Eq. 3).

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m = ``num_features`` rows.
      lengthscale: l > 0 (static).

    Returns:
      Features of shape ``(..., 2m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim`` or ``lengthscale <= 0``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.orthogonal(jax.random.key(0), 4, 8)
      >>> fourier_features(jax.numpy.ones((2, 4)), w).shape
      (2, 16)

    References:
      Rahimi & Recht, "Random Features for Large-Scale Kernel Machines", NeurIPS 2007;
      Sutherland & Schneider, "On the Error of Random Fourier Features", UAI 2015,
      arXiv:1506.02785 (phi); Reid et al. 2023, arXiv:2301.13856, Eq. 3.
    """
    _, projected = project(x, projection, lengthscale=lengthscale)
    return sin_cos(projected, scale=math.sqrt(1.0 / projected.shape[-1]))


def random_offsets(
    key: jax.Array, num_features: int, *, dtype: DTypeLike = jnp.float32
) -> jax.Array:
    """Phase offsets b_i ~ U[0, 2 pi) for ``cosine_features``.

    Args:
      key: a PRNG key.
      num_features: m >= 1, the number of projection vectors they go with.
      dtype: floating dtype.

    Returns:
      Offsets of shape ``(m,)``.
    """
    check_key("key", key)
    num_features = check_int("num_features", num_features, minimum=1)
    dtype = check_float_dtype("dtype", dtype)
    check_array_size("the offsets", (num_features,), dtype, {"num_features": num_features})
    return jax.random.uniform(key, (num_features,), dtype, minval=0.0, maxval=2.0 * math.pi)


def cosine_features(
    x: jax.Array, projection: Projection, offsets: jax.Array, *, lengthscale: float = 1.0
) -> jax.Array:
    """Single-cosine random Fourier features psi for the Gaussian kernel.

    psi(x) = sqrt(2/m) cos(W x / l + b), b_i ~ U[0, 2 pi) independent of W, so that
    E[psi(x).psi(y)] = exp(-|x - y|^2 / (2 l^2)). Its variance,
    (1/m)[1 + K(2 Delta)/2 - K(Delta)^2], is worse than that of ``fourier_features`` at the
    same number of projections m (and at the same output width); prefer ``fourier_features``.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      offsets: b, shape ``(m,)``, from ``random_offsets`` (with a key independent of W's).
      lengthscale: l > 0 (static).

    Returns:
      Features of shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` or ``offsets`` is not floating, or ``projection`` is not a
        ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim`` or ``offsets.shape != (m,)``, or (outside
        ``jit``) ``offsets`` holds NaN or infinity.

    References:
      Rahimi & Recht 2007; Sutherland & Schneider 2015, arXiv:1506.02785 (psi and both
      variances); docs/maths/fourier_features.md.
    """
    projection = check_projection(projection)
    offsets = as_array("offsets", offsets)
    if not jnp.issubdtype(offsets.dtype, jnp.floating):
        raise TypeError(f"offsets must be a floating array, got dtype {offsets.dtype}")
    if offsets.shape != (projection.num_features,):
        raise ValueError(
            f"offsets must have shape (num_features,) = "
            f"({projection.num_features},), got {offsets.shape}"
        )
    check_finite("offsets", offsets)
    return pointwise_features(
        x, projection, lambda z: shifted_cos(z + offsets), multiplier=2.0, lengthscale=lengthscale
    )


def trigonometric_features(x: jax.Array, projection: Projection) -> jax.Array:
    """Trigonometric random features for the softmax kernel SM(x, y) = exp(x.y).

    phi(x) = (e^{|x|^2/2} / sqrt(m)) [sin(W x), cos(W x)], so that
    phi(x).phi(y) = e^{(|x|^2 + |y|^2)/2} (1/m) sum_i cos(w_i.(x - y)), unbiased for SM(x, y).
    The estimate is exact when x == y; its relative error grows where x and y point apart
    (HRF Lemma 3.4). Features can be negative and grow like e^{|x|^2/2}: they are finite for
    |x| < sqrt(2 log(max) + log m) (``representable_norm``: 13.5 in float32, 37.7 in float64
    at m = 128); beyond it use the map's log-space form (``TrigonometricFeatureMap``'s
    ``scaled_features``, as attention does), since the kernel e^{x.y} itself overflows there.

    Args:
      x: inputs, shape ``(..., d)``, floating (for attention, scale by d^{-1/4} first).
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.

    Returns:
      Features of shape ``(..., 2m)``; inside ``jit``, +-inf (never NaN) where they overflow.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim``, or (outside ``jit``) if a finite input
        row's features overflow the dtype (``exponentiated``), naming the largest |x|.

    References:
      Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Eq. 2.
    """
    log_scale, sin_cos = trigonometric_parts(x, projection)
    scaled = shift_log_scale(log_scale, sin_cos)
    return exponentiated("trigonometric_features", scaled, x, projection.num_features)


def representable_norm(num_features: int, dtype: DTypeLike) -> float:
    """The largest |x| whose factor e^{|x|^2/2 - log(m)/2} (trigonometric features and the
    hybrids' trigonometric base) is finite in ``dtype``: sqrt(2 log(max) + log m)."""
    return math.sqrt(2.0 * math.log(float(jnp.finfo(dtype).max)) + math.log(num_features))


def exponentiated(name: str, scaled: ScaledFeatures, x: jax.Array, num_features: int) -> jax.Array:
    """``scaled.unscaled()``: features psi e^s whose factor e^s can overflow (e^{|x|^2/2}).

    Outside ``jit``, a finite input row whose features overflow raises ``ValueError`` naming
    ``name``, the largest |x| and the representable one (``representable_norm`` for the m =
    ``num_features`` projections); inside, those entries are +-inf, never NaN."""
    phi, x = scaled.unscaled(), jnp.asarray(x)
    finite_rows = jnp.all(jnp.isfinite(x), axis=-1)
    overflows = jnp.any(jnp.isinf(phi), axis=-1) & finite_rows
    if is_concrete(overflows) and bool(jnp.any(overflows)):
        norms = jnp.linalg.norm(jnp.where(overflows[..., None], x, 0), axis=-1)
        largest, bound = float(jnp.max(norms)), representable_norm(num_features, phi.dtype)
        cause = (
            f"they carry e^(|x|^2/2), finite for |x| < {bound:.4g} here"
            if largest >= bound
            else f"e^(|x|^2/2) is finite for |x| < {bound:.4g} here, so another factor is "
            f"not: a hybrid's positive base e^(w.x - |x|^2/2) reaches e^(|w|^2/2) for a long "
            f"projection row w (|w|^2 > 2 ln(max), as at large d)"
        )
        raise ValueError(
            f"{name}: inputs with |x| up to {largest:.4g} give features beyond {phi.dtype}'s "
            f"range: {cause}; use the map's log-space form (FeatureMap.scaled_features, as "
            f"attention does) or smaller inputs"
        )
    return phi


def trigonometric_parts(x: jax.Array, projection: Projection) -> tuple[jax.Array, jax.Array]:
    """``trigonometric_features`` as (log-scale a (...), [sin, cos](W x) (..., 2m)):
    phi(x) = e^a [sin, cos](W x), a = |x|^2 / 2 - log(m) / 2, so that callers can shift a before
    the ``exp`` (e^a overflows float32 from |x| ~ 13, float64 from ~ 37)."""
    x, projected = project(x, projection)
    log_scale = 0.5 * jnp.sum(x * x, axis=-1) - 0.5 * math.log(projected.shape[-1])
    return log_scale, sin_cos(projected)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FourierFeatureMap(FeatureMap):
    """Random Fourier features (sin/cos) of the Gaussian kernel as a ``FeatureMap``: both sides
    ``fourier_features(x, projection)`` (width 2m). Registered as ``"fourier"``.

    The features are signed: in normalised attention a row's normaliser can be <= 0, and
    FAVOR's default floor for signed maps (``eps`` = 1e-3) clips such rows (safe ranges:
    docs/maths/attention.md).
    """

    needs_denominator_floor = True

    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        del side  # symmetric
        return fourier_features(x, projection)


class LogScaledFeatureMap(FeatureMap):
    """A map given by its log-space form (psi, s) (``scaled_features``, for maps whose factor
    e^s can overflow): ``features`` is psi e^s, refusing rows that overflow outside ``jit``
    (``exponentiated``)."""

    @abc.abstractmethod
    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        """(psi, s) with phi = psi exp(s)."""

    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        scaled = self.scaled_features(x, projection, side=side)
        return exponentiated(type(self).__name__, scaled, x, projection.num_features)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrigonometricFeatureMap(LogScaledFeatureMap):
    """Trigonometric softmax features (HRF Eq. 2) as a ``FeatureMap``: both sides
    ``trigonometric_features(x, projection)`` = e^{|x|^2/2} [sin, cos](W x) / sqrt(m) (width 2m).
    Registered as ``"trigonometric"``.

    Log-space form (both sides): psi(x) = [sin, cos](W x) / sqrt(m) with log-scale
    s(x) = |x|^2 / 2, so phi = psi e^s never overflows: attention drops the query factor (it
    cancels in normalised attention) and shifts the keys' by their running maximum, as for the
    positive maps (the factor e^{|x|^2/2} overflows float32 from |x| ~ 13, i.e. |q| ~ 38 at
    H = 64 after the data normaliser). ``features`` (phi itself) is finite for |x| <
    ``representable_norm`` (13.5 in float32 at m = 128) and raises beyond it outside ``jit``.
    The features are signed, so a row's normaliser can be <= 0: FAVOR's default floor for
    signed maps (``eps`` = 1e-3) clips such rows, finite but biased; the estimate is reliable
    for bounded inputs (safe ranges: docs/maths/attention.md).

    References:
      Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Eq. 2.
    """

    needs_denominator_floor = True

    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        del side  # symmetric
        log_scale, sin_cos = trigonometric_parts(x, projection)
        return shift_log_scale(log_scale, sin_cos)


def shift_log_scale(
    log_scale: jax.Array, features: jax.Array, shift: jax.Array | None = None
) -> ScaledFeatures:
    """phi = e^a features (a: ``log_scale`` (...), features (..., width)) in log-space form
    (psi, s): s = ``shift`` (default a), a constant under differentiation, and
    psi = e^{a - s} features, which carries phi's gradient."""
    constant = jax.lax.stop_gradient(log_scale if shift is None else shift)
    return ScaledFeatures(jnp.exp(log_scale - constant)[..., None] * features, constant)
