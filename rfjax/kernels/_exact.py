"""Exact kernels: the oracles that random-feature estimates are checked against.

Every kernel takes ``x: (..., d)`` and ``y: (..., d)``, broadcasts their leading axes against each
other and returns ``(...)``. Inputs must be floating arrays (integers are rejected, not cast).
Options such as ``lengthscale``, ``order`` and ``coefficients`` are static Python values.

Zero-vector convention (angular and arc-cosine kernels): the angle between a zero vector and any
vector is taken to be pi/2 (cosine 0). Then ``angular`` is 0, ``arccos(order=0)`` is 1/2 and
``arccos(order >= 1)`` is 0 (the |x|^n |y|^n factor vanishes). The feature maps in
``rfjax.features`` (sign(0) = 0, step(0) = 1/2) reproduce exactly these values in expectation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from rfjax._validation import check_coefficients, check_inputs, check_order, check_real


def _check_pair(x: object, y: object) -> tuple[jax.Array, jax.Array]:
    """Validates ``x: (..., d)`` and ``y: (..., d)``: floating, same d, broadcastable batches."""
    x = check_inputs("x", x)
    y = check_inputs("y", y)
    _check_same_dim(x, y)
    try:
        jnp.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    except ValueError as err:
        raise ValueError(
            f"the leading axes of x {x.shape} and y {y.shape} must broadcast against each other"
        ) from err
    return x, y


def _check_same_dim(x: jax.Array, y: jax.Array) -> None:
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"x and y must have the same last axis (the input dimension d), got shapes "
            f"{x.shape} and {y.shape}"
        )


def _dot(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(x * y, axis=-1)


def gaussian(x: jax.Array, y: jax.Array, *, lengthscale: float = 1.0) -> jax.Array:
    """Gaussian (RBF) kernel K(x, y) = exp(-|x - y|^2 / (2 l^2)).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.
      lengthscale: l > 0 (the same as rescaling both inputs by 1/l).

    Returns:
      Kernel values, shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(gaussian(jnp.zeros(2), jnp.zeros(2)))
      1.0

    References:
      SimRF paper (Reid et al. 2023, arXiv:2301.13856) Eq. 4; docs/maths/positive_features.md.
    """
    x, y = _check_pair(x, y)
    lengthscale = check_real("lengthscale", lengthscale, positive=True)
    return jnp.exp(-_dot(x - y, x - y) / (2.0 * lengthscale**2))


def softmax(x: jax.Array, y: jax.Array) -> jax.Array:
    """Softmax kernel SM(x, y) = exp(x . y).

    For attention, exp(q . k / sqrt(d)) is SM(q d^{-1/4}, k d^{-1/4}).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.

    Returns:
      Kernel values, shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    References:
      SimRF paper Eq. 5; HRF paper (Choromanski et al. 2022, arXiv:2110.04367) Eq. 1.
    """
    x, y = _check_pair(x, y)
    return jnp.exp(_dot(x, y))


def linear(x: jax.Array, y: jax.Array) -> jax.Array:
    """Linear kernel K(x, y) = x . y (what a Johnson-Lindenstrauss projection estimates).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.

    Returns:
      Kernel values, shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    References:
      Choromanski & Fagan, structured matrices, Eq. 2 (identity f).
    """
    x, y = _check_pair(x, y)
    return _dot(x, y)


def _scaled(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(x / s, s) with s = max_i |x_i| (1 for a zero vector): |x| = s |x / s| and cosines of
    x / s, whose squared norms lie in [1, d], neither underflow nor overflow where |x|^2
    would (|x| = 1e-20 or 1e20 in float32)."""
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scale = jnp.where(scale == 0, 1, scale)  # NaN is not zero: a NaN input stays NaN
    return x / scale, scale[..., 0]


def _unit_norm(x: jax.Array) -> jax.Array:
    """|x| of a scaled ``x`` (``_scaled``: 0 or at least 1) by a masked square root, so
    gradients at a zero vector are finite (zero)."""
    squared = _dot(x, x)
    zero = squared == 0
    return jnp.where(zero, 0, jnp.sqrt(jnp.where(zero, 1, squared)))


def _norms_and_cosine(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """|x|, |y| and cos(theta) clipped into [-1, 1]; cos = 0 if either vector is zero.

    Formed from each vector over its largest entry (``_scaled``), so that the angle does not
    depend on the inputs' scale in floating point either; the norms use a masked square root,
    so gradients at a zero vector are finite (zero). NaN inputs give NaN (as in the other
    kernels), never the zero-vector value.
    """
    (unit_x, scale_x), (unit_y, scale_y) = _scaled(x), _scaled(y)
    norm_x, norm_y = _unit_norm(unit_x), _unit_norm(unit_y)
    denominator = norm_x * norm_y
    zero = denominator == 0
    cosine = _dot(unit_x, unit_y) / jnp.where(zero, 1, denominator)
    cosine = jnp.where(zero, 0, jnp.clip(cosine, -1.0, 1.0))
    return scale_x * norm_x, scale_y * norm_y, cosine


def angular(x: jax.Array, y: jax.Array) -> jax.Array:
    """Angular kernel K(x, y) = 1 - 2 theta / pi, theta the angle between x and y.

    It equals E[sign(w.x) sign(w.y)] for w ~ N(0, I_d). The cosine is clipped into [-1, 1]
    before ``arccos``; if either vector is zero, theta = pi/2 and the kernel is 0.

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.

    Returns:
      Kernel values in [-1, 1], shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    References:
      Choromanski & Fagan, structured matrices, Eq. 2 (f = sgn); docs/maths/structured.md.
    """
    x, y = _check_pair(x, y)
    _, _, cosine = _norms_and_cosine(x, y)
    return 1.0 - 2.0 * jnp.arccos(cosine) / math.pi


def arccos(x: jax.Array, y: jax.Array, *, order: int) -> jax.Array:
    """Arc-cosine kernel of Cho & Saul, k_n(x, y) = (1/pi) |x|^n |y|^n J_n(theta).

    J_0 = pi - theta, J_1 = sin t + (pi - t) cos t, J_2 = 3 sin t cos t + (pi - t)(1 + 2 cos^2 t).
    Equivalently k_n = 2 E[step(w.x) step(w.y) (w.x)^n (w.y)^n] with w ~ N(0, I_d). The cosine is
    clipped into [-1, 1]; if either vector is zero, theta = pi/2 (so k_0 = 1/2, k_1 = k_2 = 0).

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.
      order: n in {0, 1, 2}.

    Returns:
      Kernel values, shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    Raises:
      ValueError: if ``order`` is not 0, 1 or 2.

    References:
      Cho & Saul, "Kernel Methods for Deep Learning", NeurIPS 2009; Choromanski & Fagan,
      structured matrices, Eq. 2 examples (docs/maths/structured.md).
    """
    x, y = _check_pair(x, y)
    order = check_order(order)
    norm_x, norm_y, cosine = _norms_and_cosine(x, y)
    angular_part = _arccos_angular_part(order, cosine) if order else _arccos_j(0, cosine)
    return (norm_x * norm_y) ** order * angular_part / math.pi


def _arccos_j(order: int, cosine: jax.Array) -> jax.Array:
    """Cho & Saul's J_n as a function of c = cos(theta)."""
    theta = jnp.arccos(cosine)
    sine = jnp.sqrt(jnp.maximum(1.0 - cosine**2, 0.0))
    rest = math.pi - theta
    if order == 0:
        return rest
    if order == 1:
        return sine + rest * cosine
    return 3.0 * sine * cosine + rest * (1.0 + 2.0 * cosine**2)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _arccos_angular_part(order: int, cosine: jax.Array) -> jax.Array:
    """J_n(c) for n >= 1, differentiated by dJ_1/dc = J_0 and dJ_2/dc = 4 J_1: finite at
    c = +-1 (x parallel to y), where the derivatives of arccos and of sqrt(1 - c^2) are
    infinite and cancel (autodiff gave inf - inf, a NaN gradient of the kernel at x = y and so
    of every Gram matrix with a diagonal). J_0 = pi - theta has no derivative there."""
    return _arccos_j(order, cosine)


@_arccos_angular_part.defjvp
def _arccos_angular_part_jvp(
    order: int, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    (cosine,), (tangent,) = primals, tangents
    derivative = _arccos_j(0, cosine) if order == 1 else 4.0 * _arccos_j(1, cosine)
    return _arccos_angular_part(order, cosine), derivative * tangent


def polynomial(x: jax.Array, y: jax.Array, *, coefficients: Sequence[float]) -> jax.Array:
    """Polynomial kernel K(x, y) = sum_{i=1}^l c_i (x . y)^i, c_i >= 0.

    Args:
      x: inputs, shape ``(..., d)``.
      y: inputs, shape ``(..., d)``, broadcastable against ``x``.
      coefficients: (c_1, ..., c_l), l >= 1, each finite and >= 0 (static).

    Returns:
      Kernel values, shape ``broadcast(x.shape[:-1], y.shape[:-1])``.

    Raises:
      ValueError: if ``coefficients`` is empty, not 1-D, or has a negative or non-finite entry.

    References:
      Kakade, lecture notes on random features, polynomial kernels (as corrected in
      docs/maths/fourier_features.md, other kernels).
    """
    x, y = _check_pair(x, y)
    coefficients = check_coefficients(coefficients)
    inner = _dot(x, y)
    total = jnp.zeros_like(inner)
    for c in reversed(coefficients):  # Horner: s (c_1 + s (c_2 + ... + s c_l))
        total = inner * (c + total)
    return total


def gram(
    kernel_fn: Callable[..., jax.Array], x: jax.Array, y: jax.Array, **kwargs: object
) -> jax.Array:
    """The Gram matrix G[i, j] = kernel_fn(x[i], y[j]).

    This is the one way to form exact Gram matrices: it broadcasts ``x[:, None, :]`` against
    ``y[None, :, :]``, so it costs O(n k d) memory for the differences of the Gaussian kernel.
    (For random-feature estimates use ``features_x @ features_y.T``.)

    Args:
      kernel_fn: one of the kernels of this module (or any function with the same broadcasting
        contract).
      x: inputs, shape ``(n, d)``.
      y: inputs, shape ``(k, d)``.
      **kwargs: keyword options of ``kernel_fn`` (``lengthscale``, ``order``, ``coefficients``).

    Returns:
      The Gram matrix, shape ``(n, k)``.

    Raises:
      TypeError: if ``kernel_fn`` is not callable or the inputs are not floating.
      ValueError: if ``x`` or ``y`` is not 2-D or their last axes differ.

    Examples:
      >>> import jax.numpy as jnp
      >>> gram(gaussian, jnp.zeros((3, 2)), jnp.ones((4, 2)), lengthscale=2.0).shape
      (3, 4)
    """
    if not callable(kernel_fn):
        raise TypeError(f"kernel_fn must be callable, got {type(kernel_fn).__name__}")
    x = check_inputs("x", x)
    y = check_inputs("y", y)
    _check_same_dim(x, y)
    for name, value in (("x", x), ("y", y)):
        if value.ndim != 2:
            raise ValueError(f"{name} must have shape (num_points, dim), got {value.shape}")
    return kernel_fn(x[:, None, :], y[None, :, :], **kwargs)
