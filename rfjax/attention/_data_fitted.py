"""Data-fitted feature maps (OPRF/FAVOR++, DERF/FAVOR#) in attention: their statistics.

OPRF and DERF choose their parameters from the statistics of the queries and keys they will
see (``rfjax.features.input_statistics``). ``favor_attention`` and ``favor_attention_weights``
fit an unfitted one (its parameters ``None``, e.g. given by name) to the current inputs
(``fit_if_unfitted``); decoding is causal and needs a fitted map (``check_fitted``):

* bidirectional attention: per head, from the current queries and unmasked keys (after the data
  normaliser H^{-1/4}; rows holding a NaN or inf left out), pooled over the batch: one
  parameter set per head (a ``PerHead`` map).
  Every output then depends on every query and key of the batch through these d + d^2 numbers
  per head (as batch statistics do in batch normalisation), never on masked keys. With a
  sequence split over devices (``sequence_axis``) the sums and counts behind the statistics are
  added over the mesh axis (``psum``) before they are divided, so every device fits the map of
  the whole sequence, as one device does (each fitting its own shard gave outputs off by up to
  24% relative, issue 32). Inside a ``shard_map`` that also splits the batch over another axis,
  each batch shard is fitted to its own statistics (as data-parallel batch normalisation is);
  on global arrays (``favor_attention`` outside ``shard_map``, ``_global_split``) the sums are
  added over every axis that splits the batch or the sequence, so the map is one device's;
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
    """Whether ``fmap`` is an OPRF or DERF map still without its data-fitted parameters, or a
    ``FeatureMapPair`` with such a map on a side."""
    if isinstance(fmap, features.FeatureMapPair):
        return is_unfitted(fmap.query) or is_unfitted(fmap.key)
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


def _head_statistics(
    query: jax.Array, key: jax.Array, valid: jax.Array, sequence_axis: str | tuple[str, ...] | None
) -> features.InputStatistics:
    """InputStatistics per head, leaves ``(N, ...)``, from BTNH queries and keys, of the finite
    rows only and the unmasked keys (so that a NaN or inf row reaches only the outputs that
    attend to it, not every output of its head); with ``sequence_axis``, of the whole sequence
    split along that mesh axis: the sums and counts of every device are added (``psum``)
    before they are divided."""
    query, key = normalise(query), normalise(key)
    counted = (
        jnp.all(jnp.isfinite(query), axis=-1),  # (B, T, N)
        valid[..., None] & jnp.all(jnp.isfinite(key), axis=-1),  # (B, S, N)
    )
    # Rows left out are selected away (never multiplied by 0: they may hold NaN).
    query, key = (jnp.where(c[..., None], x, 0) for c, x in zip(counted, (query, key), strict=True))
    sums = (
        jnp.sum(query, axis=(0, 1)),
        jnp.sum(key, axis=(0, 1)),
        jnp.einsum("btni,btnj->nij", query, query),
        jnp.einsum("bsni,bsnj->nij", key, key),
        *(jnp.sum(c, axis=(0, 1), dtype=query.dtype) for c in counted),  # (N,) each
    )
    if sequence_axis is not None:
        sums = jax.lax.psum(sums, sequence_axis)
    query_sum, key_sum, query_moment, key_moment, num_queries, num_keys = sums
    num_queries, num_keys = (jnp.maximum(n, 1.0)[:, None] for n in (num_queries, num_keys))
    return features.InputStatistics(
        query_sum / num_queries,
        key_sum / num_keys,
        query_moment / num_queries[..., None],
        key_moment / num_keys[..., None],
    )


def fit_to_inputs(
    fmap: features.FeatureMap,
    query: jax.Array,
    key: jax.Array,
    mask: jax.Array,
    *,
    causal: bool,
    sequence_axis: str | tuple[str, ...] | None = None,
) -> PerHead:
    """The unfitted data-fitted ``fmap`` fitted per head to BTNH ``query``/``key`` (module
    docstring); ``mask (B, S)`` marks the keys to use; with ``sequence_axis``, the local shards
    of a sequence split along that mesh axis, fitted to the statistics of the whole sequence
    (a tuple of axes: the shards of a batch and sequence split along them).

    Raises:
      ValueError: with ``causal=True`` (fit the map on a calibration sample instead).
    """
    if causal:
        raise _unfitted_in_causal(fmap)
    if isinstance(fmap, features.FeatureMapPair):  # attention fits one map per head, not pairs
        raise ValueError(
            "feature_map FeatureMapPair has a data-fitted map without its parameters on a "
            "side; fit the pair once on a calibration sample (fmap.fit(key, queries, keys)) and "
            "pass the fitted pair"
        )
    statistics = _head_statistics(query, key, mask, sequence_axis)
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
    sequence_axis: str | None = None,
) -> tuple[features.FeatureMap, int | None]:
    """(map, head axis) as attention uses them: ``fmap`` and ``map_axis`` unchanged if it is
    not an unfitted data-fitted map, else the map fitted per head (``fit_to_inputs``, axis 0)
    to BTNH ``query``/``key`` cast to the computation ``dtype`` (the local shards of a sequence
    split along the mesh axis ``sequence_axis``, if given: fitted to the whole sequence).

    Raises:
      ValueError: for an unfitted map with ``causal=True``.
    """
    if not is_unfitted(fmap):
        return fmap, map_axis
    query, key = query.astype(dtype), key.astype(dtype)
    fitted = fit_to_inputs(fmap, query, key, mask, causal=causal, sequence_axis=sequence_axis)
    return fitted.stacked, 0
