"""Random features of the proposal kernel exp(q_bar.e_bar / tau) of normalised queries and
class embeddings (``proposal_features``, ``proposal_estimates``), for every feature map that
``rfjax.features`` registers as an estimator of the softmax kernel (``feature_proposals()``)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from rfjax import features, projections
from rfjax._validation import check_choice, check_inputs, check_int, check_real, is_concrete
from rfjax.features import (
    AngularHybridFeatureMap,
    FeatureMap,
    GaussianHybridFeatureMap,
    HybridParts,
    Side,
    fourier_features,
    hybrid_gram,
    positive_features,
    trigonometric_features,
)


def feature_proposals() -> tuple[str, ...]:
    """The random-feature proposals: every feature map registered in ``rfjax.features`` as an
    estimator of the softmax kernel (``features.available(kernel="softmax")``), so a newly
    registered map is a proposal too."""
    return features.available(kernel="softmax")


Temperature = float | jax.Array


def _check_temperature(temperature: Temperature) -> Temperature:
    """A Python temperature must be a finite real > 0; an array must be a float scalar, > 0
    when concrete (a traced value is not checked)."""
    if isinstance(temperature, jax.Array):
        if temperature.shape != () or not jnp.issubdtype(temperature.dtype, jnp.floating):
            raise ValueError(
                f"temperature must be a positive float or a float scalar array, got an array of "
                f"shape {temperature.shape} and dtype {temperature.dtype}"
            )
        if is_concrete(temperature) and not 0 < float(temperature) < math.inf:
            raise ValueError(f"temperature must be a finite real > 0, got {temperature}")
        return temperature
    return check_real("temperature", temperature, positive=True)


def normalize_for_proposal(x: jax.Array, temperature: Temperature) -> jax.Array:
    """x / (|x| sqrt(tau)): rows on the sphere of radius 1/sqrt(tau), so that
    SM(q', e') = exp(q_bar.e_bar / tau). Zero rows stay zero."""
    temperature = _check_temperature(temperature)
    norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / (jnp.maximum(norms, jnp.finfo(x.dtype).tiny) * jnp.sqrt(temperature))


def _gaussian_hybrid_on_sphere(
    x: jax.Array,
    radius: Temperature,
    base: projections.Projection,
    coefficient: projections.Projection,
    side: Side,
) -> HybridParts:
    """The ``HybridParts`` of ``gaussian_hybrid_features(x, base, base, coefficient, side=side,
    bandwidth=radius, radius=radius)`` for inputs x on the sphere of radius r, with r possibly
    traced (log-scale 0).

    With bandwidth = radius the coefficient exp(-|x + y|^2 / (2 r^2)) is a function of the unit
    vectors x / r, y / r only and c = exp(-2), so nothing needs r as a Python number.
    """
    positive = positive_features(x, base, antithetic=True)
    trigonometric = trigonometric_features(x, base)
    unit = x / radius
    one_minus_c = -math.expm1(-2.0)
    gauss = fourier_features(unit if side == "query" else -unit, coefficient)
    coefficient_features = gauss * (1.0 / math.sqrt(one_minus_c))
    return HybridParts(
        [positive, trigonometric],
        [coefficient_features],
        jnp.zeros(x.shape[:-1], x.dtype),
        (1.0 - 1.0 / one_minus_c,),
        side,
    )


def _draw_held_projections(
    feature_map: FeatureMap, key: jax.Array, sampler: Any, dtype: Any
) -> FeatureMap:
    """The map with every projection it holds (a hybrid's coefficient rows) redrawn with the
    proposal's coupling, from ``key`` (split when it holds several)."""
    leaves, tree = jax.tree.flatten(
        feature_map, is_leaf=lambda x: isinstance(x, projections.Projection)
    )
    held = [i for i, leaf in enumerate(leaves) if isinstance(leaf, projections.Projection)]
    keys = [key] if len(held) == 1 else list(jax.random.split(key, max(len(held), 1)))
    for i, k in zip(held, keys, strict=False):
        leaves[i] = sampler(k, leaves[i].dim, leaves[i].num_features, dtype=dtype)
    return jax.tree.unflatten(tree, leaves)


def proposal_features(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int = 8,
    temperature: Temperature = 1.0,
    coupling: str = "orthogonal",
) -> tuple[jax.Array, jax.Array]:
    """Random features of the proposal kernel exp(q_bar.e_bar / tau) for queries and classes.

    The estimate of the kernel is ``query_features @ class_features.T``. The map is the
    registered map ``proposal`` (``rfjax.features.build`` with ``num_sign_features`` and
    ``num_coefficient_features`` n, and bandwidth and radius 1/sqrt(tau)), its random parameters
    drawn by its ``init`` and every projection it holds redrawn with ``coupling``
    (``rfjax.projections.get``), data-fitted parameters fitted to the normalised queries and
    classes. m = ``num_features`` base rows (for the hybrids shared by the positive and
    trigonometric estimators, variant II of HRF Theorem 3.1; widths: antithetic positive and
    trigonometric 2m, angular hybrid 4m(n + 1), Gaussian hybrid 4m(2n + 1)). Inputs are
    normalised (``normalize_for_proposal``) and treated as constants (``stop_gradient``).
    Estimates grow like exp(1/tau): keep tau >= 1/80 in float32.

    Args:
      key: PRNG key for the projections.
      queries: ``(N, d)`` query vectors q.
      embeddings: ``(V, d)`` class embeddings e_i.
      proposal: one of ``feature_proposals()``.
      num_features: m >= 1.
      num_coefficient_features: n >= 1 (hybrids only).
      temperature: tau > 0, a Python float or a float scalar array (may be traced).
      coupling: coupling name for all projections.

    Returns:
      ``(query_features (N, W), class_features (V, W))``.

    Raises:
      TypeError, ValueError: for a bad argument (named in the message).

    Examples:
      >>> import jax
      >>> q, e = jax.random.normal(jax.random.key(0), (2, 5, 4))
      >>> a, b = proposal_features(jax.random.key(1), q, e, proposal="angular_hybrid",
      ...                          num_features=2, num_coefficient_features=3)
      >>> (a @ b.T).shape, a.shape[-1]
      ((5, 5), 32)
    """
    query_side, class_side = _proposal_sides(
        key,
        queries,
        embeddings,
        proposal=proposal,
        num_features=num_features,
        num_coefficient_features=num_coefficient_features,
        temperature=temperature,
        coupling=coupling,
    )
    return _flat(query_side), _flat(class_side)


def proposal_estimates(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int = 8,
    temperature: Temperature = 1.0,
    coupling: str = "orthogonal",
) -> jax.Array:
    """The kernel estimates K-hat(q_i, e_j) of every query and class, ``(N, V)``: the product
    ``query_features @ class_features.T`` of ``proposal_features`` (same arguments and
    errors), computed for the angular and Gaussian hybrids from their factors
    (``rfjax.features.hybrid_gram``: N V (4 m + n) multiply-adds for the angular hybrid
    instead of N V 4 m (n + 1)).

    Examples:
      >>> import jax
      >>> q, e = jax.random.normal(jax.random.key(0), (2, 5, 4))
      >>> options = dict(proposal="angular_hybrid", num_features=2, num_coefficient_features=3)
      >>> a, b = proposal_features(jax.random.key(1), q, e, **options)
      >>> estimates = proposal_estimates(jax.random.key(1), q, e, **options)
      >>> estimates.shape, bool(jax.numpy.allclose(estimates, a @ b.T, rtol=1e-4, atol=1e-5))
      ((5, 5), True)
    """
    query_side, class_side = _proposal_sides(
        key,
        queries,
        embeddings,
        proposal=proposal,
        num_features=num_features,
        num_coefficient_features=num_coefficient_features,
        temperature=temperature,
        coupling=coupling,
    )
    if isinstance(query_side, HybridParts) and isinstance(class_side, HybridParts):
        return hybrid_gram(query_side, class_side)
    return _flat(query_side) @ _flat(class_side).T


def _flat(side: jax.Array | HybridParts) -> jax.Array:
    """Flat features (Lemma 2.3 for ``HybridParts``)."""
    if isinstance(side, HybridParts):
        return side.scaled_features().unscaled()
    return side


def _proposal_sides(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int,
    temperature: Temperature,
    coupling: str,
) -> tuple[jax.Array | HybridParts, jax.Array | HybridParts]:
    """The query and class sides of ``proposal_features``: ``HybridParts`` for the angular and
    Gaussian hybrids, flat features for the other maps."""
    proposal = check_choice("proposal", proposal, feature_proposals())
    num_features = check_int("num_features", num_features, minimum=1)
    num_coefficient_features = check_int(
        "num_coefficient_features", num_coefficient_features, minimum=1
    )
    temperature = _check_temperature(temperature)
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    sampler = projections.get(coupling)
    dim = queries.shape[-1]
    q, e = (
        normalize_for_proposal(jax.lax.stop_gradient(x), temperature) for x in (queries, embeddings)
    )
    traced = isinstance(temperature, jax.Array)
    radius = 1.0 if traced else 1.0 / math.sqrt(float(temperature))
    feature_map = features.build(
        proposal,
        num_sign_features=num_coefficient_features,
        num_coefficient_features=num_coefficient_features,
        bandwidth=radius,
        radius=radius,
    )
    base_key, map_key = jax.random.split(key)
    base = sampler(base_key, dim, num_features, dtype=queries.dtype)
    feature_map = feature_map.init(map_key, dim, dtype=queries.dtype)
    feature_map = _draw_held_projections(feature_map, map_key, sampler, queries.dtype)
    feature_map = feature_map.fit(map_key, q, e)
    if traced and isinstance(feature_map, GaussianHybridFeatureMap):
        # Its bandwidth and radius are static fields: the on-sphere form takes a traced radius.
        coefficient = feature_map.coefficient_projection
        assert coefficient is not None
        r = 1.0 / jnp.sqrt(temperature)
        return (
            _gaussian_hybrid_on_sphere(q, r, base, coefficient, "query"),
            _gaussian_hybrid_on_sphere(e, r, base, coefficient, "key"),
        )
    if isinstance(feature_map, (AngularHybridFeatureMap, GaussianHybridFeatureMap)):
        return (
            _checked_parts(feature_map.hybrid_parts(q, base, side="query")),
            _checked_parts(feature_map.hybrid_parts(e, base, side="key")),
        )
    return (
        feature_map.features(q, base, side="query"),
        feature_map.features(e, base, side="key"),
    )


def _checked_parts(parts: HybridParts) -> HybridParts:
    """``parts``, after checking (outside ``jit``) that its scale e^s is finite, as the maps'
    ``features`` check their output (``exp(1/tau)`` overflows the dtype for small tau)."""
    scale = jnp.exp(parts.log_scale)
    if is_concrete(scale) and not bool(jnp.all(jnp.isfinite(scale))):
        raise ValueError(
            "the proposal's features overflow the dtype: their scale e^(1/(2 tau)) is not "
            "finite; use a larger temperature (tau >= 1/80 in float32)"
        )
    return parts
