"""The feature-map protocol: one object per estimator, used by attention, scikit-learn and models.

A ``FeatureMap`` gives, for each side of an estimator, features ``(..., d) -> (..., width)``
whose dot products estimate a kernel: query features phi(x) . key features psi(y) ~ K(x, y)
(symmetric maps give the same features on both sides). Maps are frozen dataclasses registered
as pytrees: their options (``antithetic``, numbers of clusters...) are static fields, their
parameters (a sign projection, cluster centres, data statistics) are array leaves, so a map passes
through ``jit``/``vmap`` like a projection and can be stacked over attention heads.

Parameters enter in two ways, each a pure function returning a new map:

* ``init(key, dim)``: parameters drawn at random (redrawn with the projection), and data-fitted
  parameters at a neutral start;
* ``fit(key, queries, keys)``: parameters fitted to samples of queries and keys (the names in
  ``fitted_fields``); a model keeps them as frozen variables.

The optional log-space form ``scaled_features`` writes phi(x) = psi(x) exp(s(x)) with a per-row
log-scale s (a constant under differentiation). Attention uses it to stabilise: a per-query factor
cancels in normalised attention and is dropped; per-key factors are shifted by their running
maximum. Exponential maps (phi = exp(l)) implement ``log_features`` and get the form for free.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import check_int
from rfjax.projections import Projection

Side = Literal["query", "key"]
SIDES: tuple[Side, ...] = ("query", "key")


class ScaledFeatures(NamedTuple):
    """phi = features * exp(log_scale)[..., None]: the log-space form of a feature map.

    Attributes:
      features: psi, shape ``(..., width)``; it carries all of phi's gradient.
      log_scale: s, shape ``(...)``, a constant under differentiation (``stop_gradient``).
    """

    features: jax.Array
    log_scale: jax.Array

    def unscaled(self) -> jax.Array:
        """phi = psi e^s, shape ``(..., width)``. Where e^s overflows the dtype, the entries are
        +-inf, and those where psi = 0 stay 0 (never 0 * inf = NaN)."""
        scale = jnp.exp(self.log_scale)[..., None]
        return jnp.where(jnp.isinf(scale) & (self.features == 0), 0, self.features * scale)


class FeatureMap(abc.ABC):
    """A random-feature estimator: query features . key features estimate a kernel K.

    Subclasses are frozen dataclasses registered with ``jax.tree_util.register_dataclass``
    (options static, parameters leaves) and implement ``features``. Register a named map with
    ``rfjax.features.register``.

    Attributes:
      symmetric: query and key features are the same function (the map can build a Gram
        matrix Z Z^T); ``False`` for asymmetric estimators (hybrid, complex-exponential).
      needs_denominator_floor: normalised attention with this map can estimate a row's
        normaliser as <= 0 (signed features) or underflow (features spanning a wide range), so
        FAVOR needs a working denominator floor ``eps`` (see ``rfjax.attention.favor_attention``).
      fitted_fields: names of the fields that ``fit`` sets from data.
    """

    symmetric: ClassVar[bool] = True
    needs_denominator_floor: ClassVar[bool] = False
    fitted_fields: ClassVar[tuple[str, ...]] = ()
    # Declared for type checkers (``replace``): every subclass is a dataclass.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @abc.abstractmethod
    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        """phi_side(x): ``(..., d) -> (..., width)`` for a projection of d columns."""

    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        """The log-space form (psi, s) with phi = psi exp(s); default (phi, 0)."""
        phi = self.features(x, projection, side=side)
        return ScaledFeatures(phi, jnp.zeros(phi.shape[:-1], phi.dtype))

    @property
    def has_log_space_form(self) -> bool:
        """Whether ``scaled_features`` is more than the default (phi, 0)."""
        return type(self).scaled_features is not FeatureMap.scaled_features

    def init(self, key: jax.Array, dim: int, *, dtype: DTypeLike = jnp.float32) -> FeatureMap:
        """The map with its random parameters drawn (and fitted ones at their start); default
        ``self`` (no parameters). ``key`` must be independent of the projection's; ``dim`` is
        the input dimension d >= 1."""
        del key, dtype
        check_int("dim", dim, minimum=1)
        return self

    def fit(self, key: jax.Array, queries: jax.Array, keys: jax.Array) -> FeatureMap:
        """The map with ``fitted_fields`` fitted to samples ``queries (n_q, d)``, ``keys
        (n_k, d)``; default ``self`` (nothing to fit)."""
        del key, queries, keys
        return self

    def replace(self, **changes: object) -> FeatureMap:
        """A copy with some fields replaced (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


class AffineLogForm(NamedTuple):
    """Log-features that are affine in x plus a multiple of |x|^2:
    l(x) = x W^T + b + norm_weight |x|^2, the form fused attention kernels compute from the
    rows (``rfjax.attention.favor_attention(..., implementation="pallas...")``).

    Attributes:
      weights: W ``(width, d)``.
      bias: b ``(width,)``.
      norm_weight: the coefficient of |x|^2 (a Python float: -1/2 for the softmax kernel).
    """

    weights: jax.Array
    bias: jax.Array
    norm_weight: float

    def log_features(self, x: jax.Array) -> jax.Array:
        """l(x) ``(..., width)`` for x ``(..., d)``."""
        squared = jnp.sum(x * x, axis=-1, keepdims=True)
        return x @ self.weights.T + self.bias + self.norm_weight * squared


class ExponentialFeatureMap(FeatureMap):
    """A map phi(x) = exp(l(x)) given by its log-features l (positive features).

    Subclasses implement ``log_features``; ``scaled_features`` shifts l by its row maximum, so
    the largest entry of psi is exactly 1 and nothing overflows. Attention
    (``rfjax.attention.favor_attention``, causal and bidirectional, and decoding) shifts every
    exponential map's keys per feature, from l: exact at any norm.
    """

    @abc.abstractmethod
    def log_features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        """l_side(x), shape ``(..., width)``."""

    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        return jnp.exp(self.log_features(x, projection, side=side))

    def affine_log_form(self, projection: Projection, *, side: Side) -> AffineLogForm | None:
        """``log_features`` as an ``AffineLogForm`` (W, b, norm weight) when it is one (positive
        features, OPRF), else ``None`` (the default)."""
        del projection, side
        return None

    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        logs = self.log_features(x, projection, side=side)
        shift = jax.lax.stop_gradient(jnp.max(logs, axis=-1))
        return ScaledFeatures(jnp.exp(logs - shift[..., None]), shift)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FeatureMapPair(FeatureMap):
    """Two maps as one estimator: ``query``'s query features with ``key``'s key features.

    For example softmax-kernel queries with ReLU keys, or any two maps whose features have the
    same width. Parameters live in the two maps (``init`` draws both, with split keys).

    Attributes:
      query: the map of the query side.
      key: the map of the key side.

    Examples:
      >>> from rfjax import features
      >>> pair = features.FeatureMapPair(features.PositiveFeatureMap(), features.ReluFeatureMap())
      >>> pair.symmetric, pair.has_log_space_form
      (False, False)
    """

    query: FeatureMap
    key: FeatureMap

    symmetric: ClassVar[bool] = False

    def __post_init__(self):
        for name in ("query", "key"):
            value = getattr(self, name)
            if not isinstance(value, FeatureMap):
                raise TypeError(
                    f"FeatureMapPair.{name} must be an rfjax.features.FeatureMap, got "
                    f"{type(value).__name__}"
                )

    @property
    def needs_denominator_floor(self) -> bool:  # type: ignore[override]
        return self.query.needs_denominator_floor or self.key.needs_denominator_floor

    @property
    def has_log_space_form(self) -> bool:
        return self.query.has_log_space_form and self.key.has_log_space_form

    def _side(self, side: Side) -> FeatureMap:
        return self.query if side == "query" else self.key

    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        return self._side(side).features(x, projection, side=side)

    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        return self._side(side).scaled_features(x, projection, side=side)

    def init(self, key: jax.Array, dim: int, *, dtype: DTypeLike = jnp.float32) -> FeatureMap:
        query_key, key_key = jax.random.split(key)
        return FeatureMapPair(
            self.query.init(query_key, dim, dtype=dtype), self.key.init(key_key, dim, dtype=dtype)
        )

    def fit(self, key: jax.Array, queries: jax.Array, keys: jax.Array) -> FeatureMap:
        """Both maps fitted to the samples, each as it is fitted alone (with split keys): a
        pair of one data-fitted map fits it on both sides (the default ``fit`` kept a
        data-fitted side at its unfitted start)."""
        query_key, key_key = jax.random.split(key)
        return FeatureMapPair(
            self.query.fit(query_key, queries, keys), self.key.fit(key_key, queries, keys)
        )


def exponential_side(fmap: FeatureMap, side: Side) -> ExponentialFeatureMap | None:
    """The exponential map (phi = exp(l), ``ExponentialFeatureMap``) that gives ``side``'s
    features of ``fmap`` (the map itself, or a ``FeatureMapPair``'s map of that side), or
    ``None`` if that side's features are not exponentials of log-features. Attention and the
    patch importance shift such features per feature, in log space.

    Examples:
      >>> from rfjax import features
      >>> pair = features.FeatureMapPair(features.PositiveFeatureMap(), features.ReluFeatureMap())
      >>> type(features.exponential_side(pair, "query")).__name__
      'PositiveFeatureMap'
      >>> features.exponential_side(pair, "key") is None
      True
    """
    if isinstance(fmap, FeatureMapPair):
        fmap = fmap.query if side == "query" else fmap.key
    return fmap if isinstance(fmap, ExponentialFeatureMap) else None
