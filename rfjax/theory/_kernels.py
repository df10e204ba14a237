"""The compiled kernels behind the closed forms.

Each kernel is ``jax.jit``-compiled once per dtype and input size class: the dimension d is
passed as an array, not a static argument, and eager inputs are padded to a size class by
``_bucketing.call_bucketed``. A public function called eagerly on any d and any shape of up to
128 elements therefore reuses one executable per kernel. Under a caller's
``jit``/``vmap``/``grad`` the kernels are inlined into the caller's computation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rfjax.theory import _inputs, _quadrature, _series
from rfjax.theory._bucketing import call_bucketed


@jax.jit
def _log_orthogonal(dim: jax.Array, v2: jax.Array) -> jax.Array:
    return _inputs.guard_norm(lambda w: _series.log_hyp1f1(dim, dim / 2, 0.5 * w), v2)


def log_orthogonal(dim: int, v2: jax.Array) -> jax.Array:
    """log rho_ORF = log 1F1(d; d/2; v^2/2) (SimRF Eq. 23); NaN where v > 100."""
    return call_bucketed(_log_orthogonal, (jnp.asarray(dim, v2.dtype),), (v2,))


@jax.jit
def _log_at_angle(
    dim: jax.Array, log_normaliser: jax.Array, v2: jax.Array, cos_theta: jax.Array
) -> jax.Array:
    def log_rho(w: jax.Array) -> jax.Array:
        return _quadrature.log_angular_conformity(dim, log_normaliser, 0.5 * w, cos_theta)

    return _inputs.guard_norm(log_rho, v2)


def log_at_angle(dim: int, v2: jax.Array, cos_theta: ArrayLike) -> jax.Array:
    """log rho_theta by the quadrature of SimRF Eq. 21; NaN where v > 100."""
    dtype = v2.dtype
    normaliser = _quadrature.log_weight_normaliser(dim)
    parameters = (jnp.asarray(dim, dtype), jnp.asarray(normaliser, dtype))
    return call_bucketed(_log_at_angle, parameters, (v2, jnp.asarray(cos_theta, dtype)))


@jax.jit
def _rff_orthogonal(dim: jax.Array, z2: jax.Array) -> jax.Array:
    return _inputs.guard_norm(lambda w: _series.hyp1f1(dim, dim / 2, -0.5 * w), z2)


def rff_orthogonal(dim: int, z2: jax.Array) -> jax.Array:
    """1F1(d; d/2; -z^2/2): Eq. 23 with v^2 -> -z^2 (Kummer's transform); NaN where z > 100."""
    return call_bucketed(_rff_orthogonal, (jnp.asarray(dim, z2.dtype),), (z2,))


SIMPLEX_RFF_MAX_DISTANCE = 20.0
"""Largest |x - y| for the simplex RFF conformity: its fixed-rule quadrature is validated (to
1e-14 absolute against mpmath) up to there; the kernel itself is e^-200."""


@jax.jit
def _rff_simplex(
    dim: jax.Array, sin_u: jax.Array, weights: jax.Array, cosine: jax.Array, z2: jax.Array
) -> jax.Array:
    def rho(w: jax.Array) -> jax.Array:
        rule = (dim, sin_u, weights, -w)
        return 0.5 * (
            _quadrature.signed_angular_conformity(*rule, cosine)
            + _quadrature.signed_angular_conformity(*rule, -cosine)
        )

    return _inputs.guard_norm(rho, z2, limit=SIMPLEX_RFF_MAX_DISTANCE)


def rff_simplex(dim: int, z2: jax.Array) -> jax.Array:
    """E[cos(w_i^T delta) cos(w_j^T delta)] in a simplex block: [rho_theta + rho_(pi - theta)]/2
    with v^2 -> -z^2 (docs/maths/fourier_features.md); NaN where z > 20."""
    dtype = z2.dtype
    sin_u, weights = (jnp.asarray(a, dtype) for a in _quadrature.signed_rule(dim))
    cosine = jnp.asarray(-1.0 / (dim - 1), dtype)
    return call_bucketed(_rff_simplex, (jnp.asarray(dim, dtype), sin_u, weights, cosine), (z2,))


@jax.jit
def _orthogonal_gap(dim: jax.Array, v2: jax.Array, log_prefactor: jax.Array) -> jax.Array:
    def gap(w: jax.Array) -> jax.Array:
        return _series.scaled_orthogonal_excess(0, dim, w, log_prefactor)

    return _inputs.guard_norm(gap, v2)


def orthogonal_gap(dim: int, v2: jax.Array, log_prefactor: jax.Array) -> jax.Array:
    """exp(log_prefactor) (e^{v^2} - 1F1(d; d/2; v^2/2)) by its positive series (SimRF Eq. 25)."""
    return call_bucketed(_orthogonal_gap, (jnp.asarray(dim, v2.dtype),), (v2, log_prefactor))
