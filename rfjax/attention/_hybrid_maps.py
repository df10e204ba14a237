"""Signed and hybrid feature maps for FAVOR attention (HRF): trigonometric, angular hybrid,
cluster-adapted hybrid, as (query map, key map) pairs for ``favor_attention(feature_map=...)``.

The trigonometric and angular-hybrid estimators are unbiased for exp(q.k / sqrt(H)) but signed:
a row's estimated normaliser can be <= 0, and ``favor_attention`` floors the denominator at
``eps``. With the default floor (the smallest normal number) such rows are huge or infinite;
pass a working floor (e.g. ``eps=1e-3``), which biases only the rows below it. The floor alone
does not make them trainable: with raw scores q.k / sqrt(H) the key factor e^{|k'|^2/2} makes the
estimates huge and about half the rows' normalisers negative. Unit queries and keys with a
temperature (``rfjax.nn.PerformerAttention(query_key_norm=True)``) bound the kernel away from 0,
and then the estimated normalisers are positive (``tests/test_conformer_ctc.py``). The cluster
hybrid's features are exponentials given by log-features, so FAVOR stabilises them like FAVOR+.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from rfjax.attention._feature_maps import ExponentialFeatureMap, data_normalizer
from rfjax.features import angular_hybrid_features, assign_clusters, trigonometric_features
from rfjax.features._complex_exponential import transform
from rfjax.features._fourier import _sin_cos
from rfjax.projections import Projection

SIDES = ("query", "key")


# --------------------------------------------------------------------------- projections


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HybridProjection(Projection):
    """A base projection plus what a hybrid map needs besides it (a pytree of arrays).

    ``favor_attention`` sees a ``Projection`` (it applies and checks ``base``); the hybrid
    feature maps also read ``extra``: the sign projection of the angular hybrid or the
    ``ClusterHybridParameters`` of the cluster hybrid.

    Attributes:
      base: the base estimators' projection (m rows).
      extra: a ``Projection`` (angular coefficient) or ``ClusterHybridParameters``.
    """

    base: Projection
    extra: Any

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def num_features(self) -> int:
        return self.base.num_features

    @property
    def block_size(self) -> int:
        return self.base.block_size

    def _apply(self, x: jax.Array) -> jax.Array:
        return self.base._apply(x)

    def matrix(self) -> jax.Array:
        return self.base.matrix()


# --------------------------------------------------------------------------- feature maps


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")


def _normalised(x: jax.Array) -> jax.Array:
    return x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)


@dataclasses.dataclass(frozen=True)
class TrigonometricFeatureMap:
    """Trigonometric softmax features for FAVOR (HRF Eq. 2), one side of the pair.

    With x' = H^{-1/4} x, keys get e^{|k'|^2/2} [sin, cos](W k') / sqrt(m) and queries
    [sin, cos](W q') / sqrt(m): the query factor e^{|q'|^2/2} is dropped because a positive
    per-query factor cancels in normalised attention (numerator and denominator), which keeps the
    query features bounded. Features are signed, so the row sums can be <= 0.
    """

    side: str

    def __post_init__(self):
        _check_side(self.side)

    def __call__(self, x: jax.Array, projection: Projection) -> jax.Array:
        x = _normalised(x)
        if self.side == "key":
            return trigonometric_features(x, projection)
        return _sin_cos(projection(x)) / math.sqrt(projection.num_features)


@dataclasses.dataclass(frozen=True)
class AngularHybridFeatureMap:
    """Angular hybrid features (HRF Eq. 12, 19) of H^{-1/4} x, for a ``HybridProjection``
    whose ``base`` serves both base estimators (variant II) and ``extra`` is the sign
    projection; width (4 m)(n + 1)."""

    side: str

    def __post_init__(self):
        _check_side(self.side)

    def __call__(self, x: jax.Array, projection: HybridProjection) -> jax.Array:
        base = projection.base
        return angular_hybrid_features(_normalised(x), base, base, projection.extra, side=self.side)


@dataclasses.dataclass(frozen=True)
class ClusterHybridFeatureMap(ExponentialFeatureMap):
    """Cluster-adapted hybrid features (HRF Def. H.2, zero-one coefficients, real diagonal CE
    matrices) of x' = H^{-1/4} x, for a ``HybridProjection`` whose ``extra`` is
    ``ClusterHybridParameters`` (centres in the x' space); width k_q k_k m.

    The features are exponentials, so they are given by their log-features (``exp`` of them
    equals ``rfjax.features.cluster_hybrid_features``; blocks of other clusters get a large
    negative log): ``favor_attention`` then stabilises them like FAVOR+ features. Without
    that, the CE features of a row can all underflow (|A x'| is up to ``max_scale`` times |x'|),
    and the floored denominator gives non-finite gradients.
    """

    side: str

    def __post_init__(self):
        _check_side(self.side)

    def log_features(self, x: jax.Array, projection: HybridProjection) -> jax.Array:
        x = _normalised(x)
        parameters, base = projection.extra, projection.base
        floor = 0.25 * float(jnp.finfo(jnp.promote_types(x.dtype, jnp.float32)).min)
        if self.side == "query":
            cluster = assign_clusters(x, parameters.query_centres)
            alphas = parameters.diagonals[cluster]  # (..., k_k, d)
            active = jax.nn.one_hot(cluster, parameters.num_query_clusters, dtype=bool)
            active = active[..., :, None, None]
        else:
            cluster = assign_clusters(x, parameters.key_centres)
            alphas = jnp.moveaxis(parameters.diagonals[:, cluster], 0, -2)  # (..., k_q, d)
            active = jax.nn.one_hot(cluster, parameters.num_key_clusters, dtype=bool)
            active = active[..., None, :, None]
        u, _ = transform(x[..., None, :], alphas, self.side, diagonal=True)
        logs = base(u) - 0.5 * jnp.sum(u * u, axis=-1, keepdims=True)
        logs = logs - 0.5 * math.log(base.num_features)
        logs = logs[..., None, :, :] if self.side == "query" else logs[..., :, None, :]
        blocks = jnp.where(active, logs, floor)  # (..., k_q, k_k, m)
        return blocks.reshape(*blocks.shape[:-3], -1)
