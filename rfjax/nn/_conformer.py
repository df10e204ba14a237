"""Conformer encoder with exact or random-feature (FAVOR) attention over any softmax-kernel map.

The attention is ``rfjax.nn.PerformerAttention`` (exact softmax or ``favor_attention``); the
random-feature kinds are the feature maps of the softmax kernel registered in
``rfjax.features`` (``conformer_attentions()``), e.g.

* ``"positive"``: FAVOR+ positive features, the Performer.
* ``"trigonometric"``: trigonometric softmax features (HRF Eq. 2, ``trigonometric_features``).
* ``"angular_hybrid"``: the angular (bipolar) hybrid of antithetic positive and trigonometric
  features with an angular coefficient (HRF Eq. 12, 19, ``angular_hybrid_features``, variant II
  with shared base projections), its sign projections drawn with the base projection.
* ``"cluster_hybrid"``: the cluster-adapted hybrid (HRF Sec. 2.4, Def. H.2, zero-one
  coefficients, real diagonal CE matrices; ``cluster_hybrid_features``) with per-head query and
  key centres held, frozen, in the variable collection ``"feature_map"`` (fitted with
  ``fit_conformer_clusters``).

References:
  Gulati et al., "Conformer: Convolution-augmented Transformer for Speech Recognition",
  Interspeech 2020, arXiv:2005.08100; Choromanski et al., "Hybrid Random Features", ICLR 2022,
  arXiv:2110.04367, Sec. 4.3 and App. J.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features
from rfjax._validation import check_rate, is_concrete
from rfjax.attention import data_normalizer
from rfjax.features import FeatureMap
from rfjax.nn._attention import FEATURE_MAP_COLLECTION, PROJECTION_STREAM, PerformerAttention


def conformer_attentions() -> tuple[str, ...]:
    """The attention kinds of ``ConformerEncoder``: ``"exact"`` and every registered feature map
    of the softmax kernel (``rfjax.features.available(kernel="softmax")``)."""
    return ("exact", *features.available(kernel="softmax"))


# --------------------------------------------------------------------------- Conformer


def _sinusoidal_positions(length: int, width: int) -> np.ndarray:
    position = np.arange(length)[:, None]
    frequency = np.exp(-math.log(10_000.0) * np.arange(0, width, 2) / width)
    table = np.zeros((length, width), np.float32)
    table[:, 0::2] = np.sin(position * frequency)
    table[:, 1::2] = np.cos(position * frequency[: width // 2])
    return table


class _FeedForward(nn.Module):
    """LN -> Dense(4 D) -> swish -> dropout -> Dense(D) -> dropout (a Conformer half-step)."""

    expansion: int
    dropout_rate: float

    @nn.compact
    def __call__(self, x, *, train: bool):
        y = nn.LayerNorm()(x)
        y = nn.swish(nn.Dense(self.expansion * x.shape[-1])(y))
        y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = nn.Dense(x.shape[-1])(y)
        return nn.Dropout(self.dropout_rate, deterministic=not train)(y)


class _Convolution(nn.Module):
    """LN -> pointwise Dense(2 D) -> GLU -> depthwise Conv1D -> LayerNorm -> swish -> Dense(D).

    Padded frames are zeroed before the depthwise convolution, so they never leak into real
    frames. LayerNorm replaces the paper's BatchNorm (no batch statistics over padding).
    """

    kernel_size: int
    dropout_rate: float

    @nn.compact
    def __call__(self, x, mask, *, train: bool):
        width = x.shape[-1]
        y = nn.LayerNorm()(x)
        y = nn.glu(nn.Dense(2 * width)(y), axis=-1)
        y = jnp.where(mask[..., None], y, 0)
        y = nn.Conv(width, (self.kernel_size,), padding="SAME", feature_group_count=width)(y)
        y = nn.swish(nn.LayerNorm()(y))
        y = nn.Dense(width)(y)
        return nn.Dropout(self.dropout_rate, deterministic=not train)(y)


class _ConformerBlock(nn.Module):
    """x + FF/2, + MHSA(LN x), + Conv, + FF/2, then LayerNorm (Gulati et al. 2020, Fig. 1)."""

    num_heads: int
    ff_expansion: int
    kernel_size: int
    dropout_rate: float
    attention: dict

    @nn.compact
    def __call__(self, x, mask, *, train: bool, projection_step):
        x = x + 0.5 * _FeedForward(self.ff_expansion, self.dropout_rate)(x, train=train)
        y = nn.LayerNorm()(x)
        y = PerformerAttention(num_heads=self.num_heads, name="attention", **self.attention)(
            y, mask=mask, projection_step=projection_step
        )
        x = x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        x = x + _Convolution(self.kernel_size, self.dropout_rate)(x, mask, train=train)
        x = x + 0.5 * _FeedForward(self.ff_expansion, self.dropout_rate)(x, train=train)
        return nn.LayerNorm()(x)


class ConformerEncoder(nn.Module):
    """A small Conformer for CTC: conv subsampling, Conformer blocks, per-frame logits.

    Input frames (log-mel features) are subsampled 4x in time by two Conv1D layers (kernel 3,
    stride 2, padding 1, ReLU); a sinusoidal position table is added; ``num_layers`` Conformer
    blocks follow; a Dense layer gives ``num_classes`` logits per frame (class 0 is the CTC
    blank by convention of the caller). Padded frames (``mask`` False) are zeroed after each
    subsampling layer and masked as keys in attention, so the outputs at real frames do not
    depend on how much padding follows.

    Attributes:
      num_classes: output classes (including the blank).
      model_dim: D.
      num_layers: Conformer blocks.
      num_heads: attention heads (D divisible by it; head dim H = D / N).
      ff_expansion: feed-forward width multiple.
      kernel_size: depthwise convolution kernel (odd).
      dropout_rate: dropout in the feed-forward, attention output and convolution modules.
      attention: one of ``conformer_attentions()``.
      num_features: m, random projections per head (positive: width m; trigonometric: 2m;
        angular hybrid: 4m(n + 1); cluster hybrid: k^2 m).
      num_sign_features: n, sign projections of the angular hybrid's coefficient (the option
        ``num_sign_features`` of the kinds whose map takes it).
      num_clusters: k query and k key clusters per head (the option ``num_clusters`` of the
        kinds whose map takes it: the cluster hybrid).
      coupling: projection coupling (``rfjax.projections.available()``).
      redraw_interval: redraw projections every this many steps.
      hybrid_eps: floor of the FAVOR denominator for the kinds whose map sets
        ``needs_denominator_floor`` (trigonometric and hybrids). The signed estimators
        (trigonometric, angular hybrid) can estimate a row's normaliser as <= 0, and the
        cluster hybrid's stabilised CE features span a wide range (|A x| up to 10 |x|), so its
        normaliser can underflow; with the default floor (the smallest normal number) such rows
        become inf (forward, signed) or give non-finite gradients (cluster). Rows below the
        floor are biased. Exact and FAVOR+ keep the default floor.
      query_key_norm: cosine attention with a learned per-head temperature for every kind
        (``PerformerAttention.query_key_norm``). The signed kinds need it to train: with raw
        scores they stayed at chance and half their runs diverged (the stop-9 default run of
        ``experiments.conformer_ctc``, 2-5 digit utterances).
      initial_temperature: its temperature at initialisation.

    References:
      Gulati et al., arXiv:2005.08100; Choromanski et al., arXiv:2110.04367, Sec. 4.3, App. J.
    """

    num_classes: int
    model_dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    ff_expansion: int = 4
    kernel_size: int = 15
    dropout_rate: float = 0.0
    attention: str = "positive"
    num_features: int = 32
    num_sign_features: int = 8
    num_clusters: int = 2
    coupling: str = "orthogonal"
    redraw_interval: int = 100
    hybrid_eps: float = 1e-3
    query_key_norm: bool = False
    initial_temperature: float = 1.0

    def _check(self) -> None:
        if self.attention not in conformer_attentions():
            raise ValueError(
                f"attention must be one of {conformer_attentions()}, got {self.attention!r}"
            )
        for name in (
            "num_classes",
            "model_dim",
            "num_layers",
            "num_heads",
            "num_features",
            "num_sign_features",
            "num_clusters",
            "kernel_size",
            "ff_expansion",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.model_dim % self.num_heads:
            raise ValueError(
                f"model_dim ({self.model_dim}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {self.kernel_size}")
        check_rate("dropout_rate", self.dropout_rate)

    def attention_feature_map(self, **options: object) -> FeatureMap:
        """The feature map of a random-feature kind, without its parameters: the registered
        factory with the options it takes among ``num_sign_features``, ``num_clusters`` and
        ``options``."""
        return features.build(
            self.attention,
            num_sign_features=self.num_sign_features,
            num_clusters=self.num_clusters,
            **options,
        )

    def _attention_config(self) -> dict:
        scores = {
            "query_key_norm": self.query_key_norm,
            "initial_temperature": self.initial_temperature,
        }
        if self.attention == "exact":
            return {"attention_kind": "exact", **scores}
        feature_map = self.attention_feature_map()
        return {
            **scores,
            "attention_kind": "performer",
            "coupling": self.coupling,
            "num_features": self.num_features,
            "feature_map": feature_map,
            "redraw_interval": self.redraw_interval,
            "eps": self.hybrid_eps if feature_map.needs_denominator_floor else None,
        }

    @nn.compact
    def __call__(
        self,
        features: jax.Array,
        mask: jax.Array,
        *,
        train: bool = False,
        projection_step: jax.Array | int | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Logits ``(B, T', num_classes)`` and the frame mask ``(B, T')``, T' = ceil(T / 4).

        Args:
          features: ``(B, T, F)`` input frames.
          mask: ``(B, T)`` bool, True at real frames (a prefix of each row).
          train: enables dropout (``"dropout"`` stream).
          projection_step: the step that selects the random projections (Performer kinds).
        """
        self._check()
        if features.ndim != 3 or mask.shape != features.shape[:2]:
            raise ValueError(
                f"features must be (B, T, F) and mask (B, T); got {features.shape} and {mask.shape}"
            )
        x = jnp.where(mask[..., None], features, 0)
        for layer in range(2):
            x = nn.Conv(
                self.model_dim, (3,), strides=(2,), padding=((1, 1),), name=f"subsample_{layer}"
            )(x)
            mask = mask[:, ::2]
            x = jnp.where(mask[..., None], nn.relu(x), 0)
        x = nn.Dense(self.model_dim, name="input_projection")(x)
        x = x + _sinusoidal_positions(x.shape[1], self.model_dim)
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        attention = self._attention_config()
        for layer in range(self.num_layers):
            x = _ConformerBlock(
                num_heads=self.num_heads,
                ff_expansion=self.ff_expansion,
                kernel_size=self.kernel_size,
                dropout_rate=self.dropout_rate,
                attention=attention,
                name=f"block_{layer}",
            )(x, mask, train=train, projection_step=projection_step)
        return nn.Dense(self.num_classes, name="logits")(x), mask


# --------------------------------------------------------------------------- cluster fitting


def fit_conformer_clusters(
    key: jax.Array,
    model: ConformerEncoder,
    variables: dict,
    features: jax.Array,
    mask: jax.Array,
    *,
    num_points: int = 512,
    num_iterations: int = 10,
) -> dict:
    """Fits the data-fitted parameters of the attention's feature map per head: for the cluster
    hybrid, the query and key centres by k-means (HRF Sec. 4.3).

    Runs ``model`` on ``features`` with ``variables``, takes every block's per-head queries and
    keys as they enter the attention (sown by ``PerformerAttention``), scales them by H^{-1/4}
    (as ``favor_attention`` does) and fits the map (``FeatureMap.fit``) per head on
    ``num_points`` real frames drawn uniformly (with replacement) from the unmasked ones. Returns
    ``variables`` with the ``"feature_map"`` collection replaced. The layers are fitted from one
    forward pass (later layers' inputs come from the earlier layers with their old parameters).

    Args:
      key: PRNG key (frame sampling and the fits, e.g. k-means seeding).
      model: a ``ConformerEncoder`` whose attention map has fitted parameters
        (``attention="cluster_hybrid"``).
      variables: its variables (``"params"`` and ``"feature_map"``).
      features, mask: a batch as for ``model``; ``mask`` with at least one real frame
        (``ValueError`` otherwise; inside ``jit``, NaN parameters).
      num_points: frames sampled per fit (>= num_clusters).
      num_iterations: Lloyd iterations of k-means (for maps that take ``num_iterations``).
    """
    fitted_kinds = _fitted_kinds()
    if model.attention not in fitted_kinds:
        raise ValueError(
            f"model.attention must be a kind whose feature map is fitted to data "
            f"({', '.join(fitted_kinds)}), got {model.attention!r}"
        )
    template = model.attention_feature_map(num_iterations=num_iterations)
    (_, frame_mask), state = model.apply(
        variables,
        features,
        mask,
        mutable=["intermediates"],
        rngs={PROJECTION_STREAM: jax.random.fold_in(key, 0)},
    )
    flat_mask = frame_mask.reshape(-1)
    if is_concrete(flat_mask) and not np.any(np.asarray(flat_mask)):
        raise ValueError(
            f"mask must mark at least one real frame to fit the feature map on; got a mask of "
            f"shape {jnp.shape(mask)} with none"
        )
    # Traced, a mask without a real frame fits NaN parameters (their p was 0 / 0).
    real = jnp.any(flat_mask)
    probabilities = flat_mask / jnp.sum(flat_mask)
    fitted_maps = {}
    for layer in range(model.num_layers):
        name = f"block_{layer}"
        sown = state["intermediates"][name]["attention"]
        layer_key = jax.random.fold_in(key, layer + 1)
        rows = jax.random.choice(layer_key, flat_mask.shape[0], (num_points,), p=probabilities)

        def points(side: str, rows=rows, sown=sown) -> jax.Array:
            heads = sown[f"{side}_heads"][0]  # (B, T', N, H)
            per_head = jnp.moveaxis(heads.reshape(-1, *heads.shape[-2:])[rows], 1, 0)
            return per_head * data_normalizer(per_head.shape[-1])  # (N, P, H)

        queries, keys = points("query"), points("key")
        head_keys = jax.random.split(jax.random.fold_in(layer_key, 1), model.num_heads)
        fitted = jax.vmap(lambda k, q, kk: template.init(k, q.shape[-1]).fit(k, q, kk))(
            head_keys, queries, keys
        )
        fitted_maps[name] = {
            "attention": {
                field: jnp.where(real, getattr(fitted, field), jnp.nan)
                for field in template.fitted_fields
            }
        }
    return {**variables, FEATURE_MAP_COLLECTION: fitted_maps}


def _fitted_kinds() -> tuple[str, ...]:
    """The kinds whose feature map has data-fitted parameters."""
    return tuple(k for k in conformer_attentions()[1:] if features.get(k)().fitted_fields)


__all__ = [
    "ConformerEncoder",
    "conformer_attentions",
    "fit_conformer_clusters",
]
