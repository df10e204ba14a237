"""Complex-exponential (CE) random features for the softmax kernel (HRF Sec. 2.3, Eq. 13-16).

For any invertible A in C^{d x d} and w ~ N(0, I_d), Lemma 2.4 (E[exp(w.c)] = exp((c)^2 / 2) for
complex c, with the *bilinear* square (c)^2 = sum_i c_i^2) gives

  SM(x, y) = E[ exp(w.Ax - (Ax)^2/2) exp(w.A^{-T}y - (A^{-T}y)^2/2) ]                  (Eq. 14)

so Psi_A(x) = m^{-1/2} (exp(w_i.Ax - (Ax)^2/2))_i and SM-hat_A = Psi_A(x)^T Psi_{A^{-T}}(y)
(Eq. 15-16, bilinear: no conjugation). The query and key sides use different matrices (A and
A^{-T}): the estimator is asymmetric. Only its real part is kept (the imaginary part has mean 0),
through Re(a^T b) = [Re a; Im a]^T [Re b; -Im b].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rfjax._validation import check_choice, check_inputs, is_concrete
from rfjax.features._common import check_projection
from rfjax.features._protocol import SIDES, Side
from rfjax.projections import Projection


def check_side(side: object) -> Side:
    """Returns ``side`` if it is ``"query"`` or ``"key"``, else raises."""
    return check_choice("side", side, SIDES)


def check_matrix(matrix: object, dim: int, dtype: jnp.dtype) -> jax.Array:
    """Validates a CE matrix: ``(dim, dim)`` dense or ``(dim,)`` diagonal, real or complex.

    When the values are concrete (outside ``jit``), a matrix whose condition number exceeds
    1/eps of ``dtype`` (numerically singular at that precision) is rejected.
    """
    matrix = jnp.asarray(matrix)
    if not (
        jnp.issubdtype(matrix.dtype, jnp.floating)
        or jnp.issubdtype(matrix.dtype, jnp.complexfloating)
    ):
        raise TypeError(
            f"matrix must be a real or complex floating array, got dtype {matrix.dtype}"
        )
    if matrix.shape not in ((dim, dim), (dim,)):
        raise ValueError(
            f"matrix must have shape (d, d) = ({dim}, {dim}) or, for a diagonal matrix, "
            f"(d,) = ({dim},); got {matrix.shape}"
        )
    if is_concrete(matrix):
        values = np.asarray(matrix, dtype=np.complex128)
        if not np.all(np.isfinite(values)):
            raise ValueError("matrix must contain only finite values (no NaN or inf)")
        if matrix.ndim == 1:
            magnitudes = np.abs(values)
            smallest = magnitudes.min()
            condition = magnitudes.max() / smallest if smallest > 0 else math.inf
        else:
            condition = float(np.linalg.cond(values))
        limit = 1.0 / float(jnp.finfo(dtype).eps)
        if not condition < limit:
            raise ValueError(
                f"matrix must be invertible: its condition number is {condition:.3g}, not below "
                f"1/eps = {limit:.3g} for {jnp.dtype(dtype).name} inputs (singular or too "
                f"ill-conditioned for A^{{-T}})"
            )
    return matrix


def transform(
    x: jax.Array, matrix: jax.Array, side: Side, *, diagonal: bool
) -> tuple[jax.Array, jax.Array | None]:
    """u = A x (query) or A^{-T} x (key) as real and imaginary parts (``None`` for real A).

    ``matrix`` is A ``(d, d)``, or with ``diagonal=True`` its diagonal alpha ``(..., d)``
    (leading axes broadcast against ``x``'s). Computed in at least float32.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x = x.astype(compute)
    if diagonal:  # A x = alpha * x, A^{-T} y = y / alpha
        u = x * matrix if side == "query" else x / matrix
    elif side == "query":
        u = x @ matrix.T
    else:
        u = x @ jnp.linalg.inv(matrix)  # (A^{-T} y)^T = y^T A^{-1}
    if jnp.issubdtype(u.dtype, jnp.complexfloating):
        return jnp.real(u).astype(compute), jnp.imag(u).astype(compute)
    return u.astype(compute), None


def features_from_transformed(
    real: jax.Array,
    imag: jax.Array | None,
    projection: Projection,
    side: Side,
    dtype: jnp.dtype,
) -> jax.Array:
    """Real CE features of u = real + i imag (already transformed by A or A^{-T}).

    Psi(u) = m^{-1/2} exp(w.u - (u)^2/2) has modulus exp(W real - (|real|^2 - |imag|^2)/2) / sqrt(m)
    and phase W imag - real.imag. Returns ``[Re Psi, +-Im Psi]`` (sign + for the query, - for the
    key), or ``Re Psi`` alone when ``imag`` is ``None``.
    """
    num_features = projection.num_features
    log_modulus = projection(real) - 0.5 * jnp.sum(real * real, axis=-1, keepdims=True)
    log_modulus = log_modulus - 0.5 * math.log(num_features)
    if imag is None:
        return jnp.exp(log_modulus).astype(dtype)
    log_modulus = log_modulus + 0.5 * jnp.sum(imag * imag, axis=-1, keepdims=True)
    phase = projection(imag) - jnp.sum(real * imag, axis=-1, keepdims=True)
    modulus = jnp.exp(log_modulus)
    sign = 1.0 if side == "query" else -1.0
    return jnp.concatenate([modulus * jnp.cos(phase), sign * modulus * jnp.sin(phase)], -1).astype(
        dtype
    )


def complex_exponential_features(
    x: jax.Array, projection: Projection, matrix: jax.Array, *, side: Side
) -> jax.Array:
    """Real-valued complex-exponential features for the softmax kernel SM(x, y) = exp(x.y).

    With Psi_B(u) = m^{-1/2} (exp(w_i.Bu - (Bu)^2/2))_{i=1..m} ((c)^2 = sum_k c_k^2, bilinear):

      query: Phi(x)  = [Re Psi_A(x);      Im Psi_A(x)]        (width 2m),
      key:   Phi'(y) = [Re Psi_{A^-T}(y); -Im Psi_{A^-T}(y)]   (width 2m),

    so Phi(x).Phi'(y) = Re(Psi_A(x)^T Psi_{A^-T}(y)), unbiased for SM(x, y) for every invertible
    A (HRF Eq. 14-16) and every coupling whose rows are marginally N(0, I_d). For a *real* A the
    imaginary parts vanish and only the real half is returned (width m); A = I then gives the
    plain positive features, and A = iI (complex) reproduces the trigonometric estimate exactly.
    The estimate has zero variance when Ax + A^{-T}y = 0 (Eq. 17); its MSE is
    ``rfjax.theory.complex_exponential_mse``.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      matrix: A, shape ``(d, d)``, or its diagonal ``(d,)`` for A = diag(alpha); real or
        complex. The key side uses A^{-T} (inverted here; 1/alpha for a diagonal).
      side: ``"query"`` (features of x, matrix A) or ``"key"`` (features of y, matrix A^{-T}).
        Pair query features with key features of the same A and projection.

    Returns:
      Features of shape ``(..., 2m)`` for complex A, ``(..., m)`` for real A, in ``x.dtype``.

    Raises:
      TypeError: if ``x`` or ``matrix`` is not floating/complex, or ``projection`` is not a
        ``Projection``.
      ValueError: for a bad ``side``, a matrix of the wrong shape, or (when ``matrix`` is
        concrete) a singular or ill-conditioned one (condition number >= 1/eps of ``x.dtype``).
        Under ``jit`` the condition number is not checked.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from rfjax import projections
      >>> w = projections.gaussian(jax.random.key(0), 3, 8)
      >>> a = jnp.eye(3) * (0.5 + 0.5j)
      >>> complex_exponential_features(jnp.ones((2, 3)), w, a, side="key").shape
      (2, 16)

    References:
      Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Lemma 2.4,
      Eq. 13-17; docs/maths/hybrid.md (real-valued implementation).
    """
    side = check_side(side)
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    matrix = check_matrix(matrix, projection.dim, x.dtype)
    real, imag = transform(x, matrix, side, diagonal=matrix.ndim == 1)
    return features_from_transformed(real, imag, projection, side, x.dtype)
