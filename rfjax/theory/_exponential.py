"""Closed-form variances of GERF/OPRF (FAVOR++) and DERF (FAVOR#) estimates of exp(x.y).

For m i.i.d. rows w_i ~ N(0, I_d) the estimate is the mean of m independent copies of
f_q(w, x) f_k(w, y) (times m from the 1/sqrt(m) scales), so Var = (E[(f_q f_k)^2] - e^{2 x.y}) / m.
The second moments are derived in ``rfjax.features._generalized_exponential`` (GERF,
arXiv:2205.15317) and ``rfjax.features._dense_exponential`` (DERF,
arXiv:2302.00787). Only i.i.d. rows have these closed forms; coupled rows (orthogonal,
simplex, norm-coupled) stay unbiased but their covariance terms are checked by Monte Carlo.

All functions are JAX functions of their array arguments (``jit``, ``vmap``, ``grad``), in the
working dtype of ``rfjax.theory`` (float64 with ``jax_enable_x64``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy.typing import ArrayLike

from rfjax import features
from rfjax._validation import is_concrete
from rfjax.theory import _inputs


def exp_difference(log_larger: jax.Array, log_smaller: jax.Array) -> jax.Array:
    """e^a - e^b for a >= b, as e^a (1 - e^(b - a)) (``-expm1``): no cancellation, and finite
    wherever e^a is (e^b (e^(a - b) - 1) gave 0 * inf = NaN where e^b underflows and
    e^(a - b) overflows, e.g. a variance of e^-100 in float32)."""
    return jnp.exp(log_larger) * -jnp.expm1(log_smaller - log_larger)


def _variance(log_second_moment: jax.Array, dot: jax.Array, num_features: int) -> jax.Array:
    # (E[X^2] - e^{2 x.y}) / m, E[X^2] >= (E X)^2 = e^{2 x.y}.
    return exp_difference(log_second_moment, 2.0 * dot) / num_features


def gerf_log_second_moment(x: ArrayLike, y: ArrayLike, *, a: ArrayLike) -> jax.Array:
    """log E[(f(w, x) f(w, y))^2] for one positive GERF feature pair (arXiv:2205.15317).

    = d log(1 - 4A) - (d/2) log(1 - 8A) + 2 (1 - 4A) / (1 - 8A) |x + y|^2 - |x|^2 - |y|^2.

    Args:
      x, y: inputs ``(..., d)`` (broadcasting), floating, finite.
      a: A < 1/8, broadcasting against the batch shape.

    Returns:
      Shape ``broadcast(x.shape[:-1], y.shape[:-1], a.shape)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([0.3, -0.2])
      >>> round(float(gerf_log_second_moment(x, -x, a=0.0)), 6)  # FAVOR+, y = -x: -2|x|^2
      -0.26
    """
    x, y = _inputs.point_pair(x, y)
    a = _inputs.real_array("a", a)
    if is_concrete(a) and bool(jnp.any(a >= 0.125)):
        raise ValueError(f"a must be < 1/8 (finite second moment), got {a}")
    dim = x.shape[-1]
    shrink = 1.0 - 4.0 * a
    sum_sq = jnp.sum((x + y) ** 2, axis=-1)
    return (
        dim * jnp.log(shrink)
        - 0.5 * dim * jnp.log1p(-8.0 * a)
        + 2.0 * shrink / (1.0 - 8.0 * a) * sum_sq
        - jnp.sum(x * x, axis=-1)
        - jnp.sum(y * y, axis=-1)
    )


def gerf_variance(x: ArrayLike, y: ArrayLike, num_features: int, *, a: ArrayLike) -> jax.Array:
    """Variance (= MSE, the estimate being unbiased) of the positive GERF estimate of exp(x.y)
    with ``num_features`` i.i.d. Gaussian rows (arXiv:2205.15317).

    Var = (e^{``gerf_log_second_moment``} - e^{2 x.y}) / m; A = 0 gives FAVOR+ (it equals
    ``prf_mse(..., kernel="softmax")``).

    Examples:
      >>> import jax.numpy as jnp
      >>> x, y = jnp.array([0.5, 0.0]), jnp.array([0.0, 0.5])
      >>> bool(gerf_variance(x, y, 8, a=-0.05) < gerf_variance(x, y, 8, a=0.0))
      True
    """
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    log_second = gerf_log_second_moment(x, y, a=a)
    return _variance(log_second, jnp.sum(x * y, axis=-1), num_features)


def oprf_variance(
    x: ArrayLike, y: ArrayLike, num_features: int, *, statistics: features.InputStatistics
) -> jax.Array:
    """Variance of the OPRF (FAVOR++) estimate: ``gerf_variance`` at
    A* = ``rfjax.features.optimal_gerf_parameter(statistics)`` (arXiv:2205.15317).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from rfjax import features
      >>> q = jax.random.normal(jax.random.key(0), (16, 4))
      >>> s = features.input_statistics(q, q)
      >>> oprf_variance(q[0], q[1], 8, statistics=s).shape
      ()
    """
    return gerf_variance(x, y, num_features, a=features.optimal_gerf_parameter(statistics))


def dense_exponential_log_second_moment(
    x: ArrayLike, y: ArrayLike, *, parameters: features.DenseExponentialParameters
) -> jax.Array:
    """log E[(f_q(w, x) f_k(w, y))^2] for one DERF feature pair (arXiv:2302.00787).

    With z_x = (U^T Phi) x, z_y = (U^T Phi^{-T}) y and q the eigenvalues of Q = I - 4A:
    sum_l [log q_l - log(2 q_l - 1)/2 + 2 q_l / (2 q_l - 1) (z_x + z_y)_l^2] - |z_x|^2 - |z_y|^2.

    Args:
      x, y: inputs ``(..., d)`` (broadcasting), floating, finite.
      parameters: unbatched ``DenseExponentialParameters`` for this d (q > 1/2).

    Returns:
      Shape ``broadcast(x.shape[:-1], y.shape[:-1])``.
    """
    x, y = _inputs.point_pair(x, y)
    dtype = _inputs.theory_dtype()
    scales = jnp.asarray(parameters.scales, dtype)
    if parameters.rotation.ndim != 2 or scales.shape != (x.shape[-1],):
        raise ValueError(
            f"parameters must be unbatched for d={x.shape[-1]}, got scales {scales.shape}"
        )
    z_x = x @ jnp.asarray(parameters.query_transform, dtype).T
    z_y = y @ jnp.asarray(parameters.key_transform, dtype).T
    precision = 2.0 * scales - 1.0
    return (
        jnp.sum(jnp.log(scales) - 0.5 * jnp.log(precision))
        + jnp.sum(2.0 * scales / precision * (z_x + z_y) ** 2, axis=-1)
        - jnp.sum(z_x * z_x, axis=-1)
        - jnp.sum(z_y * z_y, axis=-1)
    )


def dense_exponential_variance(
    x: ArrayLike,
    y: ArrayLike,
    num_features: int,
    *,
    parameters: features.DenseExponentialParameters,
) -> jax.Array:
    """Variance of the DERF estimate of exp(x.y) with ``num_features`` i.i.d. Gaussian rows
    (arXiv:2302.00787):
    (e^{``dense_exponential_log_second_moment``} - e^{2 x.y}) / m.

    Examples:
      >>> import jax
      >>> from rfjax import features
      >>> q = jax.random.normal(jax.random.key(0), (16, 3))
      >>> p = features.fit_dense_exponential(q, q, variant="asymmetric")
      >>> dense_exponential_variance(q[:4], q[4:8], 8, parameters=p).shape
      (4,)
    """
    num_features = _inputs.feature_count(num_features)
    x, y = _inputs.point_pair(x, y)
    log_second = dense_exponential_log_second_moment(x, y, parameters=parameters)
    return _variance(log_second, jnp.sum(x * y, axis=-1), num_features)
