"""PerformerAttention: a drop-in for ``flax.linen.MultiHeadDotProductAttention``."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.linen.module as linen_module
import jax
import jax.numpy as jnp
from flax.linen.linear import default_kernel_init
from flax.typing import DotGeneralT, Initializer, PrecisionLike
from jax.typing import DTypeLike

from rfjax.attention import PerHead, favor_decode_init, redraw_key
from rfjax.features import FeatureMap
from rfjax.nn._attention_arguments import (
    ATTENTION_KINDS,
    AttentionKind,
    check_attributes,
    check_flax_arguments,
    check_sequence_call,
    keys_and_values,
    matmul_precision,
)
from rfjax.nn._attention_arguments import feature_map_template as _feature_map_template
from rfjax.nn._attention_compute import (
    decode_heads,
    favor_heads,
    favor_heads_weights,
    isolating_non_finite,
    kv_cache_step,
)
from rfjax.nn._attention_draws import (
    HeadsDraw,
    draw_heads,
    draw_keys_data,
    kept_draw,
)
from rfjax.nn._attention_inputs import cosine_scores
from rfjax.nn._attention_masks import batched_mask, favor_mask
from rfjax.projections import Projection

__all__ = ["ATTENTION_KINDS", "FEATURE_MAP_COLLECTION", "PROJECTION_STREAM", "PerformerAttention"]

PROJECTION_STREAM = "projection"
FEATURE_MAP_COLLECTION = "feature_map"
# An unnamed PerformerAttention is named like Flax's attention ("MultiHeadDotProductAttention_0",
# ...), sharing its counter, so that it takes MultiHeadDotProductAttention's place in a parameter
# tree and its checkpoints load.
AUTO_NAME_PREFIX = nn.MultiHeadDotProductAttention.__name__


class PerformerAttention(nn.Module):
    """Multi-head attention, exact or Performer (FAVOR), shaped like Flax's multi-head attention.

    Attributes are those of the installed Flax's ``flax.linen.MultiHeadDotProductAttention``
    (``MultiHeadAttention``), in its order, with its defaults and meaning
    (``tests/rfjax/nn/test_attention_arguments.py`` walks both signatures), then rfjax's own; where
    the Performer cannot apply one it raises ``ValueError`` naming it (see Attributes).
    Parameters are Flax's (``query``, ``key``, ``value`` DenseGeneral to ``(N, H)``, ``out``
    from ``(N, H)``, ``query_ln`` and ``key_ln`` with ``normalize_qk``), so the two share a
    parameter layout, and an unnamed ``PerformerAttention`` is auto-named as Flax's would be
    (``MultiHeadDotProductAttention_0``, ``_1``, ... sharing its counter): replacing
    ``nn.MultiHeadDotProductAttention(...)`` by ``PerformerAttention(...)`` in a model keeps the
    parameter tree, so its checkpoints load. The call takes Flax's forms (``inputs_q,
    inputs_k, inputs_v``, ``inputs_kv=``, ``mask=``, ``sow_weights=``) and Flax's masks (see
    ``__call__``). ``attention_kind="exact"`` computes softmax(q k^T / sqrt(H)) v;
    ``"performer"`` replaces it with ``rfjax.attention.favor_attention`` over ``num_features``
    random features per head drawn with ``coupling``.

    Decoding (``decode=True``): as with Flax's attention, ``init`` with the full-length inputs
    creates the ``"cache"`` collection and each ``apply(..., mutable=["cache"])`` then takes one
    token ``(B, 1, D)``. The Performer's cache is FAVOR's recurrent ``DecodeState``
    (``"decode_state"``: sum_j phi(k_j) v_j^T and sum_j phi(k_j) per head, of size independent
    of the length; ``rfjax.attention.favor_decode_init``) and ``"cache_index"``: each step adds
    its key and value to the state and attends causally (``favor_decode_step``), equal to
    position t of the causal ``favor_attention`` over the whole sequence. The first call on
    the empty cache may instead take a prompt's T tokens ``(B, T, D)`` at once (a prefill; a
    call of T > 1 tokens on a cache that is not empty raises ``ValueError``, at run time under
    ``jit``): the Performer attends over them with the chunked causal form and keeps the state
    after them (``favor_prefill``), the exact kind writes them into its cache. The steps must
    use the same projection: the same ``"projection"`` stream key and ``projection_step`` at
    every step. The cache also keeps that projection and feature map (``"decode_draw"``, with
    the keys they came from, ``"decode_draw_keys"``): a step draws them again only when its
    keys change (the first step after ``init``, or a new redraw period), not for every token;
    a call without the ``"projection"`` stream uses the cache's draw as it is (no keys derived
    or compared: the lean step of a compiled decoding loop, ``rfjax.nn.generate``), so give
    the stream and ``projection_step`` to ``init`` or to the first call (``init`` without it
    draws the cache's projection from the ``"params"`` stream). The exact kind keeps Flax's
    key/value cache (``"cached_key"``, ``"cached_value"``, ``"cache_index"``, as
    ``MultiHeadDotProductAttention``).

    Masks while decoding follow each kind's cache: the exact kind reads ``mask`` over the
    cache's L positions (a ``(B, L)`` key padding mask, or a Flax mask that broadcasts against
    ``(B, 1, T, L)``), as Flax's cache does; the Performer's state keeps no keys, so a
    prefill's mask covers the prompt's T tokens (a ``(B, T)`` key padding mask or a T x T Flax
    mask) and a step's says only whether the new token's key is attended to (B elements,
    e.g. ``(B, 1, 1, 1)``).

    Projections and the step: the random projection is not a parameter and is never stored. It
    is drawn on every call as ``draw_projection(redraw_key(rng, step, redraw_interval=k), ...)``
    (``k = redraw_interval``; one independent draw per head), where
    ``rng = self.make_rng("projection")`` comes from the caller's RNG stream ``"projection"``
    and ``step = projection_step`` is passed explicitly by the caller (the trainer passes its
    step counter; ``None`` means step 0). Hence

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
      num_heads, dtype, param_dtype, qkv_features, out_features, broadcast_dropout,
        dropout_rate, deterministic, precision, kernel_init, out_kernel_init, bias_init,
        out_bias_init, use_bias, attention_fn, decode, normalize_qk, force_fp32_for_softmax,
        qkv_dot_general, out_dot_general, qkv_dot_general_cls, out_dot_general_cls,
        qk_attn_weights_einsum_cls, attn_weights_value_einsum_cls: Flax's attributes of
        ``MultiHeadDotProductAttention``, in its order and with its defaults and meaning. For
        both kinds they build the projections (``query``, ``key``, ``value``, ``out``) and,
        with ``normalize_qk``, the LayerNorms ``query_ln`` and ``key_ln`` as Flax does; the
        exact kind passes the rest to ``attention_fn`` as Flax does. The Performer computes
        FAVOR in place of ``attention_fn`` (which must stay the default) and never forms the
        T x S products that ``qk_attn_weights_einsum_cls`` and
        ``attn_weights_value_einsum_cls`` override (they must stay None; both raise
        ``ValueError`` naming the argument otherwise); it runs FAVOR's products at
        ``precision`` (``jax.default_matmul_precision``), computes its features and
        normaliser (the softmax's counterpart) in at least float32 whatever
        ``force_fp32_for_softmax`` says (what the flag asks of softmax always holds), and has
        no attention dropout (``dropout_rate`` must be 0; ``broadcast_dropout`` then does
        nothing).
      attention_kind: ``"exact"`` or ``"performer"``.
      coupling: a name from ``rfjax.projections.available()`` ("gaussian" = IID,
        "orthogonal" = ORF, "simplex" = SimRF, ...).
      num_features: m, random features per head.
      feature_map: a name from ``rfjax.features.available()`` ("positive", "positive_antithetic",
        "relu", "trigonometric", ...) or a ``FeatureMap`` without its parameters (they are
        drawn or fitted per head, see above).
      causal: causal (autoregressive) attention (a causal Flax mask also turns it on).
      redraw_interval: redraw the projection every this many steps (>= 1).
      chunk_size: chunk length of causal prefix sums.
      implementation: ``favor_attention``'s: ``"auto"``, ``"xla"``, or fused Pallas kernels
        (``"pallas_triton"``, ``"pallas_tpu"``, their interpret twins) for the maps they take;
        decoding runs the XLA form.
      query_key_norm: score each head's query and key as tau q^.k^ (unit vectors, cosine
        attention with a learned per-head temperature tau > 0, parameter ``log_temperature``)
        instead of q.k / sqrt(H), for both kinds. The scores are then bounded, |tau q^.k^| <=
        tau, which keeps random-feature estimates of the normaliser away from 0: the Gaussian
        part exp(-tau |q^ - k^|^2 / 2) of the softmax kernel is at least e^{-2 tau}, and the
        trigonometric key factor e^{|k'|^2/2} is the constant e^{tau/2}. Signed feature maps
        (trigonometric, angular hybrid) need it to train (Peng et al., "Random Feature
        Attention", arXiv:2103.02143, normalise queries and keys for the same reason).
      initial_temperature: tau at initialisation (with ``query_key_norm``).
      sequence_axis: the name of a mesh axis that splits the sequence (performer only): the layer
        is then called inside ``jax.shard_map`` on the local shard ``(B, T/D, D_model)`` of the
        inputs and returns the local shard of the output (``favor_attention``'s
        ``sequence_axis``: key sums reduced over the axis, causal states scanned across it);
        or called on the global inputs split along an ``Explicit`` axis under
        ``jax.set_mesh``, where the split is checked and attention splits itself.
        The parameters and the ``"projection"`` stream key must be the same on every device
        (replicated), so that all devices draw the same projection. Self-attention or
        cross-attention between sequences split alike; not with ``decode`` or ``sow_weights``
        (they raise); ``None``: not split.
      eps: floor of FAVOR's denominator (``favor_attention``'s ``eps``; ``None``: the smallest
        normal number). Signed feature maps (trigonometric, hybrid) can estimate a row's
        normaliser as <= 0; the default floor then turns that row into inf (NaN downstream), so
        give them a larger floor (e.g. 1e-3; a bias on those rows only), and
        ``query_key_norm``.

    Examples:
      >>> import flax.linen as nn
      >>> import jax
      >>> from rfjax.nn import PerformerAttention
      >>> x = jax.random.normal(jax.random.key(0), (2, 10, 32))
      >>> layer = PerformerAttention(num_heads=4, num_features=16)
      >>> variables = layer.init(jax.random.key(1), x)
      >>> mask = nn.make_causal_mask(x[..., 0])  # read as causal attention
      >>> layer.apply(variables, x, mask=mask, rngs={"projection": jax.random.key(2)}).shape
      (2, 10, 32)

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794; Reid et al.,
      "Simplex Random Features", arXiv:2301.13856, Sec. 5.4.
    """

    num_heads: int
    dtype: DTypeLike | None = None
    param_dtype: DTypeLike = jnp.float32
    qkv_features: int | None = None
    out_features: int | None = None
    broadcast_dropout: bool = True
    dropout_rate: float = 0.0
    deterministic: bool | None = None
    precision: PrecisionLike = None
    kernel_init: Initializer = default_kernel_init
    out_kernel_init: Initializer | None = None
    bias_init: Initializer = nn.initializers.zeros_init()
    out_bias_init: Initializer | None = None
    use_bias: bool = True
    #: Flax's attention function (exact kind; the Performer computes FAVOR in its place).
    attention_fn: Callable[..., jax.Array] = nn.dot_product_attention
    decode: bool = False
    normalize_qk: bool = False
    force_fp32_for_softmax: bool = False
    qkv_dot_general: DotGeneralT | None = None
    out_dot_general: DotGeneralT | None = None
    qkv_dot_general_cls: Any = None
    out_dot_general_cls: Any = None
    qk_attn_weights_einsum_cls: Callable[..., Callable[..., jax.Array]] | None = None
    attn_weights_value_einsum_cls: Callable[..., Callable[..., jax.Array]] | None = None
    attention_kind: AttentionKind = "performer"
    coupling: str = "orthogonal"
    num_features: int = 256
    feature_map: str | FeatureMap = "positive"
    causal: bool = False
    redraw_interval: int = 1000
    chunk_size: int = 64
    implementation: str = "auto"
    eps: float | None = None
    sequence_axis: str | None = None
    query_key_norm: bool = False
    initial_temperature: float = 1.0

    def __post_init__(self) -> None:
        # Flax names an unnamed submodule "<class name>_<count>" in Module.__post_init__; this
        # takes the name Flax would give MultiHeadDotProductAttention first (Flax has no public
        # hook for it: the parent's auto-name counter is internal state; tests cover it).
        parent = self.parent
        if parent is linen_module._unspecified_parent:
            parent = linen_module._context.module_stack[-1]
        if (
            self.name is None
            and isinstance(parent, nn.Module)
            and not parent._state.in_setup
            and parent._initialization_allowed
        ):
            cursor = parent._state.autoname_cursor.get(AUTO_NAME_PREFIX, 0)
            parent._state.autoname_cursor[AUTO_NAME_PREFIX] = cursor + 1
            object.__setattr__(self, "name", f"{AUTO_NAME_PREFIX}_{cursor}")
        super().__post_init__()

    def _check_attributes(self, features: int) -> int:
        check_flax_arguments(
            self.attention_kind,
            attention_fn=self.attention_fn,
            default_attention_fn=nn.dot_product_attention,
            qk_attn_weights_einsum_cls=self.qk_attn_weights_einsum_cls,
            attn_weights_value_einsum_cls=self.attn_weights_value_einsum_cls,
        )
        return check_attributes(
            num_heads=self.num_heads,
            features=features,
            attention_kind=self.attention_kind,
            coupling=self.coupling,
            num_features=self.num_features,
            dropout_rate=self.dropout_rate,
            redraw_interval=self.redraw_interval,
            feature_map=self.feature_map,
            query_key_norm=self.query_key_norm,
            initial_temperature=self.initial_temperature,
            causal=self.causal,
            sequence_axis=self.sequence_axis,
        )

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

    def feature_map_template(self) -> FeatureMap:
        """The feature map without its parameters (``feature_map`` by name or as given)."""
        return _feature_map_template(self.feature_map)

    def draw_heads(
        self, head_dim: int, projection_step: jax.Array | int | None
    ) -> tuple[PerHead[Projection], PerHead[FeatureMap]]:
        """This call's per-head projection and feature map: the projection from the stream key,
        the map's random parameters from the next key of the stream (its ``init``), its fitted
        ones from the collection ``"feature_map"`` (see the class docstring)."""
        projection_key = self._stream_key(projection_step)
        feature_map_key = self._stream_key(projection_step)
        projection, fmap = self._draw(head_dim, projection_key, feature_map_key)
        return projection, self._with_fitted(fmap)

    @nn.nowrap
    def _draw(self, head_dim: int, projection_key: jax.Array, feature_map_key: jax.Array):
        """The draw of these keys (pure: no variables or RNG streams, so ``lax.cond`` may call
        it)."""
        return draw_heads(
            projection_key,
            feature_map_key,
            head_dim=head_dim,
            num_heads=self.num_heads,
            num_features=self.num_features,
            coupling=self.coupling,
            feature_map=self.feature_map,
        )

    def _with_fitted(self, fmap: FeatureMap) -> PerHead[FeatureMap]:
        """``fmap`` with its fitted fields from the collection ``"feature_map"``."""
        fitted = {
            name: jax.lax.stop_gradient(
                self.variable(FEATURE_MAP_COLLECTION, name, lambda n=name: getattr(fmap, n)).value
            )
            for name in self.feature_map_template().fitted_fields
        }
        return PerHead(fmap.replace(**fitted) if fitted else fmap)

    def _decode_heads(
        self, head_dim: int, projection_step: jax.Array | int | None
    ) -> tuple[PerHead[Projection], PerHead[FeatureMap]]:
        """``draw_heads`` while decoding: the draw is kept in the cache (``"decode_draw"``, with
        the keys it came from). With the ``"projection"`` stream it is drawn again only when the
        keys change (``kept_draw``); without it, once the cache exists, the cache's draw is used
        as it is (the step of a compiled decoding loop: no key derived or compared per token)."""
        initialized = self.has_variable("cache", "decode_draw")
        if initialized and not self.has_rng(PROJECTION_STREAM):
            cached: HeadsDraw = self.get_variable("cache", "decode_draw")
            return cached[0], self._with_fitted(cached[1])
        keys = (self._stream_key(projection_step), self._stream_key(projection_step))
        data = draw_keys_data(*keys)
        kept = self.variable("cache", "decode_draw", lambda: self._draw(head_dim, *keys))
        kept_keys = self.variable("cache", "decode_draw_keys", lambda: data)
        if initialized:
            kept.value = kept_draw(
                kept.value, kept_keys.value, data, lambda: self._draw(head_dim, *keys)
            )
            kept_keys.value = data
        projection, fmap = kept.value
        return projection, self._with_fitted(fmap)

    def _cosine_scores(self, query: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Unit query and key per head, scaled so that q.k / sqrt(H) = tau q^.k^."""
        log_temperature = self.param(
            "log_temperature",
            nn.initializers.constant(math.log(self.initial_temperature)),
            (self.num_heads,),
            self.param_dtype,
        )
        return cosine_scores(query, key, log_temperature)

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        inputs_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        dropout_rng: jax.Array | None = None,
        sow_weights: bool = False,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Attends from ``inputs_q`` (B, T, D) to ``inputs_k``/``inputs_v`` (B, S, D).

        Args:
          inputs_q: queries ``(..., T, D_q)``.
          inputs_k: keys ``(..., S, D_k)``; default ``inputs_q`` (self-attention).
          inputs_v: values ``(..., S, D_v)``; default ``inputs_k``.
          inputs_kv: keys and values at once (Flax's older form; not with ``inputs_k`` or
            ``inputs_v``).
          mask: True (or non-zero) = attend. A 2-D mask is a key padding mask ``(B, S)``
            for both kinds (where Flax would broadcast it as ``(T, S)``: pass such a mask as
            ``mask[None, None]``), and combines with ``causal``. Exact: otherwise any mask
            broadcastable to ``(..., N, T, S)``, as in Flax. Performer: otherwise a Flax
            mask broadcastable to ``(B, N, T, S)`` made of key padding, query padding and
            causality (``nn.make_attention_mask(pad, pad)``, ``nn.make_causal_mask``,
            ``nn.combine_masks`` of them), read as key padding and causality (a causal mask
            switches causal attention on); any other mask raises ``ValueError`` (at run time
            inside ``jit``), since FAVOR cannot apply an arbitrary T x S mask. Inside ``jit``
            such a mask is checked at run time (see ``rfjax.nn._attention_masks.favor_mask``); a
            ``(B, S)`` key padding mask with ``causal`` costs nothing extra. The Performer
            applies boolean and 0/1 masks only: other values (an additive mask) raise
            ``ValueError`` (a traced non-boolean mask is checked at run time).
          deterministic: disables attention dropout (exact only); default the attribute
            (needed only when ``dropout_rate > 0``, as in Flax).
          dropout_rng: key for attention dropout (default the ``"dropout"`` stream).
          sow_weights: sow the attention weights ``(B, N, T, S)`` into ``"intermediates"`` as
            ``"attention_weights"`` (as Flax does; the Performer forms them explicitly with
            ``favor_attention_weights``, O(T S) memory).
          projection_step: the training step that selects the projection (performer only);
            ``None`` means step 0.

        Returns:
          ``(..., T, out_features)``.
        """
        inputs_k, inputs_v = keys_and_values(inputs_q, inputs_k, inputs_v, inputs_kv)
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
            precision=self.precision,
            dot_general=self.qkv_dot_general,
            dot_general_cls=self.qkv_dot_general_cls,
        )
        query = dense(name="query")(inputs_q)
        key = dense(name="key")(inputs_k)
        value = dense(name="value")(inputs_v)
        if self.normalize_qk:  # Flax's LayerNorms of q and k per head, under Flax's names
            layer_norm = functools.partial(
                nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype
            )
            query = layer_norm(name="query_ln")(query)
            key = layer_norm(name="key_ln")(key)
        if self.query_key_norm:
            query, key = self._cosine_scores(query, key)
        self.sow("intermediates", "query_heads", query)
        self.sow("intermediates", "key_heads", key)
        batch_shape = query.shape[:-3]
        flat = (lambda x: x.reshape(-1, *x.shape[-3:])) if len(batch_shape) != 1 else None
        if flat is not None:
            query, key, value = flat(query), flat(key), flat(value)

        if self.attention_kind == "exact":
            out = self._exact(
                query, key, value, mask, batch_shape, deterministic, dropout_rng, sow_weights
            )
        else:
            with matmul_precision(self.precision):
                out = self._performer(
                    query, key, value, mask, batch_shape, sow_weights, projection_step
                )
        if flat is not None:
            out = out.reshape(*batch_shape, *out.shape[-3:])
        return nn.DenseGeneral(
            features=out_features,
            axis=(-2, -1),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.out_kernel_init or self.kernel_init,
            bias_init=self.out_bias_init or self.bias_init,
            use_bias=self.use_bias,
            precision=self.precision,
            dot_general=self.out_dot_general,
            dot_general_cls=self.out_dot_general_cls,
            name="out",
        )(out)

    def _exact(self, query, key, value, mask, batch_shape, deterministic, dropout_rng, sow_weights):
        decoding = self.decode and self.has_variable("cache", "cached_key")
        if mask is not None:  # over the cache's positions when decoding
            keys = self.get_variable("cache", "cached_key").shape[1] if decoding else key.shape[1]
            shape = (*batch_shape, query.shape[2], query.shape[1], keys)
            mask = batched_mask(jnp.asarray(mask), shape)
        if self.decode:  # Flax's key/value cache, under Flax's names
            cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            cached_value = self.variable(
                "cache", "cached_value", jnp.zeros, value.shape, value.dtype
            )
            index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            if decoding:
                length = key.shape[1]
                key, value, mask = kv_cache_step(
                    cached_key.value, cached_value.value, index.value, key, value, mask
                )
                cached_key.value, cached_value.value = key, value
                index.value = index.value + length
        if self.causal and not decoding:
            causal_mask = nn.make_causal_mask(jnp.ones(query.shape[:2], bool))
            mask = causal_mask if mask is None else nn.combine_masks(mask, causal_mask)
        use_dropout = self.dropout_rate > 0 and not nn.merge_param(
            "deterministic", self.deterministic, deterministic
        )
        if use_dropout and dropout_rng is None:
            dropout_rng = self.make_rng("dropout")
        # Flax's call of attention_fn: the arguments of nn.dot_product_attention that the
        # function takes (AQT-style einsum classes instantiated), the module to sow into.
        einsums = {
            "qk_attn_weights_einsum": self.qk_attn_weights_einsum_cls,
            "attn_weights_value_einsum": self.attn_weights_value_einsum_cls,
        }
        arguments = {
            "mask": mask,
            "dropout_rng": dropout_rng,
            "dropout_rate": self.dropout_rate,
            "broadcast_dropout": self.broadcast_dropout,
            "deterministic": not use_dropout,
            "dtype": self.dtype,
            "precision": self.precision,
            "force_fp32_for_softmax": self.force_fp32_for_softmax,
            **{name: cls() if cls else None for name, cls in einsums.items()},
        }
        accepted = inspect.signature(self.attention_fn).parameters
        arguments = {name: arg for name, arg in arguments.items() if name in accepted}
        if sow_weights:
            arguments["module"] = self
        attend = functools.partial(self.attention_fn, **arguments)
        if decoding:  # the cache holds non-finite tokens as NaN keys (kv_cache_step)
            return attend(query, key, value)
        return isolating_non_finite(attend, query, key, value, mask)

    def _performer(self, query, key, value, mask, batch_shape, sow_weights, projection_step):
        check_sequence_call(self.sequence_axis, decode=self.decode, sow_weights=sow_weights)
        batch, length, num_heads, head_dim = query.shape
        draw = self._decode_heads if self.decode else self.draw_heads
        projection, feature_map = draw(head_dim, projection_step)
        if self.is_mutable_collection("intermediates"):  # not formed otherwise (decode steps)
            matrices = jax.vmap(lambda p: p.matrix())(projection.stacked)
            self.sow("intermediates", "projection", matrices)
        if self.decode:
            initialized = self.has_variable("cache", "decode_state")
            state = self.variable(
                "cache",
                "decode_state",
                lambda: favor_decode_init(
                    batch, num_heads, value.shape[-1], projection, feature_map=feature_map
                ),
            )
            index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            if initialized:
                state.value, out = decode_heads(
                    state.value,
                    index.value,
                    query,
                    key,
                    value,
                    projection,
                    feature_map,
                    mask,
                    chunk_size=self.chunk_size,
                    eps=self.eps,
                )
                index.value = index.value + length
                return out
        favor = favor_mask(
            mask,
            batch_shape=batch_shape or (1,),
            num_heads=num_heads,
            query_length=length,
            key_length=key.shape[1],
            causal=self.causal,
        )
        if sow_weights:
            self.sow(
                "intermediates",
                "attention_weights",
                favor_heads_weights(query, key, projection, feature_map, favor, eps=self.eps),
            )
        return favor_heads(
            query,
            key,
            value,
            projection,
            feature_map,
            favor,
            chunk_size=self.chunk_size,
            eps=self.eps,
            sequence_axis=self.sequence_axis,
            implementation=self.implementation,
        )
