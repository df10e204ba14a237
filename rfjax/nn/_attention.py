"""PerformerAttention: a drop-in for ``flax.linen.MultiHeadDotProductAttention``."""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax import features
from rfjax.attention import PerHead, draw_projection, favor_attention, redraw_key
from rfjax.features import FeatureMap
from rfjax.projections import Projection
from rfjax.projections import available as available_couplings

AttentionKind = Literal["exact", "performer"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = ("exact", "performer")
PROJECTION_STREAM = "projection"
FEATURE_MAP_COLLECTION = "feature_map"


def _key_padding_mask(mask: jax.Array, batch: int, key_length: int) -> jax.Array:
    """A Flax attention mask reduced to the key padding mask (B, S) that FAVOR supports."""
    mask = jnp.asarray(mask)
    if mask.ndim == 2:
        return jnp.broadcast_to(mask, (batch, key_length)).astype(bool)
    if mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        return jnp.broadcast_to(mask[:, 0, 0, :], (batch, key_length)).astype(bool)
    raise ValueError(
        "attention_kind='performer' supports key padding masks only: mask must have shape "
        f"(B, S) or (B, 1, 1, S) with (B, S) = ({batch}, {key_length}); got {mask.shape}. "
        "Use causal=True for causal masking; general (B, N, T, S) masks need "
        "attention_kind='exact'"
    )


class PerformerAttention(nn.Module):
    """Multi-head attention, exact or Performer (FAVOR), shaped like Flax's multi-head attention.

    Parameters are those of ``flax.linen.MultiHeadDotProductAttention`` (``query``, ``key``,
    ``value`` DenseGeneral to ``(N, H)`` and ``out`` from ``(N, H)``), so the two share a
    parameter layout. ``attention_kind="exact"`` computes softmax(q k^T / sqrt(H)) v;
    ``"performer"`` replaces it with ``rfjax.attention.favor_attention`` over ``num_features``
    random features per head drawn with ``coupling``.

    Projections and the step: the random projection is not a parameter and is never stored. It
    is drawn on every call as ``draw_projection(redraw_key(rng, step, redraw_interval), ...)``
    (one independent draw per head), where ``rng = self.make_rng("projection")`` comes from the
    caller's RNG stream ``"projection"`` and ``step = projection_step`` is passed explicitly by
    the caller (the trainer passes its step counter; ``None`` means step 0). Hence

    * the caller keeps the stream key constant over training (``rngs={"projection": base}``)
      and features are redrawn every ``redraw_interval`` steps, deterministically: the same
      (base key, step) gives the same projection, on every device and after a resume;
    * the caller can equally redraw per call by passing a fresh stream key.

    At ``init`` without a ``"projection"`` stream, the ``"params"`` stream is used for the
    (discarded) projection; ``apply`` without it raises. The drawn projection matrices are sown
    into the ``"intermediates"`` collection (name ``"projection"``) for inspection, with the
    per-head queries and keys that enter the attention (``"query_heads"``, ``"key_heads"``,
    shape ``(B, T, N, H)``).

    Feature maps with parameters (``rfjax.features.FeatureMap``): the random ones are drawn per
    head by the map's ``init`` from the same stream (a second key, redrawn with the projection);
    the data-fitted ones (the map's ``fitted_fields``, e.g. the cluster hybrid's centres) are
    variables of the collection ``"feature_map"`` of shape ``(N, ...)``, started by ``init`` and
    set by ``fit`` (e.g. ``rfjax.nn.fit_conformer_clusters``); they are not trained (gradients
    are stopped).

    Attributes:
      num_heads: N.
      qkv_features: width of q, k, v (N * H); default the input width.
      out_features: output width; default the input width.
      dropout_rate: dropout on the attention weights (exact only: the Performer never forms
        them; a non-zero rate with ``attention_kind="performer"`` raises).
      deterministic: default of the call argument.
      dtype: computation dtype (default inferred from inputs and params).
      param_dtype: parameter dtype.
      kernel_init, bias_init, use_bias: as in Flax.
      attention_kind: ``"exact"`` or ``"performer"``.
      coupling: a name from ``rfjax.projections.available()`` ("gaussian" = IID,
        "orthogonal" = ORF, "simplex" = SimRF, ...).
      num_features: m, random features per head.
      feature_map: a name from ``rfjax.features.available()`` ("positive", "positive_antithetic",
        "relu", "trigonometric", ...) or a ``FeatureMap`` without its parameters (they are
        drawn or fitted per head, see above).
      causal: causal (autoregressive) attention.
      redraw_interval: redraw the projection every this many steps (>= 1).
      chunk_size: chunk length of causal prefix sums.
      query_key_norm: score each head's query and key as tau q^.k^ (unit vectors, cosine
        attention with a learned per-head temperature tau > 0, parameter ``log_temperature``)
        instead of q.k / sqrt(H), for both kinds. The scores are then bounded, |tau q^.k^| <=
        tau, which keeps random-feature estimates of the normaliser away from 0: the Gaussian
        part exp(-tau |q^ - k^|^2 / 2) of the softmax kernel is at least e^{-2 tau}, and the
        trigonometric key factor e^{|k'|^2/2} is the constant e^{tau/2}. Signed feature maps
        (trigonometric, angular hybrid) need it to train (Peng et al., "Random Feature
        Attention", arXiv:2103.02143, normalise queries and keys for the same reason).
      initial_temperature: tau at initialisation (with ``query_key_norm``).
      eps: floor of FAVOR's denominator (``favor_attention``'s ``eps``; ``None``: the smallest
        normal number). Signed feature maps (trigonometric, hybrid) can estimate a row's
        normaliser as <= 0; the default floor then turns that row into inf (NaN downstream), so
        give them a larger floor (e.g. 1e-3; a bias on those rows only), and
        ``query_key_norm``.

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794; Reid et al.,
      "Simplex Random Features", arXiv:2301.13856, Sec. 5.4.
    """

    num_heads: int
    qkv_features: int | None = None
    out_features: int | None = None
    dropout_rate: float = 0.0
    deterministic: bool | None = None
    dtype: DTypeLike | None = None
    param_dtype: DTypeLike = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    use_bias: bool = True
    attention_kind: AttentionKind = "performer"
    coupling: str = "orthogonal"
    num_features: int = 256
    feature_map: str | FeatureMap = "positive"
    causal: bool = False
    redraw_interval: int = 1000
    chunk_size: int = 128
    eps: float | None = None
    query_key_norm: bool = False
    initial_temperature: float = 1.0

    def _check_attributes(self, features: int) -> int:
        if self.attention_kind not in ATTENTION_KINDS:
            raise ValueError(
                f"attention_kind must be one of {ATTENTION_KINDS}, got {self.attention_kind!r}"
            )
        if self.attention_kind == "performer":
            if self.coupling not in available_couplings():
                raise ValueError(
                    f"coupling must be one of {available_couplings()}, got {self.coupling!r}"
                )
            if self.dropout_rate:
                raise ValueError(
                    "dropout_rate must be 0 with attention_kind='performer' (the attention "
                    f"weights are never formed); got {self.dropout_rate}"
                )
            if not isinstance(self.redraw_interval, int) or self.redraw_interval < 1:
                raise ValueError(
                    f"redraw_interval must be an int >= 1, got {self.redraw_interval!r}"
                )
            self.feature_map_template()
        if self.query_key_norm and not self.initial_temperature > 0:
            raise ValueError(f"initial_temperature must be > 0, got {self.initial_temperature!r}")
        if features % self.num_heads:
            raise ValueError(
                f"qkv_features ({features}) must be divisible by num_heads ({self.num_heads})"
            )
        return features // self.num_heads

    def _stream_key(self, projection_step: jax.Array | int | None) -> jax.Array:
        """A fresh key of the projection stream for this call's step (see the class docstring)."""
        if self.has_rng(PROJECTION_STREAM):
            rng = self.make_rng(PROJECTION_STREAM)
        elif self.is_initializing():
            rng = self.make_rng("params")
        else:
            raise ValueError(
                "attention_kind='performer' draws its projection from the RNG stream "
                f"'{PROJECTION_STREAM}': call model.apply(..., rngs={{'{PROJECTION_STREAM}': "
                "key}) with a key that is constant over training, and pass projection_step"
            )
        step = 0 if projection_step is None else projection_step
        return redraw_key(rng, step, redraw_interval=self.redraw_interval)

    def draw_projection(
        self, head_dim: int, projection_step: jax.Array | int | None
    ) -> PerHead[Projection]:
        """The per-head projection of this call (see the class docstring)."""
        return draw_projection(
            self._stream_key(projection_step),
            head_dim,
            self.num_features,
            coupling=self.coupling,
            num_heads=self.num_heads,
        )

    def feature_map_template(self) -> FeatureMap:
        """The feature map without its parameters (``feature_map`` by name or as given)."""
        if isinstance(self.feature_map, str):
            return features.get(self.feature_map)()
        if isinstance(self.feature_map, FeatureMap):
            return self.feature_map
        raise TypeError(
            f"feature_map must be a name from rfjax.features.available() or an "
            f"rfjax.features.FeatureMap, got {type(self.feature_map).__name__}"
        )

    def draw_feature_map(
        self, head_dim: int, projection_step: jax.Array | int | None
    ) -> PerHead[FeatureMap]:
        """The per-head feature map of this call: random parameters drawn by ``init`` (after the
        projection, from the next key of its stream), fitted ones from ``"feature_map"``."""
        template = self.feature_map_template()
        keys = jax.random.split(self._stream_key(projection_step), self.num_heads)
        fmap = jax.vmap(lambda k: template.init(k, head_dim))(keys)
        fitted = {
            name: jax.lax.stop_gradient(
                self.variable(FEATURE_MAP_COLLECTION, name, lambda n=name: getattr(fmap, n)).value
            )
            for name in template.fitted_fields
        }
        return PerHead(fmap.replace(**fitted) if fitted else fmap)

    def _cosine_scores(self, query: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Unit query and key per head, scaled so that q.k / sqrt(H) = tau q^.k^."""
        log_temperature = self.param(
            "log_temperature",
            nn.initializers.constant(math.log(self.initial_temperature)),
            (self.num_heads,),
            self.param_dtype,
        )
        head_dim = query.shape[-1]
        scale = jnp.sqrt(jnp.exp(log_temperature) * math.sqrt(head_dim))[:, None]

        def unit(x):
            return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)

        return unit(query) * scale.astype(query.dtype), unit(key) * scale.astype(key.dtype)

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Attends from ``inputs_q`` (B, T, D) to ``inputs_k``/``inputs_v`` (B, S, D).

        Args:
          inputs_q: queries ``(..., T, D_q)``.
          inputs_k: keys ``(..., S, D_k)``; default ``inputs_q`` (self-attention).
          inputs_v: values ``(..., S, D_v)``; default ``inputs_k``.
          mask: boolean, True = attend. Exact: any mask broadcastable to ``(B, N, T, S)``;
            performer: a key padding mask ``(B, S)`` or ``(B, 1, 1, S)``.
          deterministic: disables attention dropout (exact only); default the attribute
            (needed only when ``dropout_rate > 0``, as in Flax).
          dropout_rng: key for attention dropout (default the ``"dropout"`` stream).
          projection_step: the training step that selects the projection (performer only);
            ``None`` means step 0.

        Returns:
          ``(..., T, out_features)``.
        """
        inputs_k = inputs_q if inputs_k is None else inputs_k
        inputs_v = inputs_k if inputs_v is None else inputs_v
        features = self.qkv_features or inputs_q.shape[-1]
        out_features = self.out_features or inputs_q.shape[-1]
        head_dim = self._check_attributes(features)
        dense = functools.partial(
            nn.DenseGeneral,
            features=(self.num_heads, head_dim),
            axis=-1,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
            use_bias=self.use_bias,
        )
        query = dense(name="query")(inputs_q)
        key = dense(name="key")(inputs_k)
        value = dense(name="value")(inputs_v)
        if self.query_key_norm:
            query, key = self._cosine_scores(query, key)
        self.sow("intermediates", "query_heads", query)
        self.sow("intermediates", "key_heads", key)
        batch_shape = query.shape[:-3]
        flat = (lambda x: x.reshape(-1, *x.shape[-3:])) if len(batch_shape) != 1 else None
        if flat is not None:
            query, key, value = flat(query), flat(key), flat(value)

        if self.attention_kind == "exact":
            if self.causal:
                causal_mask = nn.make_causal_mask(jnp.ones(query.shape[:2], bool))
                mask = causal_mask if mask is None else nn.combine_masks(mask, causal_mask)
            if mask is not None and mask.ndim == 2:
                mask = mask[:, None, None, :]
            use_dropout = self.dropout_rate > 0 and not nn.merge_param(
                "deterministic", self.deterministic, deterministic
            )
            if use_dropout and dropout_rng is None:
                dropout_rng = self.make_rng("dropout")
            out = nn.dot_product_attention(
                query,
                key,
                value,
                mask=mask,
                dropout_rng=dropout_rng,
                dropout_rate=self.dropout_rate,
                deterministic=not use_dropout,
                dtype=self.dtype,
            )
        else:
            projection = self.draw_projection(head_dim, projection_step)
            feature_map = self.draw_feature_map(head_dim, projection_step)
            self.sow(
                "intermediates",
                "projection",
                jax.vmap(lambda p: p.matrix())(projection.stacked),
            )
            if mask is not None:
                mask = _key_padding_mask(mask, key.shape[0], key.shape[1])
            out = favor_attention(
                query,
                key,
                value,
                projection,
                feature_map=feature_map,
                causal=self.causal,
                mask=mask,
                chunk_size=self.chunk_size,
                eps=self.eps,
            )
        if flat is not None:
            out = out.reshape(*batch_shape, *out.shape[-3:])
        return nn.DenseGeneral(
            features=out_features,
            axis=(-2, -1),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
            use_bias=self.use_bias,
            name="out",
        )(out)
