"""Data-fitted feature maps (OPRF/FAVOR++, DERF/FAVOR#) in attention: their statistics.

OPRF and DERF choose their parameters from the statistics of the queries and keys they will
see (``rfjax.features.input_statistics``). ``favor_attention`` and ``favor_attention_weights``
fit an unfitted one (its parameters ``None``, e.g. given by name) to the current inputs
(``fit_if_unfitted``); decoding is causal and needs a fitted map (``check_fitted``):

* bidirectional attention: per head, from the current queries and unmasked keys (after the data
  normaliser H^{-1/4}), pooled over the batch: one parameter set per head (a ``PerHead`` map).
  Every output then depends on every query and key of the batch through these d + d^2 numbers
  per head (as batch statistics do in batch normalisation), never on masked keys;
* causal attention: statistics of the current keys would let position t see keys j > t, so an
  unfitted map is rejected there. Fit it once on a calibration sample
  (``fmap.fit(key, queries, keys)``, e.g. from training data or a prompt prefix) and pass the
  fitted map: fixed statistics keep every output a function of positions j <= t only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax import features
from rfjax.attention._head_features import normalise
from rfjax.attention._per_head import PerHead


def is_unfitted(fmap: object) -> bool:
    """Whether ``fmap`` is an OPRF or DERF map still without its data-fitted parameters."""
    if isinstance(fmap, features.OptimizedPositiveFeatureMap):
        return fmap.statistics is None
    if isinstance(fmap, features.DenseExponentialFeatureMap):
        return fmap.parameters is None
    return False


def _unfitted_in_causal(fmap: object) -> ValueError:
    return ValueError(
        f"feature_map {type(fmap).__name__} has no fitted statistics, and fitting them to "
        "the current keys in causal attention would let each position see later keys; fit "
        "it once on a calibration sample (fmap.fit(key, queries, keys)) and pass the fitted "
        "map"
    )


def check_fitted(fmap: object) -> None:
    """Causal attention that cannot fit (decoding): an unfitted OPRF/DERF map is an error.

    Raises:
      ValueError: naming ``feature_map``, if ``fmap`` is unfitted (``is_unfitted``).
    """
    if is_unfitted(fmap):
        raise _unfitted_in_causal(fmap)


def _head_statistics(query: jax.Array, key: jax.Array, valid: jax.Array):
    """InputStatistics per head, leaves ``(N, ...)``, from BTNH queries and keys, keys masked."""
    query, key = normalise(query), normalise(key)
    weights = valid.astype(key.dtype)[..., None, None]  # (B, S, 1, 1)
    count = jnp.maximum(jnp.sum(weights, axis=(0, 1)), 1.0)  # (1, 1)
    num_queries = query.shape[0] * query.shape[1]
    return features.InputStatistics(
        jnp.sum(query, axis=(0, 1)) / num_queries,
        jnp.sum(weights * key, axis=(0, 1)) / count,
        jnp.einsum("btni,btnj->nij", query, query) / num_queries,
        jnp.einsum("bsni,bsnj->nij", weights * key, key) / count[..., None],
    )


def fit_to_inputs(
    fmap: features.FeatureMap, query: jax.Array, key: jax.Array, mask: jax.Array, *, causal: bool
) -> PerHead:
    """The unfitted data-fitted ``fmap`` fitted per head to BTNH ``query``/``key`` (module
    docstring); ``mask (B, S)`` marks the keys to use.

    Raises:
      ValueError: with ``causal=True`` (fit the map on a calibration sample instead).
    """
    if causal:
        raise _unfitted_in_causal(fmap)
    statistics = _head_statistics(query, key, mask)
    if isinstance(fmap, features.OptimizedPositiveFeatureMap):
        return PerHead(fmap.replace(statistics=statistics))
    if not isinstance(fmap, features.DenseExponentialFeatureMap):
        raise TypeError(f"feature_map {type(fmap).__name__} is not a data-fitted (OPRF/DERF) map")
    parameters = features.dense_exponential_parameters(statistics, variant=fmap.variant)
    return PerHead(fmap.replace(parameters=parameters))


def fit_if_unfitted(
    fmap: features.FeatureMap,
    map_axis: int | None,
    query: jax.Array,
    key: jax.Array,
    mask: jax.Array,
    *,
    causal: bool,
    dtype: jnp.dtype,
) -> tuple[features.FeatureMap, int | None]:
    """(map, head axis) as attention uses them: ``fmap`` and ``map_axis`` unchanged if it is
    not an unfitted data-fitted map, else the map fitted per head (``fit_to_inputs``, axis 0)
    to BTNH ``query``/``key`` cast to the computation ``dtype``.

    Raises:
      ValueError: for an unfitted map with ``causal=True``.
    """
    if not is_unfitted(fmap):
        return fmap, map_axis
    fitted = fit_to_inputs(fmap, query.astype(dtype), key.astype(dtype), mask, causal=causal)
    return fitted.stacked, 0
