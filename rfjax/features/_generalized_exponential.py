"""Generalised exponential random features (GERF) and optimised positive features (OPRF, FAVOR++).

GERF (Likhosherstov et al. 2022, arXiv:2205.15317, the GERF definition) estimate the softmax kernel
exp(x.y) with features f(w, x) = D exp(A |w|^2 + B w.x + C |x|^2), w ~ N(0, I_d). Taking the
positive branch s = +1 of the paper, the Gaussian integral

  E[exp(2A |w|^2 + B w.(x + y))] = (1 - 4A)^{-d/2} exp(B^2 |x + y|^2 / (2 (1 - 4A)))   (A < 1/4)

makes E[f(w, x) f(w, y)] = exp(x.y) exactly when B^2 = 1 - 4A, C = -1/2 and D = (1 - 4A)^{d/4}
(the paper's unbiasedness theorem for GERF). A = 0 is FAVOR+. The second moment (finite for
A < 1/8),

  E[(f(w, x) f(w, y))^2] = (1 - 4A)^d (1 - 8A)^{-d/2} exp(2 (1 - 4A) / (1 - 8A) |x + y|^2
                                                          - |x|^2 - |y|^2),

gives the variance (``rfjax.theory.gerf_variance``). OPRF (the paper's OPRF theorem) picks A to
minimise the average over all query-key pairs of the log second moment; with
phi = mean_{i,j} |x_i + y_j|^2 and t = 1 - 8A > 0 the objective is, up to constants,
d log(1 + t) - (d/2) log t + phi / t, whose stationary point is the positive root of
d t^2 - (d + 2 phi) t - 2 phi = 0:

  A* = (1 - t*) / 8 = (1/16) (1 - 2 phi/d - sqrt((2 phi/d + 1)^2 + 8 phi/d))  <= 0,

so the optimised features are positive and bounded in w (A* <= 0).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rfjax._validation import as_array, check_finite, check_inputs, is_concrete
from rfjax.features._common import check_projection
from rfjax.features._complex_exponential import check_side
from rfjax.features._protocol import AffineLogForm, ExponentialFeatureMap, Side
from rfjax.projections import Projection


class InputStatistics(NamedTuple):
    """First and second moments of a set of queries and of a set of keys.

    Shapes carry optional batch axes ``...`` (e.g. batch and heads in attention).

    Attributes:
      query_mean: mean of the queries, ``(..., d)``.
      key_mean: mean of the keys, ``(..., d)``.
      query_second_moment: M_q = mean x x^T over the queries, ``(..., d, d)``.
      key_second_moment: M_k = mean y y^T over the keys, ``(..., d, d)``.
    """

    query_mean: jax.Array
    key_mean: jax.Array
    query_second_moment: jax.Array
    key_second_moment: jax.Array


def _check_points(name: str, points: object) -> jax.Array:
    points = check_inputs(name, points)
    if points.ndim < 2 or points.shape[-2] < 1:
        raise ValueError(f"{name} must have shape (..., num_points >= 1, d), got {points.shape}")
    return check_finite(name, points)


def input_statistics(queries: jax.Array, keys: jax.Array) -> InputStatistics:
    """The moments of ``queries`` and ``keys`` that OPRF and DERF parameters are fitted to.

    Args:
      queries: shape ``(..., n_q, d)``, floating, finite.
      keys: shape ``(..., n_k, d)``, the same ``d`` and batch axes broadcasting with the queries'.

    Returns:
      ``InputStatistics`` with the means ``(..., d)`` and second moments ``(..., d, d)`` taken
      over the point axis (-2), accumulated in at least float32 and returned in the inputs'
      dtype.

    Raises:
      TypeError: if an input is not floating.
      ValueError: for a shape without a point axis, different ``d`` or non-finite values.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = input_statistics(jnp.ones((5, 3)), jnp.zeros((7, 3)))
      >>> float(mean_squared_sum(s))
      3.0
    """
    queries = _check_points("queries", queries)
    keys = _check_points("keys", keys)
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same d (last axis), got shapes {queries.shape} and "
            f"{keys.shape}"
        )
    dtype = jnp.result_type(queries, keys)
    queries, keys = (x.astype(at_least_float32(dtype)) for x in (queries, keys))
    statistics = InputStatistics(
        jnp.mean(queries, axis=-2),
        jnp.mean(keys, axis=-2),
        _second_moment(queries),
        _second_moment(keys),
    )
    return InputStatistics(*(x.astype(dtype) for x in statistics))


def at_least_float32(dtype: jnp.dtype) -> jnp.dtype:
    """The dtype in which fits are computed: float32 for low-precision (bfloat16, float16)
    inputs, else ``dtype``; results are returned in the inputs' dtype."""
    return jnp.promote_types(dtype, jnp.float32)


def _second_moment(points: jax.Array) -> jax.Array:
    return jnp.einsum("...ni,...nj->...ij", points, points) / points.shape[-2]


def mean_squared_sum(statistics: InputStatistics) -> jax.Array:
    """phi = mean over all query-key pairs of |x_i + y_j|^2 = tr M_q + tr M_k + 2 xbar.ybar.

    Shape ``(...)`` (the statistics' batch axes).
    """
    return (
        jnp.trace(statistics.query_second_moment, axis1=-2, axis2=-1)
        + jnp.trace(statistics.key_second_moment, axis1=-2, axis2=-1)
        + 2.0 * jnp.sum(statistics.query_mean * statistics.key_mean, axis=-1)
    )


def optimal_precision(scaled_phi: jax.Array) -> jax.Array:
    """t* = 1 - 8A*: the positive root of t^2 - (1 + 2 sigma) t - 2 sigma = 0 (sigma >= 0).

    ``scaled_phi`` is sigma = phi / d for OPRF (one value for all directions) or an eigenvalue of
    the pair second moment for DERF (one per direction); t* >= 1.
    """
    b = 1.0 + 2.0 * scaled_phi
    return 0.5 * (b + jnp.sqrt(b * b + 8.0 * scaled_phi))


def optimal_gerf_parameter(statistics: InputStatistics) -> jax.Array:
    """A* of OPRF (Likhosherstov et al. 2022, arXiv:2205.15317, OPRF), shape ``(...)``.

    A* = (1/16)(1 - 2 phi/d - sqrt((2 phi/d + 1)^2 + 8 phi/d)) with phi = ``mean_squared_sum``;
    it minimises the mean over pairs of the log second moment of the GERF estimate (module
    docstring) and is <= 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = input_statistics(jnp.zeros((2, 4)), jnp.zeros((3, 4)))
      >>> float(optimal_gerf_parameter(s))  # phi = 0: FAVOR+ (A = 0)
      0.0
    """
    dim = statistics.query_mean.shape[-1]
    return (1.0 - optimal_precision(mean_squared_sum(statistics) / dim)) / 8.0


def _check_parameter(a: object) -> jax.Array:
    a = as_array("a", a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"a must be a real floating number or array, got dtype {a.dtype}")
    check_finite("a", a)
    if is_concrete(a) and bool(jnp.any(a >= 0.125)):
        raise ValueError(f"a must be < 1/8 (finite variance), got {a}")
    return a


def generalized_exponential_log_features(
    x: jax.Array, projection: Projection, *, a: jax.Array | float
) -> jax.Array:
    """The log of ``generalized_exponential_features``:
    l_i(x) = A |w_i|^2 + sqrt(1 - 4A) w_i.x - |x|^2/2 + (d/4) log(1 - 4A) - log(m)/2.

    Arguments, shapes and errors as for ``generalized_exponential_features``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.gaussian(jax.random.key(0), 4, 8)
      >>> generalized_exponential_log_features(jax.numpy.ones((3, 4)), w, a=-0.1).shape
      (3, 8)
    """
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    a = _check_parameter(a)[..., None]
    squared_norms = jnp.sum(projection.matrix() ** 2, axis=-1)
    shrink = 1.0 - 4.0 * a
    return (
        a * squared_norms
        + jnp.sqrt(shrink) * projection(x)
        - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
        + 0.25 * projection.dim * jnp.log(shrink)
        - 0.5 * math.log(projection.num_features)
    )


def generalized_exponential_features(
    x: jax.Array, projection: Projection, *, a: jax.Array | float
) -> jax.Array:
    """Positive GERF features of the softmax kernel (arXiv:2205.15317, GERF).

    phi_i(x) = (1 - 4A)^{d/4} exp(A |w_i|^2 + sqrt(1 - 4A) w_i.x - |x|^2/2) / sqrt(m), so that
    E[phi(x).phi(y)] = exp(x.y) for every A < 1/4 and every coupling whose rows are N(0, I_d)
    (norms included: |w_i|^2 enters the features). A = 0 is FAVOR+; the variance
    (``rfjax.theory.gerf_variance``) is finite for A < 1/8; A <= 0 gives bounded features.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      a: A < 1/8, a number or an array broadcasting against ``x.shape[:-1]``.

    Returns:
      Positive features, shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim`` or (outside ``jit``) ``a >= 1/8`` or
        not finite.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.orthogonal(jax.random.key(0), 4, 8)
      >>> generalized_exponential_features(jax.numpy.ones((3, 4)), w, a=-0.1).shape
      (3, 8)
    """
    return jnp.exp(generalized_exponential_log_features(x, projection, a=a))


def _per_sequence(parameter: jax.Array) -> jax.Array:
    """Adds the point axis to a per-sequence parameter of shape ``(...)`` (scalars unchanged)."""
    return parameter if parameter.ndim == 0 else parameter[..., None]


def optimized_positive_features(
    x: jax.Array, projection: Projection, *, side: Side, statistics: InputStatistics
) -> jax.Array:
    """OPRF (FAVOR++) features: GERF at the optimal A* of ``statistics`` (arXiv:2205.15317,
    OPRF).

    phi(x) = ``generalized_exponential_features(x, projection, a=A*)`` with
    A* = ``optimal_gerf_parameter(statistics)``: positive, bounded, unbiased for exp(x.y) with
    any marginally Gaussian coupling, and of least mean log-variance over the query-key pairs
    that ``statistics`` describe. The same function on both sides (``side`` is checked only).

    Args:
      x: inputs ``(..., n, d)`` (or ``(..., d)`` with unbatched statistics), floating.
      projection: a drawn ``Projection`` with ``dim == d``.
      side: ``"query"`` or ``"key"``.
      statistics: ``input_statistics(queries, keys)``; batch axes ``(...)`` broadcast against
        ``x.shape[:-2]`` (one A* per sequence).

    Returns:
      Positive features, shape ``(..., m)``.

    Raises:
      TypeError, ValueError: as ``generalized_exponential_features``, or for an unknown side.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
      >>> q, k = jax.random.normal(k1, (6, 4)), jax.random.normal(k2, (5, 4))
      >>> w = projections.orthogonal(k3, 4, 16)
      >>> s = input_statistics(q, k)
      >>> estimates = (optimized_positive_features(q, w, side="query", statistics=s)
      ...              @ optimized_positive_features(k, w, side="key", statistics=s).T)
      >>> estimates.shape
      (6, 5)
    """
    check_side(side)
    a = _per_sequence(optimal_gerf_parameter(statistics))
    return generalized_exponential_features(x, projection, a=a)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OptimizedPositiveFeatureMap(ExponentialFeatureMap):
    """OPRF (FAVOR++) as a ``FeatureMap``: ``optimized_positive_features`` on both sides.

    ``statistics`` is fitted by ``fit(key, queries, keys)`` (``input_statistics``); without it
    (``None``, the neutral start) the map is FAVOR+ (A = 0). Registered as ``"oprf"``.

    Attributes:
      statistics: the fitted ``InputStatistics`` or ``None``.

    Examples:
      >>> import jax
      >>> q = jax.random.normal(jax.random.key(1), (8, 4))
      >>> fmap = OptimizedPositiveFeatureMap().fit(jax.random.key(0), q, q)
      >>> fmap.statistics.query_mean.shape
      (4,)
    """

    statistics: InputStatistics | None = None

    fitted_fields = ("statistics",)

    def log_features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        check_side(side)
        if self.statistics is None:
            a = jnp.zeros((), x.dtype)
        else:
            a = _per_sequence(optimal_gerf_parameter(self.statistics))
        return generalized_exponential_log_features(x, projection, a=a)

    def affine_log_form(self, projection: Projection, *, side: Side) -> AffineLogForm:
        """W' = sqrt(1 - 4A) W, b_i = A |w_i|^2 + (d/4) log(1 - 4A) - log(m)/2, norm weight
        -1/2 (``generalized_exponential_log_features``); one A per map (statistics with batch
        axes, e.g. per sequence, give an A that the form does not take: ``ValueError``)."""
        check_side(side)
        if self.statistics is None:
            a = jnp.zeros((), projection.matrix().dtype)
        else:
            a = optimal_gerf_parameter(self.statistics)
        if jnp.ndim(a) != 0:
            raise ValueError(
                f"affine_log_form takes one fitted A per map; these statistics give A of shape "
                f"{jnp.shape(a)} (statistics of several sequences or heads in one map: fit "
                f"one map per head, rfjax.attention.PerHead)"
            )
        weights = projection.matrix()
        shrink = 1.0 - 4.0 * a
        bias = (
            a * jnp.sum(weights**2, axis=-1)
            + 0.25 * projection.dim * jnp.log(shrink)
            - 0.5 * math.log(projection.num_features)
        )
        return AffineLogForm(jnp.sqrt(shrink) * weights, bias, -0.5)

    def fit(
        self, key: jax.Array, queries: jax.Array, keys: jax.Array
    ) -> OptimizedPositiveFeatureMap:
        del key  # deterministic
        return dataclasses.replace(self, statistics=input_statistics(queries, keys))
