"""Dense-exponential random features (DERF; FAVOR#), Likhosherstov et al. 2023, arXiv:2302.00787.

DERF (the paper's DERF definition) replace GERF's scalars by matrices: with w ~ N(0, I_d),

  f_q(w, x) = D exp(w^T A w + w^T B_q x + x^T C_q x),  f_k(w, y) = D exp(w^T A w + w^T B_k y
  + y^T C_k y),  A symmetric, Q = I - 4A positive definite.

Derivation of the constraints (as in the paper's unbiasedness theorem). The Gaussian integral
E[exp(w^T (2A) w + w^T u)] = det(Q)^{-1/2} exp(u^T Q^{-1} u / 2) with u = B_q x + B_k y makes
E[f_q f_k] = exp(x.y) for all x, y iff B_q^T Q^{-1} B_k = I, C_q = -B_q^T Q^{-1} B_q / 2,
C_k = -B_k^T Q^{-1} B_k / 2 and D = det(Q)^{1/4}. Every solution is
B_q = Q^{1/2} Phi, B_k = Q^{1/2} Phi^{-T} for an invertible Phi (then C_q = -Phi^T Phi / 2): DERF
is GERF with a matrix A applied to x' = Phi x and y' = Phi^{-T} y (x'.y' = x.y). With
Q = U diag(q) U^T and nu = U^T w, z = U^T x', the log-features are

  log f(w, x) = (|nu|^2 - sum_l q_l nu_l^2) / 4 + sum_l sqrt(q_l) nu_l z_l - |z|^2 / 2
                + sum_l log(q_l) / 4                                    (minus log(m)/2).

Second moment (finite iff 2Q - I > 0, i.e. I - 8A > 0): E[(f_q f_k)^2] = det Q det(2Q - I)^{-1/2}
exp(sum_l (2 q_l / (2 q_l - 1)) (z_x + z_y)_l^2 - |z_x|^2 - |z_y|^2)
(``rfjax.theory.dense_exponential_variance``).

Optimal parameters (the paper's closed-form optima). Averaged over all query-key pairs, the log
second moment is
log det(I + T) - log det(T) / 2 + tr(T^{-1} S) + const with T = 2Q - I = I - 8A and
S = mean_{i,j} (x'_i + y'_j)(x'_i + y'_j)^T = Phi M_q Phi^T + Phi^{-T} M_k Phi^{-1}
+ Phi xbar ybar^T Phi^{-1} + (its transpose). For a fixed Phi its stationary point shares S's
eigenvectors U, with each eigenvalue t_l of T the positive root of
t^2 - (1 + 2 sigma_l) t - 2 sigma_l = 0 (sigma_l the eigenvalues of S), the OPRF equation per
direction. The variants differ in Phi:

* ``"symmetric"`` (SDERF): Phi = I (B_q = B_k, the same features on both sides);
* ``"asymmetric"`` (ADERF): Phi = P^{1/2} with P the matrix geometric mean
  M_q^{-1} # M_k = M_q^{-1/2} (M_q^{1/2} M_k M_q^{1/2})^{1/2} M_q^{-1/2}, the minimiser of
  tr S over Phi (it balances Phi M_q Phi^T = Phi^{-T} M_k Phi^{-1}). This Phi is a closed-form
  choice, not the exact minimiser over Phi of the full objective; the scales are then exactly
  optimal for it.
* ``"simplified"`` (SADERF, FAVOR#): A = alpha I scalar and Phi = diag(psi) with
  psi_l = (M_k[l, l] / M_q[l, l])^{1/4}, which minimises phi' = mean |x' + y'|^2
  = 2 sum_l sqrt(M_q[l, l] M_k[l, l]) + 2 xbar.ybar over diagonal Phi; alpha is the OPRF optimum
  for phi' (the scalar objective is increasing in phi', so this is the exact optimum over
  scalar A and diagonal Phi). It costs O(d) per input beyond FAVOR+'s projection.

Second moments are regularised by ``ridge * tr(M)/d * I`` (``ridge * I`` for a zero moment)
before they are inverted (the asymmetric and simplified variants), so fewer points than
dimensions, or points all at the origin, do not give infinities.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from rfjax._validation import check_choice, check_inputs, check_real
from rfjax.features._common import check_projection
from rfjax.features._complex_exponential import check_side
from rfjax.features._generalized_exponential import (
    InputStatistics,
    at_least_float32,
    generalized_exponential_log_features,
    input_statistics,
    optimal_precision,
)
from rfjax.features._protocol import ExponentialFeatureMap, Side
from rfjax.projections import Projection

Variant = Literal["asymmetric", "symmetric", "simplified"]
VARIANTS: tuple[Variant, ...] = ("asymmetric", "symmetric", "simplified")


class DenseExponentialParameters(NamedTuple):
    """DERF parameters in the eigenbasis of Q = I - 4A (module docstring).

    Optional leading batch axes ``...`` (one set per sequence or head).

    Attributes:
      rotation: U, ``(..., d, d)`` orthogonal: Q = U diag(q) U^T.
      scales: q, ``(..., d)``, the eigenvalues of Q (> 1/2 for a finite variance; >= 1 when
        fitted).
      query_transform: U^T Phi, ``(..., d, d)``: z = (U^T Phi) x for queries.
      key_transform: U^T Phi^{-T}, ``(..., d, d)``: z = (U^T Phi^{-T}) y for keys.
    """

    rotation: jax.Array
    scales: jax.Array
    query_transform: jax.Array
    key_transform: jax.Array


def _symmetric_power(matrix: jax.Array, power: float) -> jax.Array:
    """matrix^power for a positive semi-definite matrix; eigenvalues that rounding pushed to or
    below zero (e.g. fewer points than dimensions in float32) are floored at d eps max|lambda|."""
    values, vectors = jnp.linalg.eigh(matrix)
    floor = matrix.shape[-1] * jnp.finfo(values.dtype).eps * jnp.max(jnp.abs(values), -1)
    values = jnp.maximum(values, floor[..., None])
    return (vectors * values[..., None, :] ** power) @ jnp.swapaxes(vectors, -1, -2)


def _regularised(moment: jax.Array, ridge: float) -> jax.Array:
    """``moment + ridge * tr(M)/d * I``; a zero moment (every point at the origin, or none, e.g.
    every key masked in attention) gets ``ridge * I``, which a relative ridge would leave
    singular (its inverse root NaN)."""
    dim = moment.shape[-1]
    scale = jnp.trace(moment, axis1=-2, axis2=-1) / dim
    scale = jnp.where(scale > 0, scale, 1.0)
    return moment + (ridge * scale)[..., None, None] * jnp.eye(dim, dtype=moment.dtype)


def _from_pair_moment(
    pair_moment: jax.Array, query_phi: jax.Array, key_phi: jax.Array
) -> DenseExponentialParameters:
    """Parameters for Phi given by ``query_phi`` (Phi) and ``key_phi`` (Phi^{-T}) whose pair
    second moment is S = ``pair_moment``: U and q from the eigenvalues of S (module docstring)."""
    sigma, rotation = jnp.linalg.eigh(pair_moment)
    scales = 0.5 * (1.0 + optimal_precision(jnp.maximum(sigma, 0.0)))
    rotation_t = jnp.swapaxes(rotation, -1, -2)
    return DenseExponentialParameters(
        rotation, scales, rotation_t @ query_phi, rotation_t @ key_phi
    )


def _pair_moment(statistics: InputStatistics, query_phi: jax.Array, key_phi: jax.Array):
    """S = Phi M_q Phi^T + Phi^{-T} M_k Phi^{-1} + cross terms, for x' = Phi x, y' = Phi^{-T} y."""
    mean_q = jnp.einsum("...ij,...j->...i", query_phi, statistics.query_mean)
    mean_k = jnp.einsum("...ij,...j->...i", key_phi, statistics.key_mean)
    cross = mean_q[..., :, None] * mean_k[..., None, :]
    return (
        query_phi @ statistics.query_second_moment @ jnp.swapaxes(query_phi, -1, -2)
        + key_phi @ statistics.key_second_moment @ jnp.swapaxes(key_phi, -1, -2)
        + cross
        + jnp.swapaxes(cross, -1, -2)
    )


def _fit_symmetric(statistics: InputStatistics, ridge: float) -> DenseExponentialParameters:
    del ridge  # nothing is inverted
    dim = statistics.query_mean.shape[-1]
    eye = jnp.broadcast_to(
        jnp.eye(dim, dtype=statistics.query_mean.dtype), statistics.query_second_moment.shape
    )
    return _from_pair_moment(_pair_moment(statistics, eye, eye), eye, eye)


def _fit_asymmetric(statistics: InputStatistics, ridge: float) -> DenseExponentialParameters:
    m_q = _regularised(statistics.query_second_moment, ridge)
    m_k = _regularised(statistics.key_second_moment, ridge)
    root_q, inverse_root_q = _symmetric_power(m_q, 0.5), _symmetric_power(m_q, -0.5)
    geometric_mean = inverse_root_q @ _symmetric_power(root_q @ m_k @ root_q, 0.5) @ inverse_root_q
    phi = _symmetric_power(geometric_mean, 0.5)
    inverse_phi = _symmetric_power(geometric_mean, -0.5)
    return _from_pair_moment(_pair_moment(statistics, phi, inverse_phi), phi, inverse_phi)


def _fit_simplified(statistics: InputStatistics, ridge: float) -> DenseExponentialParameters:
    diag_q = jnp.diagonal(_regularised(statistics.query_second_moment, ridge), axis1=-2, axis2=-1)
    diag_k = jnp.diagonal(_regularised(statistics.key_second_moment, ridge), axis1=-2, axis2=-1)
    psi = (diag_k / diag_q) ** 0.25
    dim = psi.shape[-1]
    phi_prime = 2.0 * jnp.sum(jnp.sqrt(diag_q * diag_k), axis=-1) + 2.0 * jnp.sum(
        statistics.query_mean * statistics.key_mean, axis=-1
    )
    scale = 0.5 * (1.0 + optimal_precision(jnp.maximum(phi_prime, 0.0) / dim))
    eye = jnp.eye(dim, dtype=psi.dtype)
    return DenseExponentialParameters(
        jnp.broadcast_to(eye, (*psi.shape, dim)),
        jnp.broadcast_to(scale[..., None], psi.shape),
        psi[..., :, None] * eye,
        (1.0 / psi)[..., :, None] * eye,
    )


_FITS = {"asymmetric": _fit_asymmetric, "symmetric": _fit_symmetric, "simplified": _fit_simplified}


def dense_exponential_parameters(
    statistics: InputStatistics, *, variant: Variant, ridge: float = 1e-6
) -> DenseExponentialParameters:
    """Closed-form DERF parameters for given data statistics (arXiv:2302.00787).

    Args:
      statistics: ``input_statistics(queries, keys)`` (optional batch axes).
      variant: ``"asymmetric"`` (ADERF), ``"symmetric"`` (SDERF) or ``"simplified"`` (SADERF,
        FAVOR#); see the module docstring for each closed form.
      ridge: relative ridge >= 0 added to the second moments before inversion.

    Returns:
      ``DenseExponentialParameters`` with the statistics' batch axes and dtype (computed in at
      least float32: ``eigh`` takes no bfloat16 or float16).

    Raises:
      ValueError: for an unknown variant or a negative ridge.

    Examples:
      >>> import jax
      >>> q = jax.random.normal(jax.random.key(0), (32, 4))
      >>> s = input_statistics(q, 2.0 * q)
      >>> dense_exponential_parameters(s, variant="symmetric").rotation.shape
      (4, 4)
    """
    variant = check_choice("variant", variant, VARIANTS)
    ridge = check_real("ridge", ridge)
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    dtype = jnp.result_type(*statistics)
    wide = InputStatistics(*(jnp.asarray(x, at_least_float32(dtype)) for x in statistics))
    return DenseExponentialParameters(*(p.astype(dtype) for p in _FITS[variant](wide, ridge)))


def fit_dense_exponential(
    queries: jax.Array, keys: jax.Array, *, variant: Variant, ridge: float = 1e-6
) -> DenseExponentialParameters:
    """Closed-form DERF parameters fitted to samples of queries and keys (arXiv:2302.00787):
    ``dense_exponential_parameters(input_statistics(queries, keys), variant=variant)``.

    Args:
      queries: ``(..., n_q, d)``, floating, finite.
      keys: ``(..., n_k, d)``.
      variant: ``"asymmetric"``, ``"symmetric"`` or ``"simplified"`` (module docstring).
      ridge: relative ridge >= 0 added to the second moments before inversion.

    Returns:
      ``DenseExponentialParameters`` with the batch axes and dtype of the inputs (fitted in at
      least float32).

    Raises:
      TypeError, ValueError: as ``input_statistics`` and ``dense_exponential_parameters``.

    Examples:
      >>> import jax
      >>> q = jax.random.normal(jax.random.key(0), (32, 4))
      >>> k = 2.0 * jax.random.normal(jax.random.key(1), (32, 4))
      >>> p = fit_dense_exponential(q, k, variant="simplified")
      >>> p.scales.shape, bool(jax.numpy.all(p.scales >= 1.0))
      ((4,), True)
    """
    check_choice("variant", variant, VARIANTS)
    queries, keys = check_inputs("queries", queries), check_inputs("keys", keys)
    dtype = jnp.result_type(queries, keys)
    queries, keys = (x.astype(at_least_float32(dtype)) for x in (queries, keys))
    parameters = dense_exponential_parameters(
        input_statistics(queries, keys), variant=variant, ridge=ridge
    )
    return DenseExponentialParameters(*(p.astype(dtype) for p in parameters))


def dense_exponential_log_features(
    x: jax.Array,
    projection: Projection,
    *,
    side: Side,
    parameters: DenseExponentialParameters,
) -> jax.Array:
    """The log of ``dense_exponential_features``; arguments and errors as there.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> x = jax.random.normal(jax.random.key(0), (8, 3))
      >>> p = fit_dense_exponential(x, x, variant="symmetric")
      >>> w = projections.gaussian(jax.random.key(1), 3, 5)
      >>> dense_exponential_log_features(x, w, side="query", parameters=p).shape
      (8, 5)
    """
    side = check_side(side)
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    rotation, scales, query_transform, key_transform = (jnp.asarray(p) for p in parameters)
    dim = projection.dim
    if rotation.shape[-2:] != (dim, dim) or scales.shape[-1:] != (dim,):
        raise ValueError(
            f"parameters must be for d={dim} (rotation (..., {dim}, {dim}), scales (..., {dim})), "
            f"got rotation {rotation.shape} and scales {scales.shape}"
        )
    transform = query_transform if side == "query" else key_transform
    batched = rotation.ndim > 2  # one set of parameters per sequence: x is (..., n, d)
    nu = projection(jnp.swapaxes(rotation, -1, -2))  # (..., d, m): column i is U^T w_i
    nu_squared = nu * nu
    row = 0.25 * (
        jnp.sum(nu_squared, axis=-2) - jnp.sum(scales[..., :, None] * nu_squared, axis=-2)
    ) + 0.25 * jnp.sum(jnp.log(scales), axis=-1, keepdims=True)
    root_scales = jnp.sqrt(scales)
    if batched:
        row, root_scales = row[..., None, :], root_scales[..., None, :]
    z = x @ jnp.swapaxes(transform, -1, -2)
    return (
        (z * root_scales) @ nu
        + row
        - 0.5 * jnp.sum(z * z, axis=-1, keepdims=True)
        - 0.5 * math.log(projection.num_features)
    )


def dense_exponential_features(
    x: jax.Array,
    projection: Projection,
    *,
    side: Side,
    parameters: DenseExponentialParameters,
) -> jax.Array:
    """Dense-exponential random features (DERF) of the softmax kernel (arXiv:2302.00787).

    phi_i(x) = det(Q)^{1/4} exp(w_i^T A w_i + w_i^T B_side x + x^T C_side x) / sqrt(m) with the
    parameters in the eigenbasis of Q = I - 4A (module docstring), so that query features .
    key features estimate exp(x.y) without bias for every coupling whose rows are N(0, I_d).
    Positive; the symmetric and simplified variants cost one extra ``(d, d)`` (dense) or
    diagonal transform per input.

    Args:
      x: inputs ``(..., d)`` (unbatched parameters) or ``(..., n, d)`` (parameters with batch
        axes ``(...)``, one set per sequence), floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      side: ``"query"`` (uses B_q, C_q) or ``"key"`` (B_k, C_k).
      parameters: ``fit_dense_exponential(queries, keys, variant=...)`` or given.

    Returns:
      Positive features, shape ``(..., m)`` (``(..., n, m)`` for batched parameters).

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: for an unknown side, or parameters or inputs of another ``d``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> q = 0.5 * jax.random.normal(jax.random.key(0), (6, 4))
      >>> k = jax.random.normal(jax.random.key(1), (5, 4))
      >>> p = fit_dense_exponential(q, k, variant="asymmetric")
      >>> w = projections.orthogonal(jax.random.key(2), 4, 16)
      >>> phi_q = dense_exponential_features(q, w, side="query", parameters=p)
      >>> phi_k = dense_exponential_features(k, w, side="key", parameters=p)
      >>> (phi_q @ phi_k.T).shape
      (6, 5)
    """
    return jnp.exp(dense_exponential_log_features(x, projection, side=side, parameters=parameters))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DenseExponentialFeatureMap(ExponentialFeatureMap):
    """DERF as a ``FeatureMap``: ``dense_exponential_features`` with fitted ``parameters``.

    ``fit(key, queries, keys)`` sets ``parameters = fit_dense_exponential(queries, keys,
    variant=variant)``; without them (``None``, the neutral start) the map is FAVOR+.
    Registered as ``"derf_asymmetric"``, ``"derf_symmetric"`` and ``"saderf"`` (FAVOR#).

    Attributes:
      variant: ``"asymmetric"``, ``"symmetric"`` or ``"simplified"`` (static).
      parameters: the fitted ``DenseExponentialParameters`` or ``None``.

    Examples:
      >>> import jax
      >>> q = jax.random.normal(jax.random.key(1), (8, 4))
      >>> fmap = DenseExponentialFeatureMap("simplified").fit(jax.random.key(0), q, q)
      >>> fmap.parameters.scales.shape, fmap.symmetric
      ((4,), False)
    """

    variant: Variant = dataclasses.field(default="simplified", metadata={"static": True})
    parameters: DenseExponentialParameters | None = None

    fitted_fields = ("parameters",)

    @property
    def symmetric(self) -> bool:  # type: ignore[override]
        """Only SDERF (B_q = B_k, C_q = C_k) gives the same features on both sides."""
        return self.variant == "symmetric"

    def __post_init__(self):
        check_choice("variant", self.variant, VARIANTS)

    def log_features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        if self.parameters is None:
            check_side(side)
            return generalized_exponential_log_features(x, projection, a=jnp.zeros((), x.dtype))
        return dense_exponential_log_features(x, projection, side=side, parameters=self.parameters)

    def fit(
        self, key: jax.Array, queries: jax.Array, keys: jax.Array
    ) -> DenseExponentialFeatureMap:
        del key  # deterministic
        parameters = fit_dense_exponential(queries, keys, variant=self.variant)
        return dataclasses.replace(self, parameters=parameters)
