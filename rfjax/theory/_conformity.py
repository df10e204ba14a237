"""RF-conformity (SimRF paper Eq. 10) in closed form for i.i.d., orthogonal and simplex couplings.

rho(x, y) = 1/(m(m-1)) sum_{i != j} E[exp((w_i + w_j)^T (x + y))] depends on x, y only through
v = |x + y|. Every function here is a JAX function of ``v`` (and ``theta``): it runs under
``jit``, ``vmap`` and ``grad``, in float64 when ``jax_enable_x64`` is on (float32 otherwise), with
memory of a few arrays of the input's shape per evaluation, whatever v.

Accuracy (float64, against mpmath quadrature and the exact-arithmetic Eq. 24 series; see
``tests/rfjax/theory/test_theory.py``): relative error below 1e-12 for d in [2, 1024] and v in [0,
40] (``log_conformity`` to 1e-12 absolute where the value itself overflows, v >~ 26); supported up
to v = 100 (``_inputs.MAX_NORM_OF_SUM``), beyond which concrete inputs raise ``ValueError`` and
traced ones give NaN.

References:
  Reid et al. 2023, "Simplex Random Features", arXiv:2301.13856, Eq. 10, 19-24.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from numpy.typing import ArrayLike

from rfjax._validation import check_int
from rfjax.theory import _inputs, _kernels
from rfjax.theory._inputs import Coupling


def simplex_cosine(dim: int) -> float:
    """cos(theta) = -1/(d-1) between two rows of one simplex block (SimRF Eq. 9)."""
    return -1.0 / (dim - 1)


def log_block_conformity(coupling: Coupling, dim: int, v2: jax.Array) -> jax.Array:
    """log rho of two rows of one block as a function of v^2 (validated by the callers).

    Gaussian: v^2 (Eq. 19). Orthogonal: log 1F1(d; d/2; v^2/2) (Eq. 23). Simplex: Eq. 21 at
    cos(theta) = -1/(d-1) by the bracketed quadrature of ``_quadrature`` (equal to Eq. 24, whose
    alternating double series is not used: it loses ~(1 + 1/(d-1)) v^2 / ln 10 digits). Elements
    with v > ``MAX_NORM_OF_SUM`` are NaN.
    """
    if coupling == "gaussian":
        return v2
    if coupling == "orthogonal":
        return _kernels.log_orthogonal(dim, v2)
    return _kernels.log_at_angle(dim, v2, simplex_cosine(dim))


def _squared_norm(v: ArrayLike) -> jax.Array:
    """v^2 of a validated, in-range ``v`` (|x + y|)."""
    v = _inputs.real_array("v", v)
    v2 = v * v
    _inputs.check_norm("v", v2)
    return v2


def iid_conformity(v: ArrayLike) -> jax.Array:
    """RF-conformity of i.i.d. Gaussian projections: rho_IID = exp(v^2).

    For independent w_i, w_j ~ N(0, I_d), w_i + w_j ~ N(0, 2 I_d), so
    E[exp((w_i + w_j)^T (x + y))] = exp(|x + y|^2).

    Args:
      v: |x + y|, any shape.

    Returns:
      Array of the shape of ``v`` (float64 with x64 enabled, else float32).

    Raises:
      ValueError: if a concrete ``v`` holds NaN or infinity.

    Examples:
      >>> round(float(iid_conformity(1.0)), 6)
      2.718282

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 19.
    """
    v = _inputs.real_array("v", v)
    return jnp.exp(v * v)


def orthogonal_conformity(dim: int, v: ArrayLike) -> jax.Array:
    """RF-conformity of orthogonal random features (ORF): pairs at angle pi/2 with chi_d norms.

    rho_ORF = Gamma(d/2)/Gamma(d) sum_k (v^2/2)^k Gamma(k+d) / (k! Gamma(k+d/2))
            = 1F1(d; d/2; v^2/2).

    The series has positive terms; it is summed term by term in a ``lax.while_loop`` until a
    geometric bound on the tail is below rounding (about v^2/2 + 10 v terms), in scaled,
    compensated form (``_series``); derivatives come from d/dy 1F1(a; b; y) = (a/b)
    1F1(a+1; b+1; y).

    Args:
      dim: input dimension d >= 1.
      v: |x + y|, any shape, |v| <= 100.

    Returns:
      Array of the shape of ``v``.

    Examples:
      >>> round(float(orthogonal_conformity(6, 1.0)), 5)
      2.57956

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 23 (= Eq. 65).
    """
    return jnp.exp(log_conformity("orthogonal", dim, v))


def simplex_conformity(dim: int, v: ArrayLike) -> jax.Array:
    """RF-conformity of simplex random features (SimRF): pairs at angle arccos(-1/(d-1)).

    By Eq. 24 and, equivalently, Eq. 21::

      rho_SimRF = sqrt(pi) / (Gamma(d/2) 2^(d-1)) sum_k Gamma(k+d)/Gamma(k+d/2) (v^2/2)^k
                  sum_{p=0}^{k} (-1/(d-1))^p Gamma((d+p)/2)/Gamma((d+p+1)/2) / (p! (k-p)!)  (Eq. 24)
                = E_u[1F1(d; d/2; (v^2/2)(1 - sin(u)/(d-1)))], u ~ sin(u)^(d-1) on [0, pi/2]
                                                                                     (Eq. 21)

    The double series of Eq. 24 alternates in p and loses about (1 + 1/(d-1)) v^2 / ln(10)
    digits to cancellation (all of them by v ~ 6 for small d; it also needs O(v^4) terms), so
    the value is computed from Eq. 21 instead: the peak of the integrand is bracketed on two
    grids and integrated by Gauss-Legendre (``_quadrature``), with Kummer's M from its
    positive-term series. Relative error below 1e-12 for d in [2, 1024], v in [0, 40] (tested
    against mpmath); cost O(d + v^2) per node and memory O(1) per value.

    Args:
      dim: input dimension d >= 2.
      v: |x + y|, any shape, |v| <= 100.

    Returns:
      Array of the shape of ``v``.

    Raises:
      ValueError: if dim < 2, or a concrete ``v`` is not finite or exceeds 100.

    Examples:
      >>> round(float(simplex_conformity(6, 1.0)), 5)
      2.18183

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 21, 24 (= Eq. 63, 67).
    """
    return jnp.exp(log_conformity("simplex", dim, v))


def log_conformity(coupling: Coupling, dim: int, v: ArrayLike) -> jax.Array:
    """log of the RF-conformity of one block of the named coupling (finite where rho overflows).

    rho ~ e^{v^2} overflows float64 beyond v ~ 26; its log stays accurate (to ~1e-12 absolute
    for v <= 40) up to v = 100.

    Args:
      coupling: ``"gaussian"`` (Eq. 19), ``"orthogonal"`` (Eq. 23) or ``"simplex"`` (Eq. 24).
      dim: input dimension d (>= 2 for ``"simplex"``).
      v: |x + y|, any shape, |v| <= 100.

    Returns:
      Array of the shape of ``v``.

    Raises:
      ValueError: unknown coupling (``"simplex_plus"`` says why it has no closed form), bad
        ``dim``, or a concrete ``v`` that is not finite or exceeds 100.

    Examples:
      >>> round(float(log_conformity("simplex", 8, 18.0)), 3)  # rho ~ 2.6e69
      159.841

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10, 19, 21, 23, 24.
    """
    coupling = _inputs.coupling_name(coupling)
    dim = _inputs.dimension(dim, coupling)
    return log_block_conformity(coupling, dim, _squared_norm(v))


def conformity(coupling: Coupling, dim: int, v: ArrayLike) -> jax.Array:
    """RF-conformity of one block of the named coupling: exp(``log_conformity``).

    Args:
      coupling: ``"gaussian"`` (Eq. 19), ``"orthogonal"`` (Eq. 23) or ``"simplex"`` (Eq. 24); the
        names of the samplers in ``rfjax.projections``.
      dim: input dimension d (>= 2 for ``"simplex"``).
      v: |x + y|, any shape.

    Returns:
      Array of the shape of ``v``.

    Raises:
      ValueError: for a coupling without a closed form (the message lists the allowed ones and,
        for ``"simplex_plus"``, says why).

    Examples:
      >>> round(float(conformity("simplex", 6, 1.0)), 5)
      2.18183

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10, 19, 23, 24.
    """
    return jnp.exp(log_conformity(coupling, dim, v))


def conformity_at_angle(dim: int, v: ArrayLike, theta: ArrayLike) -> jax.Array:
    """RF-conformity of pairs with chi_d norms at a fixed angle theta, by quadrature of Eq. 21.

    rho_theta = 1/(2^(d-2) Gamma(d/2)) sum_k (v^2/2)^k Gamma(k+d)/(k! Gamma(k+d/2))
                int_0^{pi/2} (sin 2phi)^(d-1) (1 + sin 2phi cos theta)^k dphi.

    The sum over k is taken inside the integral, where it is Kummer's 1F1(d; d/2; .); the
    integrand's peak is bracketed and integrated by Gauss-Legendre (``_quadrature``).
    theta = pi/2 gives ``orthogonal_conformity`` and theta = arccos(-1/(d-1)) gives
    ``simplex_conformity``.

    Args:
      dim: input dimension d >= 1.
      v: |x + y|, |v| <= 100; broadcasts against ``theta``.
      theta: angle between the paired projection directions, in radians.

    Returns:
      Array of the broadcast shape of ``v`` and ``theta``.

    Examples:
      >>> round(float(conformity_at_angle(6, 1.0, 3.141592653589793 / 2)), 5)
      2.57956

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 21 (= Eq. 63) and Eq. 22.
    """
    dim = _inputs.dimension(dim)
    v2 = _squared_norm(v)
    cosine = jnp.cos(_inputs.real_array("theta", theta))
    return jnp.exp(_kernels.log_at_angle(dim, v2, cosine))


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
) -> jax.Array:
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
      Array of the broadcast shape.

    Examples:
      >>> round(float(effective_conformity(2.0, 0.0, (2, 2))), 6)  # 4 of 12 pairs in a block
      1.333333

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10-11 and footnote 2 (multi-block form derived in
      docs/maths/positive_features.md).
    """
    rho_block = _inputs.real_array("block_conformity", block_conformity)
    v = _inputs.real_array("v", v)
    sizes = _check_block_sizes(block_sizes)
    m = sum(sizes)
    iid = jnp.exp(v * v)
    if m < 2:
        return jnp.broadcast_to(iid, jnp.broadcast_shapes(iid.shape, rho_block.shape))
    weight = same_block_pairs(sizes) / (m * (m - 1))
    return weight * rho_block + (1.0 - weight) * iid
