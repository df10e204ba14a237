"""What attention adds to a feature map: the data normaliser H^{-1/4}, the stabiliser (the maps'
log-space form, per-query scales dropped and per-key scales kept as log-scales), and the layout
(rows of BTNH arrays, shared or per-head projections and maps)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rfjax._validation import check_int
from rfjax.attention._checks import HeadAxes
from rfjax.features import SIDES, FeatureMap, Side, exponential_side
from rfjax.projections import Projection


def data_normalizer(head_dim: int) -> float:
    """H^{-1/4}: with q, k scaled by it, exp(q'.k') = exp(q.k / sqrt(H)) (SimRF Eq. 5;
    docs/maths/attention.md).

    ``favor_attention`` scales queries and keys by it before the feature map, so a map of the
    softmax kernel exp(x.y) estimates the attention kernel exp(q.k / sqrt(H)).

    Raises:
      TypeError, ValueError: for a ``head_dim`` that is not an integer >= 1.
    """
    return check_int("head_dim", head_dim, minimum=1) ** -0.25


def normalise(x: jax.Array) -> jax.Array:
    """x H^{-1/4} for ``x`` of shape ``(..., H)``."""
    return x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)


def query_features(
    query: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool
) -> jax.Array:
    """phi_Q(q) (T, width); stabilised, its per-row scale is dropped (it cancels)."""
    if stabilize:
        return fmap.scaled_features(query, projection, side="query").features
    return fmap.features(query, projection, side="query")


def scaled_key_features(
    key: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool
) -> tuple[jax.Array, jax.Array]:
    """(psi (S, width), mu (S,)) with phi_K(k_j) = psi_j exp(mu_j).

    Stabilised, (psi, mu) is the map's log-space form (mu a constant under differentiation; for
    exponential maps mu_j = max_i l_i(k_j), so the largest entry of psi_j is 1); otherwise
    psi = phi and mu = 0.
    """
    if stabilize:
        psi, mu = fmap.scaled_features(key, projection, side="key")
        return psi, mu
    psi = fmap.features(key, projection, side="key")
    return psi, jnp.zeros(psi.shape[:-1], psi.dtype)


def has_feature_logs(fmap: FeatureMap) -> bool:
    """Whether both sides' features are exponentials of log-features (per-feature key shifts,
    see ``FeatureLogs``)."""
    return all(exponential_side(fmap, side) is not None for side in SIDES)


def has_signed_features(fmap: FeatureMap) -> bool:
    """Whether a row's estimated normaliser can be <= 0 with ``fmap``: a map that needs a
    denominator floor and is not exponential on both sides (positive features only underflow,
    which the per-feature key shifts prevent)."""
    return fmap.needs_denominator_floor and not has_feature_logs(fmap)


class FeatureLogs(NamedTuple):
    """phi = factor * exp(log) entrywise (``factor`` and ``log`` broadcast against each other to
    the features' width): the per-feature log-space form in which attention shifts keys.

    Stabilised exponential maps (``has_feature_logs``): factor = 1 (width 1; 0 for a key left
    out) and log = l, the log-features (width m), so each feature gets its own key shift and no
    feature of a key is rounded relative to the key's largest one. Other maps: factor = psi and
    log = mu (width 1), their per-row form (``scaled_key_features``), whose shift is one per row.
    Queries' logs are relative to their own maximum (the query's scale cancels). ``log`` is a
    constant under differentiation only where it is mu; l carries its gradient.

    Attributes:
      factor: shape ``(..., width)`` or ``(..., 1)``.
      log: shape ``(..., width)`` or ``(..., 1)``.
    """

    factor: jax.Array
    log: jax.Array


def feature_logs(
    x: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    stabilize: bool,
    per_feature: bool,
    side: Side,
) -> FeatureLogs:
    """The ``FeatureLogs`` of ``side``'s rows ``x (T, H)``: per feature (``per_feature``, for
    maps with ``has_feature_logs``, stabilised) or per row."""
    exponential = exponential_side(fmap, side)
    if per_feature and stabilize and exponential is not None:
        logs = exponential.log_features(x, projection, side=side)
        if side == "query":  # relative to the row's maximum: the query's own scale cancels
            logs = logs - jax.lax.stop_gradient(jnp.max(logs, axis=-1, keepdims=True))
        return FeatureLogs(jnp.ones((*logs.shape[:-1], 1), logs.dtype), logs)
    if side == "query":
        phi = query_features(x, projection, fmap, stabilize)
        return FeatureLogs(phi, jnp.zeros((*phi.shape[:-1], 1), phi.dtype))
    psi, mu = scaled_key_features(x, projection, fmap, stabilize)
    return FeatureLogs(psi, mu[..., None])


def key_features(
    key: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    stabilize: bool,
    floor: float,
    per_feature: bool,
) -> FeatureLogs:
    """``feature_logs`` of keys ``(S, H)`` with a mask ``valid (S,)``: masked keys get
    factor = 0 and log = floor. They are zeroed before the map, so padding holding garbage
    cannot create NaNs (not even in gradients)."""
    key = jnp.where(valid[..., None], key, 0)
    factor, log = feature_logs(key, projection, fmap, stabilize, per_feature, "key")
    return FeatureLogs(
        jnp.where(valid[..., None], factor, 0), jnp.where(valid[..., None], log, floor)
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def floored_ratio(numerator: jax.Array, denominator: jax.Array, eps: float) -> jax.Array:
    """numerator / max(denominator, eps), with ``denominator`` broadcasting against the
    numerator (e.g. ``(T, H_v)`` and ``(T, 1)``): the normalisation of attention rows.

    Its derivative is written as (d num - out d den) / max(den, eps), never with den^2: plain
    autodiff forms -num / den^2, which overflows to inf (and inf * 0 = NaN) once den < ~1e-19 in
    float32, even where the cotangent is 0 (a row nothing depends on). The floor's own
    derivative is 0 below ``eps``. A row whose denominator is exactly 0 has derivative 0. Such a
    row attends to no key (its numerator is 0 too, and it is 0 whatever the inputs), or, with
    signed features, its terms cancel exactly and its output is the numerator over ``eps``.
    Either way d num / eps would carry a cotangent of 4 or more to inf at the positive maps'
    floor (the smallest normal number), and inf times the zeros of the keys the row does not
    attend to is NaN, which reached every parameter's gradient. The derivative divides by
    max(den, eps), or by inf where den is 0. (A test of the numerator's row as well, and a
    factor 1 / max(den, eps) selected in place of the division, cost 2% of bidirectional
    FAVOR's forward + backward time at T = 256 on CPU; ``benchmarks/results/
    attention_against_f41641b``.)
    """
    return numerator / jnp.maximum(denominator, eps)


@floored_ratio.defjvp
def _floored_ratio_jvp(eps, primals, tangents):
    numerator, denominator = primals
    numerator_dot, denominator_dot = tangents
    floored = jnp.maximum(denominator, eps)
    out = numerator / floored
    denominator_dot = jnp.where(denominator > eps, denominator_dot, 0)
    divisor = jnp.where(denominator == 0, jnp.inf, floored)  # a finite tangent over inf is 0
    return out, (numerator_dot - out * denominator_dot) / divisor


def finite_rows(x: jax.Array) -> jax.Array:
    """Whether every entry of each row ``x[..., i, :]`` is finite: shape ``x.shape[:-1]``."""
    return jnp.all(jnp.isfinite(x), axis=-1)


def finite_query_features(
    query: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool, per_feature: bool
) -> tuple[FeatureLogs, jax.Array]:
    """(``feature_logs`` (T, .), bad (T,)) of queries ``(T, H)`` with rows that are not finite
    (the query or its features) set to 0 and flagged in ``bad``.

    The attention output of a flagged row is set to NaN by the caller; zeroing it inside keeps
    its NaN out of every other row, in the forward pass and in gradients (a NaN cotangent times
    a zero feature would spread through the shared sums). The query is zeroed before the map,
    so the map's derivative is finite too.
    """
    finite = finite_rows(query)
    query = jnp.where(finite[..., None], query, 0)
    factor, log = feature_logs(query, projection, fmap, stabilize, per_feature, "query")
    finite = finite & finite_rows(factor) & finite_rows(log)
    return FeatureLogs(*(jnp.where(finite[..., None], x, 0) for x in (factor, log))), ~finite


def finite_key_features(
    key: jax.Array,
    value: jax.Array,
    valid: jax.Array,
    logs: Callable[[jax.Array], FeatureLogs],
    floor: float,
) -> tuple[FeatureLogs, jax.Array, jax.Array]:
    """(features, value, bad): the ``FeatureLogs`` ``logs(key)`` of keys ``(..., S, H)`` and the
    values ``(..., S, H_v)`` under the mask ``valid (..., S)``, with every key that cannot
    contribute a finite term excluded: masked keys, and unmasked keys whose key, value or
    features are not finite. Excluded keys get factor = 0, log = ``floor`` and value 0 (they are
    zeroed before the map: no NaN reaches a product, not even 0 * NaN, nor a gradient).
    ``bad (..., S)`` flags the unmasked ones: every output that attends to one of them is set to
    NaN by the caller, and no other output can see them.
    """
    usable = valid & finite_rows(key) & finite_rows(value)
    factor, log = logs(jnp.where(usable[..., None], key, 0))
    usable = usable & finite_rows(factor) & finite_rows(log)
    return (
        FeatureLogs(
            jnp.where(usable[..., None], factor, 0), jnp.where(usable[..., None], log, floor)
        ),
        jnp.where(usable[..., None], value, 0),
        valid & ~usable,
    )


def rowwise(
    fn: Callable[[jax.Array, Projection, FeatureMap], object],
    x: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    axes: HeadAxes,
):
    """fn (rows, H) -> pytree of (rows, ...) on BTNH ``x`` without leaving its layout: one call
    on the flattened rows (shared projection and map) or one per head (vmapped over N).
    Returns the pytree with leaves of shape ``(B, T, N, ...)``."""
    batch, length, heads, dim = x.shape
    if axes == (None, None):
        out = fn(x.reshape(-1, dim), projection, fmap)
        return jax.tree.map(lambda y: y.reshape(batch, length, heads, *y.shape[1:]), out)
    per_head = jax.vmap(fn, in_axes=(1, *axes), out_axes=1)
    out = per_head(x.reshape(-1, heads, dim), projection, fmap)
    return jax.tree.map(lambda y: y.reshape(batch, length, heads, *y.shape[2:]), out)
