"""PerformerAttention in Flax NNX: a drop-in for ``flax.nnx.MultiHeadAttention``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from flax.nnx.nn.linear import default_kernel_init
from flax.typing import DotGeneralT, Initializer, PrecisionLike, PromoteDtypeFn
from jax.typing import DTypeLike

from rfjax._validation import check_int
from rfjax.attention import DecodeState, PerHead, favor_decode_init, redraw_key
from rfjax.features import FeatureMap
from rfjax.nn._attention_arguments import (
    AttentionKind,
    check_attributes,
    check_flax_arguments,
    check_sequence_call,
    feature_map_template,
    keys_and_values,
    matmul_precision,
)
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
from rfjax.nn._attention_inputs import (
    cosine_scores,
    repeat_kv_heads,
    rotate,
)
from rfjax.nn._attention_masks import batched_mask, favor_mask
from rfjax.projections import Projection

__all__ = ["FittedFeatureMap", "PerformerAttention", "ProjectionKey"]

# nnx.MultiHeadAttention's defaults (the same objects: the drop-in test compares them).
NO_METADATA: Mapping[str, Any] = MappingProxyType({})
ZEROS = nnx.initializers.zeros_init()


class ProjectionKey(nnx.Variable):
    """The base PRNG key of an attention layer's projections (not trained, saved with it)."""


class FittedFeatureMap(nnx.Variable):
    """The data-fitted fields of a feature map per head (``FeatureMap.fitted_fields``, each of
    shape ``(N, ...)``); set by fitting, not by the optimizer."""


class PerformerAttention(nnx.Module):
    """Multi-head attention, exact or Performer (FAVOR), shaped like ``nnx.MultiHeadAttention``.

    The NNX twin of ``rfjax.nn.PerformerAttention`` (same attributes, same maths: both call
    ``rfjax.attention`` through ``rfjax.nn._attention_compute``). Its submodules are those of
    ``flax.nnx.MultiHeadAttention`` (``query``, ``key``, ``value``: ``LinearGeneral`` to
    ``(N, H)``, or ``(N_kv, H)`` for keys and values with ``num_kv_heads``; ``out`` from
    ``(N, H)``; ``query_ln``, ``key_ln`` with ``normalize_qk``), so an
    ``nnx.MultiHeadAttention``'s parameters load into it
    (``nnx.update(performer, nnx.state(mha, nnx.Param))``). It takes every argument of the
    installed Flax's ``nnx.MultiHeadAttention``, constructor and call, in Flax's positional
    order and with Flax's meaning (``tests/rfjax/nn/test_attention_arguments.py`` walks both
    signatures), plus its own (``attention_kind``, ``coupling``, ..., and the call's
    ``projection_step``); where the Performer cannot apply one it raises ``ValueError``
    naming it (see Args).

    Projections: the random projection is not a parameter. ``__init__`` stores a base key
    (``ProjectionKey``, from the ``"projection"`` stream of ``rngs`` if it has one, else
    ``"params"``); each call draws ``draw_projection(redraw_key(base, step, redraw_interval=k),
    ...)`` (``k = redraw_interval``; one draw per head) with ``step = projection_step``
    (``None``: 0). The same base key and step give the same projection, so features are
    redrawn every ``redraw_interval`` training steps when the train step passes its counter;
    ``nnx.Optimizer(..., wrt=nnx.Param)`` leaves the key alone. Feature maps with random
    parameters draw them per head from the same key; data-fitted fields are
    ``FittedFeatureMap`` state (stop-gradient).

    Masks: as in ``rfjax.nn.PerformerAttention``: a 2-D mask is a key padding mask ``(B, S)``
    for both kinds (Flax would read it as ``(T, S)``); otherwise the exact kind takes any Flax
    mask broadcastable to ``(..., N, T, S)``, and the Performer takes a Flax mask made of key
    padding, query padding and causality (``nnx.make_attention_mask``,
    ``nnx.make_causal_mask``, ``nnx.combine_masks``), read as key padding and causality,
    boolean or 0/1-valued; others (and additive masks) raise ``ValueError``.
    ``is_causal=True`` or the ``causal`` attribute makes the attention causal.

    Decoding: ``init_cache(input_shape)`` creates the cache (``nnx.Cache``): the FAVOR
    ``DecodeState`` (performer) or Flax's key/value cache (exact); ``nnx.view(model,
    decode=True, batch_size=B, max_length=L)`` creates it as well (``set_view``, as Flax's;
    ``nnx.view(model, deterministic=True)`` turns the exact kind's dropout off); then each call with
    ``decode=True`` takes one token ``(B, 1, D)``, as with ``nnx.MultiHeadAttention`` (causal;
    the Performer needs the same ``projection_step`` at every step). The first call on the
    empty cache may instead take a prompt's T tokens ``(B, T, D)`` at once (a prefill; a call
    of T > 1 tokens on a cache that is not empty raises ``ValueError``, at run time under
    ``jit``): the Performer attends over them with the chunked causal form and keeps the state
    after them (``rfjax.attention.favor_prefill``), the exact kind writes them into its cache.
    The Performer's cache keeps the drawn projection and feature map (``decode_draw``, with the
    keys they came from): a call with a ``projection_step`` draws them again only when its
    keys change, not for every token; a call without one (``None``) uses the cache's as they
    are, those of ``init_cache``'s ``projection_step`` (no keys derived or compared: the lean
    step of a compiled decoding loop).

    Masks while decoding are ``rfjax.nn.PerformerAttention``'s: the exact kind's covers the
    cache's L positions, the Performer's the prompt's T tokens in a prefill and then the new
    token (B elements) in each step.

    Args:
      num_heads, in_features, qkv_features, out_features, num_kv_heads, in_kv_features: as in
        ``nnx.MultiHeadAttention``, in its positional order (``num_kv_heads`` < N: grouped
        key/value heads, each shared by N / N_kv query heads; the Performer repeats them to
        the query heads before FAVOR, so its decode state is per query head).
      dtype, param_dtype, broadcast_dropout, dropout_rate, deterministic, precision,
        kernel_init, out_kernel_init, bias_init, out_bias_init, use_bias, decode,
        normalize_qk, qkv_promote_dtype, out_promote_dtype, ln_promote_dtype,
        qkv_dot_general, out_dot_general, qkv_dot_general_cls, out_dot_general_cls,
        kernel_metadata, out_kernel_metadata, bias_metadata, out_bias_metadata,
        query_ln_scale_metadata, key_ln_scale_metadata: as in ``nnx.MultiHeadAttention``,
        for both kinds: the projections (``query``, ``key``, ``value``, ``out``) and the
        LayerNorms of ``normalize_qk`` (``query_ln``, ``key_ln``) are built as Flax builds
        them. For the Performer, ``precision`` also sets the precision of FAVOR's products
        (``jax.default_matmul_precision``); attention dropout (``dropout_rate``,
        ``broadcast_dropout``) is exact only, since FAVOR never forms the weights (a
        non-zero rate with the Performer raises).
      attention_fn: as in ``nnx.MultiHeadAttention`` for the exact kind. The Performer
        computes FAVOR in its place: it takes the default, or
        ``functools.partial(nnx.dot_product_attention_with_rope, rope=rope)``, whose rotation
        it applies to queries and keys before FAVOR (with the call's ``input_positions``);
        another function raises ``ValueError``.
      attention_kind, coupling, num_features, feature_map, causal, redraw_interval,
        chunk_size, implementation, eps, query_key_norm, initial_temperature: as in
        ``rfjax.nn.PerformerAttention``.
      sequence_axis: the name of a mesh axis that splits the sequence (performer only), as in
        ``rfjax.nn.PerformerAttention``: the layer is called inside ``jax.shard_map`` on the
        local shard ``(B, T/D, D_model)`` and returns the local shard of the output
        (``favor_attention(..., sequence_axis=)``); its state (parameters, ``ProjectionKey``)
        is replicated, e.g. ``nnx.split`` outside and ``nnx.merge`` inside with ``in_specs``
        ``P()`` for the state; or called on the global inputs split along an ``Explicit``
        axis under ``jax.set_mesh`` (``float32[B,T@seq,D]``), where the split is checked and
        attention splits itself. Not with ``decode`` or ``sow_weights`` (they raise).
      rngs: ``nnx.Rngs`` with ``"params"`` (and optionally ``"projection"``, ``"dropout"``).
      keep_rngs: keep the dropout stream for calls without ``rngs`` (as in Flax).

    Examples:
      >>> import jax
      >>> from flax import nnx
      >>> from rfjax.nn import nnx as rnnx
      >>> layer = rnnx.PerformerAttention(4, 32, num_features=16, rngs=nnx.Rngs(0))
      >>> x = jax.random.normal(jax.random.key(1), (2, 10, 32))
      >>> layer(x, is_causal=True).shape
      (2, 10, 32)

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794; Reid et al.,
      "Simplex Random Features", arXiv:2301.13856, Sec. 5.4.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        num_kv_heads: int | None = None,
        in_kv_features: int | None = None,
        *,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        broadcast_dropout: bool = True,
        dropout_rate: float = 0.0,
        deterministic: bool | None = None,
        precision: PrecisionLike = None,
        kernel_init: Initializer = default_kernel_init,
        out_kernel_init: Initializer | None = None,
        bias_init: Initializer = ZEROS,
        out_bias_init: Initializer | None = None,
        use_bias: bool = True,
        attention_fn: Callable[..., jax.Array] = nnx.dot_product_attention,
        decode: bool | None = None,
        normalize_qk: bool = False,
        qkv_promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        out_promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        ln_promote_dtype: PromoteDtypeFn = dtypes.promote_dtype,
        qkv_dot_general: DotGeneralT | None = None,
        out_dot_general: DotGeneralT | None = None,
        qkv_dot_general_cls: Any = None,
        out_dot_general_cls: Any = None,
        rngs: nnx.Rngs,
        keep_rngs: bool = True,
        kernel_metadata: Mapping[str, Any] = NO_METADATA,
        out_kernel_metadata: Mapping[str, Any] = NO_METADATA,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        out_bias_metadata: Mapping[str, Any] = NO_METADATA,
        query_ln_scale_metadata: Mapping[str, Any] = NO_METADATA,
        key_ln_scale_metadata: Mapping[str, Any] = NO_METADATA,
        attention_kind: AttentionKind = "performer",
        coupling: str = "orthogonal",
        num_features: int = 256,
        feature_map: str | FeatureMap = "positive",
        causal: bool = False,
        redraw_interval: int = 1000,
        chunk_size: int = 64,
        eps: float | None = None,
        query_key_norm: bool = False,
        initial_temperature: float = 1.0,
        sequence_axis: str | None = None,
        implementation: str = "auto",
    ) -> None:
        qkv_features = in_features if qkv_features is None else qkv_features
        self.head_dim = check_attributes(
            num_heads=num_heads,
            features=qkv_features,
            attention_kind=attention_kind,
            coupling=coupling,
            num_features=num_features,
            dropout_rate=dropout_rate,
            redraw_interval=redraw_interval,
            feature_map=feature_map,
            query_key_norm=query_key_norm,
            initial_temperature=initial_temperature,
            causal=causal,
            sequence_axis=sequence_axis,
        )
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = check_int("num_kv_heads", kv_heads, minimum=1)
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})"
            )
        self.rope = check_flax_arguments(
            attention_kind,
            attention_fn=attention_fn,
            default_attention_fn=nnx.dot_product_attention,
            rope_attention_fn=nnx.dot_product_attention_with_rope,
        )
        self.num_heads = num_heads
        self.in_features = in_features
        self.qkv_features = qkv_features
        self.out_features = in_features if out_features is None else out_features
        self.in_kv_features = in_features if in_kv_features is None else in_kv_features
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.broadcast_dropout = broadcast_dropout
        self.dropout_rate = dropout_rate
        self.deterministic = deterministic
        self.precision = precision
        self.attention_fn = attention_fn
        self.decode = decode
        self.normalize_qk = normalize_qk
        self.attention_kind = attention_kind
        self.coupling = coupling
        self.num_features = num_features
        self.feature_map = feature_map
        self.causal = causal
        self.redraw_interval = redraw_interval
        self.chunk_size = chunk_size
        self.implementation = implementation
        self.eps = eps
        self.query_key_norm = query_key_norm
        self.sequence_axis = sequence_axis
        linear = functools.partial(
            nnx.LinearGeneral,
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=kernel_init,
            bias_init=bias_init,
            use_bias=use_bias,
            precision=precision,
            promote_dtype=qkv_promote_dtype,
            dot_general=qkv_dot_general,
            dot_general_cls=qkv_dot_general_cls,
            kernel_metadata=kernel_metadata,
            bias_metadata=bias_metadata,
            rngs=rngs,
        )
        self.query = linear(in_features, (num_heads, self.head_dim))
        self.key = linear(self.in_kv_features, (self.num_kv_heads, self.head_dim))
        self.value = linear(self.in_kv_features, (self.num_kv_heads, self.head_dim))
        layer_norm = functools.partial(
            nnx.LayerNorm,
            self.head_dim,
            use_bias=False,
            dtype=dtype,
            param_dtype=param_dtype,
            promote_dtype=ln_promote_dtype,
            rngs=rngs,
        )
        self.query_ln: nnx.LayerNorm | None = (
            layer_norm(scale_metadata=query_ln_scale_metadata) if normalize_qk else nnx.data(None)
        )
        self.key_ln: nnx.LayerNorm | None = (
            layer_norm(scale_metadata=key_ln_scale_metadata) if normalize_qk else nnx.data(None)
        )
        self.out = nnx.LinearGeneral(
            (num_heads, self.head_dim),
            self.out_features,
            axis=(-2, -1),
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=out_kernel_init or kernel_init,
            bias_init=out_bias_init or bias_init,
            use_bias=use_bias,
            precision=precision,
            promote_dtype=out_promote_dtype,
            dot_general=out_dot_general,
            dot_general_cls=out_dot_general_cls,
            kernel_metadata=out_kernel_metadata or kernel_metadata,
            bias_metadata=out_bias_metadata or bias_metadata,
            rngs=rngs,
        )
        self.log_temperature = (
            nnx.Param(jnp.full((num_heads,), math.log(initial_temperature), param_dtype))
            if query_key_norm
            else nnx.data(None)
        )
        self.projection_key = ProjectionKey(
            rngs.projection() if "projection" in rngs else rngs.params()
        )
        performer = attention_kind == "performer"
        fitted = feature_map_template(feature_map).fitted_fields if performer else ()
        self.fitted_feature_map = (
            FittedFeatureMap({n: getattr(self._draw(0)[1].stacked, n) for n in fitted})
            if fitted
            else nnx.data(None)
        )
        self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else nnx.data(None)
        self.decode_state: nnx.Cache[DecodeState] | None = nnx.data(None)
        # The draw decoding keeps, with the keys it came from (``kept_draw``).
        self.decode_draw: nnx.Cache[HeadsDraw] | None = nnx.data(None)
        self.decode_draw_keys: nnx.Cache[jax.Array] | None = nnx.data(None)
        self.cached_key: nnx.Cache[jax.Array] | None = nnx.data(None)
        self.cached_value: nnx.Cache[jax.Array] | None = nnx.data(None)
        self.cache_index: nnx.Cache[jax.Array] | None = nnx.data(None)

    def _draw(
        self, projection_step: jax.Array | int | None
    ) -> tuple[PerHead[Projection], PerHead[FeatureMap]]:
        """This call's per-head projection and feature map (see the class docstring)."""
        projection, fmap = self._draw_from(*self._draw_keys(projection_step))
        return projection, self._with_fitted(fmap)

    def _draw_keys(self, projection_step: jax.Array | int | None) -> tuple[jax.Array, jax.Array]:
        """The projection's and the feature map's keys for this call's step."""
        step = 0 if projection_step is None else projection_step
        stream = redraw_key(self.projection_key[...], step, redraw_interval=self.redraw_interval)
        projection_key, feature_map_key = jax.random.split(stream)
        return projection_key, feature_map_key

    def _draw_from(self, projection_key: jax.Array, feature_map_key: jax.Array) -> HeadsDraw:
        return draw_heads(
            projection_key,
            feature_map_key,
            head_dim=self.head_dim,
            num_heads=self.num_heads,
            num_features=self.num_features,
            coupling=self.coupling,
            feature_map=self.feature_map,
        )

    def _with_fitted(self, fmap: FeatureMap) -> PerHead[FeatureMap]:
        """``fmap`` with its fitted fields (``fitted_feature_map``)."""
        fitted = getattr(self, "fitted_feature_map", None)
        if fitted is not None:
            fmap = fmap.replace(**jax.tree.map(jax.lax.stop_gradient, fitted.get_value()))
        return PerHead(fmap)

    def init_cache(
        self,
        input_shape: tuple[int, ...],
        dtype: DTypeLike = jnp.float32,
        *,
        projection_step: jax.Array | int | None = None,
    ) -> None:
        """Creates the empty cache for inputs of shape ``(B, L, D)`` (``(B, 1, D)`` per step), as
        ``nnx.MultiHeadAttention.init_cache``: the FAVOR ``DecodeState`` (performer; its size
        does not depend on L) with the projection of ``projection_step`` (``None``: step 0),
        or Flax's key/value cache of length L (exact)."""
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))
        if self.attention_kind == "exact":
            shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)
            self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
            self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
            return
        keys = self._draw_keys(projection_step)
        projection, fmap = self._draw_from(*keys)
        self.decode_draw = nnx.Cache((projection, fmap))
        self.decode_draw_keys = nnx.Cache(draw_keys_data(*keys))
        self.decode_state = nnx.Cache(
            favor_decode_init(
                math.prod(input_shape[:-2]),
                self.num_heads,
                self.head_dim,
                projection,
                feature_map=self._with_fitted(fmap),
                dtype=dtype,
            )
        )

    def set_view(
        self,
        deterministic: bool | None = None,
        decode: bool | None = None,
        batch_size: int | tuple[int, ...] | None = None,
        max_length: int | None = None,
    ) -> None:
        """As ``nnx.MultiHeadAttention.set_view`` (what ``nnx.view`` calls): sets
        ``deterministic`` and ``decode``; ``decode`` on a layer without a cache creates it with
        ``init_cache((*batch_size, max_length, in_features), dtype)`` (``batch_size`` and
        ``max_length`` then required)."""
        if deterministic is not None:
            self.deterministic = deterministic
        if decode is None:
            return
        self.decode = decode
        if self.cache_index is None:
            if batch_size is None:
                raise TypeError("'batch_size' must be provided when initializing cache.")
            if max_length is None:
                raise TypeError("'max_length' must be provided when initializing cache.")
            batch = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
            shape = (*batch, max_length, self.in_features)
            self.init_cache(shape, jnp.float32 if self.dtype is None else self.dtype)

    def _check_cache(self, *names: str) -> None:
        if any(getattr(self, name) is None for name in names):
            raise ValueError("the decode cache is not initialised: call init_cache first")

    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_k: jax.Array | None = None,
        inputs_v: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
        sow_weights: bool = False,
        decode: bool | None = None,
        is_causal: bool = False,
        out_sharding: Any = None,
        qkv_sharding: Any = None,
        input_positions: jax.Array | None = None,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Attends from ``inputs_q`` ``(B, T, D)`` to ``inputs_k``/``inputs_v`` ``(B, S, D)``.

        Args:
          inputs_q, inputs_k, inputs_v, mask, deterministic, rngs, sow_weights, decode,
            out_sharding, qkv_sharding: as in ``nnx.MultiHeadAttention`` (masks: see the class
            docstring; ``sow_weights`` sows ``attention_weights`` ``(B, N, T, S)`` as
            ``nnx.Intermediate``, for the Performer formed by ``favor_attention_weights``).
          is_causal: causal attention (with the ``causal`` attribute or a causal mask).
          input_positions: as in ``nnx.MultiHeadAttention``: the positions passed to
            ``attention_fn`` (exact); for the Performer with the rotary ``attention_fn``, the
            positions ``(T,)`` of the rotation (while decoding, the new token's ``(1,)``);
            ``None``: ``0..T-1``. Without a rotary ``attention_fn`` the Performer has no use
            for positions and raises ``ValueError``.
          projection_step: the training step that selects the projection (performer only;
            ``None``: step 0, or while decoding the cache's projection, see the class
            docstring).

        Returns:
          ``(B, T, out_features)``.
        """
        inputs_k, inputs_v = keys_and_values(inputs_q, inputs_k, inputs_v, None)
        query = self.query(inputs_q, out_sharding=qkv_sharding)
        key = self.key(inputs_k, out_sharding=qkv_sharding)
        value = self.value(inputs_v, out_sharding=qkv_sharding)
        if self.query_ln is not None and self.key_ln is not None:  # normalize_qk
            query, key = self.query_ln(query), self.key_ln(key)
        if self.log_temperature is not None:
            query, key = cosine_scores(query, key, self.log_temperature[...])
        causal = self.causal or is_causal
        decode = bool(self.decode if decode is None else decode)
        check_sequence_call(self.sequence_axis, decode=decode, sow_weights=sow_weights)
        batch_shape = query.shape[:-3]
        flat = (lambda x: x.reshape(-1, *x.shape[-3:])) if len(batch_shape) != 1 else None
        if flat is not None:
            query, key, value = flat(query), flat(key), flat(value)
        if self.attention_kind == "exact":
            if mask is not None:  # over the cache's positions when decoding
                keys = self._cache_length() if decode else key.shape[1]
                shape = (*batch_shape, query.shape[2], query.shape[1], keys)
                mask = batched_mask(jnp.asarray(mask), shape)
            if decode:
                key, value, mask = self._append_to_cache(key, value, mask)
            out = self._exact(
                query,
                key,
                value,
                mask,
                causal and not decode,
                decode,
                deterministic,
                rngs,
                sow_weights,
                input_positions,
            )
        else:
            with matmul_precision(self.precision):
                out = self._favor(
                    query,
                    key,
                    value,
                    mask,
                    causal,
                    decode,
                    batch_shape,
                    sow_weights,
                    input_positions,
                    projection_step,
                )
        if flat is not None:
            out = out.reshape(*batch_shape, *out.shape[-3:])
        return self.out(out, out_sharding=out_sharding)

    def _favor(
        self,
        query,
        key,
        value,
        mask,
        causal,
        decode,
        batch_shape,
        sow_weights,
        input_positions,
        projection_step,
    ):
        """The Performer: rotary positions (if any), grouped heads repeated, then FAVOR or one
        decode step."""
        if self.rope is not None:
            query = rotate(self.rope, query, input_positions)
            key = rotate(self.rope, key, input_positions)
        elif input_positions is not None:
            raise ValueError(
                "input_positions: the Performer takes positions only for a rotary attention_fn "
                "(functools.partial(nnx.dot_product_attention_with_rope, rope=rope)); FAVOR "
                "itself has no positional term"
            )
        key, value = repeat_kv_heads(key, value, self.num_heads)
        if decode:
            return self._decode(query, key, value, mask, projection_step)
        return self._performer(
            query, key, value, mask, causal, batch_shape, sow_weights, projection_step
        )

    def _performer(
        self, query, key, value, mask, causal, batch_shape, sow_weights, projection_step
    ):
        projection, feature_map = self._draw(projection_step)
        favor = favor_mask(
            mask,
            batch_shape=batch_shape or (1,),
            num_heads=self.num_heads,
            query_length=query.shape[1],
            key_length=key.shape[1],
            causal=causal,
        )
        if sow_weights:
            weights = favor_heads_weights(query, key, projection, feature_map, favor, eps=self.eps)
            self.sow(nnx.Intermediate, "attention_weights", weights)
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

    def _exact(
        self,
        query,
        key,
        value,
        mask,
        causal,
        decode,
        deterministic,
        rngs,
        sow_weights,
        input_positions,
    ):
        """Flax's attention: ``attention_fn`` with the arguments ``nnx.MultiHeadAttention``
        passes it; non-finite inputs isolated (``isolating_non_finite``; while decoding, by
        the cache's NaN keys, ``kv_cache_step``)."""
        dropout_rng = None
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.dropout_rate > 0 and deterministic is None:
            raise ValueError(
                "deterministic must be given to the call or the layer when dropout_rate > 0"
            )
        if self.dropout_rate > 0 and not deterministic:
            stream = self.rngs if rngs is None else rngs
            stream = stream.dropout if isinstance(stream, nnx.Rngs) else stream
            if stream is None:
                raise ValueError(
                    "rngs must be given to the call when the layer was made with "
                    "keep_rngs=False and attention dropout is on"
                )
            dropout_rng = stream()
        positions = {} if input_positions is None else {"input_positions": input_positions}
        attend = functools.partial(
            self.attention_fn,
            mask=mask,
            dropout_rng=dropout_rng,
            dropout_rate=self.dropout_rate,
            broadcast_dropout=self.broadcast_dropout,
            deterministic=dropout_rng is None,
            dtype=self.dtype,
            precision=self.precision,
            module=self if sow_weights else None,
            is_causal=causal,
            **positions,
        )
        if decode:  # the cache holds non-finite tokens as NaN keys (kv_cache_step)
            return attend(query, key, value)
        return isolating_non_finite(attend, query, key, value, mask, causal=causal)

    def _cache_length(self) -> int:
        """The positions L of the exact kind's decode cache."""
        self._check_cache("cached_key")
        assert self.cached_key is not None  # for the type checker: checked above
        return self.cached_key[...].shape[1]

    def _append_to_cache(self, key, value, mask):
        self._check_cache("cached_key", "cached_value", "cache_index")
        length = key.shape[1]
        key, value, mask = kv_cache_step(
            self.cached_key[...], self.cached_value[...], self.cache_index[...], key, value, mask
        )
        self.cached_key[...], self.cached_value[...] = key, value
        self.cache_index[...] += length
        return key, value, mask

    def _decode(self, query, key, value, mask, projection_step):
        self._check_cache("decode_state", "decode_draw", "decode_draw_keys", "cache_index")
        projection, fmap = self._decode_draw(projection_step)
        state, out = decode_heads(
            self.decode_state.get_value(),
            self.cache_index.get_value(),
            query,
            key,
            value,
            projection,
            self._with_fitted(fmap),
            mask,
            chunk_size=self.chunk_size,
            eps=self.eps,
        )
        self.decode_state.set_value(state)
        self.cache_index.set_value(self.cache_index.get_value() + query.shape[1])
        return out

    def _decode_draw(self, projection_step: jax.Array | int | None) -> HeadsDraw:
        """The draw decoding uses: the cache's as it is when ``projection_step`` is None (no
        keys derived or compared per token), else that of ``projection_step``'s keys, drawn
        again only when they differ from those the cache's came from (``kept_draw``)."""
        kept, kept_keys = self.decode_draw, self.decode_draw_keys
        assert kept is not None and kept_keys is not None  # _decode checked the cache
        if projection_step is None:
            return kept.get_value()
        keys = self._draw_keys(projection_step)
        data = draw_keys_data(*keys)
        draw = kept_draw(
            kept.get_value(), kept_keys.get_value(), data, lambda: self._draw_from(*keys)
        )
        kept.set_value(draw)
        kept_keys.set_value(data)
        return draw
