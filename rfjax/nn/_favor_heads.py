"""What the linen and NNX ``PerformerAttention`` share, free of either API: attribute checks,
Flax attention masks read as FAVOR's key padding and causality, the per-head draws, and FAVOR
over the heads (forward, explicit weights, decoding: a prefill or one step), all through
``rfjax.attention``."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features
from rfjax._validation import check_int, is_concrete
from rfjax.attention import (
    DecodeState,
    PerHead,
    draw_projection,
    favor_attention,
    favor_attention_weights,
    favor_decode_step,
    favor_prefill,
)
from rfjax.features import FeatureMap
from rfjax.projections import Projection
from rfjax.projections import available as available_couplings

AttentionKind = Literal["exact", "performer"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = ("exact", "performer")
MASK_FORMS = (
    "FAVOR applies a key padding mask and causality only: mask must be a key padding mask "
    "(B, S), or a Flax mask broadcastable to (B, N, T, S) that is key padding, query padding "
    "and/or causal (nn.make_attention_mask(q_pad, k_pad), nn.make_causal_mask(x), "
    "nn.combine_masks of them), the same for every head"
)


MASK_VALUES = (
    "FAVOR applies boolean masks (True = attend) and Flax's 0/1 masks (1 = attend, as "
    "nn.make_attention_mask gives them); it cannot apply an additive mask (0 = attend, -inf or a "
    "large negative number = masked) nor weights: pass mask == 0 of an additive mask, or a "
    "boolean key padding mask (B, S)"
)


def feature_map_template(feature_map: str | FeatureMap) -> FeatureMap:
    """The feature map without its parameters (``feature_map`` by name or as given)."""
    if isinstance(feature_map, str):
        if feature_map not in features.available():
            raise ValueError(
                f"feature_map must be a name from rfjax.features.available() "
                f"({', '.join(features.available())}) or a FeatureMap; got {feature_map!r}"
            )
        return features.get(feature_map)()
    if isinstance(feature_map, FeatureMap):
        return feature_map
    raise TypeError(
        f"feature_map must be a name from rfjax.features.available() or an "
        f"rfjax.features.FeatureMap, got {type(feature_map).__name__}"
    )


def check_attributes(
    *,
    num_heads: object,
    features: int,
    attention_kind: str,
    coupling: str,
    num_features: object,
    dropout_rate: float,
    redraw_interval: object,
    feature_map: str | FeatureMap,
    query_key_norm: bool,
    initial_temperature: float,
    sequence_axis: str | None = None,
) -> int:
    """Validates the attention's attributes; returns the head dim H = features / num_heads."""
    num_heads = check_int("num_heads", num_heads, minimum=1)
    if attention_kind not in ATTENTION_KINDS:
        raise ValueError(f"attention_kind must be one of {ATTENTION_KINDS}, got {attention_kind!r}")
    if attention_kind == "performer":
        if coupling not in available_couplings():
            raise ValueError(f"coupling must be one of {available_couplings()}, got {coupling!r}")
        check_int("num_features", num_features, minimum=1)
        if dropout_rate:
            raise ValueError(
                "dropout_rate must be 0 with attention_kind='performer' (the attention "
                f"weights are never formed); got {dropout_rate}"
            )
        if not isinstance(redraw_interval, int) or redraw_interval < 1:
            raise ValueError(f"redraw_interval must be an int >= 1, got {redraw_interval!r}")
        feature_map_template(feature_map)
    elif sequence_axis is not None:
        raise ValueError(
            "sequence_axis needs attention_kind='performer' (exact attention over a split "
            f"sequence is not implemented); got sequence_axis={sequence_axis!r} with "
            f"attention_kind={attention_kind!r}"
        )
    if query_key_norm and not initial_temperature > 0:
        raise ValueError(f"initial_temperature must be > 0, got {initial_temperature!r}")
    if features % num_heads:
        raise ValueError(f"qkv_features ({features}) must be divisible by num_heads ({num_heads})")
    return features // num_heads


def check_sequence_call(sequence_axis: str | None, *, decode: bool, sow_weights: bool) -> None:
    """A layer with ``sequence_axis`` attends over whole split sequences: not with ``decode``
    (one token at a time) or ``sow_weights`` (the (T, S) weights of a shard)."""
    if sequence_axis is not None and (decode or sow_weights):
        raise ValueError(
            f"sequence_axis={sequence_axis!r} splits a whole sequence over devices; it "
            f"does not combine with decode=True (one token at a time) or sow_weights=True "
            f"(the (T, S) weights of a shard); got decode={decode}, sow_weights={sow_weights}"
        )


def draw_heads(
    projection_key: jax.Array,
    feature_map_key: jax.Array,
    *,
    head_dim: int,
    num_heads: int,
    num_features: int,
    coupling: str,
    feature_map: str | FeatureMap,
) -> tuple[PerHead[Projection], FeatureMap]:
    """One projection per head from ``projection_key`` and the feature map's random parameters
    per head (its ``init``) from ``feature_map_key``; the map is stacked over the heads (axis 0),
    its fitted fields still at their ``init`` values (the module supplies them)."""
    projection = draw_projection(
        projection_key, head_dim, num_features, coupling=coupling, num_heads=num_heads
    )
    template = feature_map_template(feature_map)
    keys = jax.random.split(feature_map_key, num_heads)
    return projection, jax.vmap(lambda k: template.init(k, head_dim))(keys)


type HeadsDraw = tuple[PerHead[Projection], FeatureMap]


def draw_keys_data(*keys: jax.Array) -> jax.Array:
    """The raw data of the keys a draw comes from, stacked (what a decode cache compares)."""
    return jnp.stack([jax.random.key_data(key) for key in keys])


def kept_draw(
    kept: HeadsDraw, kept_keys: jax.Array, keys: jax.Array, draw: Callable[[], HeadsDraw]
) -> HeadsDraw:
    """The draw a decode cache keeps: ``kept`` while this call's keys (``draw_keys_data``) are
    the ones it came from (``kept_keys``), else ``draw()``, in a ``lax.cond``: a generated token
    draws nothing (the orthogonal coupling's QR decompositions and the random draws) unless its
    projection step starts a new redraw period. Redrawing per token made FAVOR's decoding 6-11x
    slower than a key/value cache on an H200 (``benchmarks/gpu_runs/2026-11-27-h200``)."""
    return jax.lax.cond(jnp.array_equal(kept_keys, keys), lambda: kept, draw)


class FavorMask(NamedTuple):
    """A Flax attention mask as FAVOR applies it.

    Attributes:
      key_padding: ``(B, S)`` bool, True = attend (``None``: every key).
      causal: a Python bool when known at trace time, else a traced bool scalar (a traced mask
        whose causality is read from its values).
    """

    key_padding: jax.Array | None
    causal: bool | jax.Array


def favor_mask(
    mask: jax.Array | None,
    *,
    batch_shape: tuple[int, ...],
    num_heads: int,
    query_length: int,
    key_length: int,
    causal: bool,
) -> FavorMask:
    """Reads a Flax attention mask as key padding and causality (see ``MASK_FORMS``).

    A mask M (True or non-zero = attend) broadcastable to ``batch_shape + (N, T, S)`` is
    accepted when, with q_t = any_s M_ts and k_s = any_{n, t} M_ts, it equals
    q_t k_s (padding) or q_t k_s [s <= t] (causal, T = S): exactly the masks that
    ``nn.make_attention_mask``, ``nn.make_causal_mask`` and their ``nn.combine_masks`` give
    (the decomposition is exact for them). Query padding needs nothing from FAVOR (a query row
    never affects another), so only k and causality are kept; the rows of padded queries attend
    to the unpadded keys where Flax's own attention averages all values (both are padding).
    A 2-D mask is a key padding mask ``(B, S)``. Masks are boolean or hold only 0 and 1 (Flax's
    float masks); other values (an additive mask) raise ``ValueError`` (``MASK_VALUES``).

    A concrete mask that is neither raises ``ValueError`` here; a traced one (inside ``jit``)
    has its causality chosen at run time (``FavorMask.causal`` traced) and raises at run time
    (through ``jax.debug.callback``, a ``JaxRuntimeError`` carrying the message). A traced
    mask thus costs an O(B N T S) check, a host callback and both FAVOR variants compiled (one
    runs) per call: pass the key padding mask ``(B, S)`` and ``causal`` instead to avoid them.
    """
    if mask is None:
        return FavorMask(None, causal)
    mask = _check_mask_values(jnp.asarray(mask))
    batch = math.prod(batch_shape)
    if mask.ndim == 2:
        return FavorMask(jnp.broadcast_to(mask, (batch, key_length)).astype(bool), causal)
    full = (*batch_shape, num_heads, query_length, key_length)
    try:
        jnp.broadcast_shapes(mask.shape, full)
    except ValueError:
        raise ValueError(f"{MASK_FORMS}; got mask of shape {mask.shape} for {full}") from None
    if mask.ndim > len(full):
        raise ValueError(f"{MASK_FORMS}; got mask of shape {mask.shape} for {full}")
    heads, rows = (1 if mask.ndim < n or mask.shape[-n] == 1 else full[-n] for n in (3, 2))
    mask = jnp.broadcast_to(mask, (*batch_shape, heads, rows, key_length)).astype(bool)
    mask = mask.reshape(batch, heads, rows, key_length)
    if heads == 1 and rows == 1:
        return FavorMask(mask[:, 0, 0], causal)
    query_any = jnp.any(mask, axis=-1, keepdims=True)
    key_padding = jnp.any(mask, axis=(1, 2))
    padding = query_any & key_padding[:, None, None, :]
    is_padding = jnp.all(mask == padding)
    can_be_causal = rows == key_length
    is_causal = can_be_causal & jnp.all(mask == (padding & jnp.tri(rows, dtype=bool)))
    if is_concrete(mask):
        padding_form, causal_form = bool(is_padding), bool(is_causal)
        if not (padding_form or causal_form):
            raise ValueError(f"{MASK_FORMS}; got a mask that is neither")
        return FavorMask(key_padding, causal or (causal_form and not padding_form))
    jax.debug.callback(_raise_unless_supported, is_padding | is_causal)
    if causal or not can_be_causal:
        return FavorMask(key_padding, causal)
    return FavorMask(key_padding, is_causal & ~is_padding)


def _raise_unless_supported(supported: np.ndarray) -> None:
    if not bool(supported):
        raise ValueError(f"{MASK_FORMS}; got a mask that is neither")


def _check_mask_values(mask: jax.Array) -> jax.Array:
    """``mask`` as bools, if it is boolean or holds only 0 and 1 (Flax's float masks); other
    values (an additive mask) raise ``ValueError`` (``MASK_VALUES``): here for a concrete mask,
    at run time (``jax.debug.callback``) for a traced one, at the cost of a host callback
    (boolean masks cost nothing)."""
    if mask.dtype == jnp.bool_:
        return mask
    binary = jnp.all((mask == 0) | (mask == 1))
    if is_concrete(binary):
        _raise_unless_binary(binary, mask.dtype)
    else:
        jax.debug.callback(functools.partial(_raise_unless_binary, dtype=mask.dtype), binary)
    return mask != 0


def _raise_unless_binary(binary: np.ndarray | jax.Array, dtype: object) -> None:
    if not bool(binary):
        raise ValueError(f"{MASK_VALUES}; got a {dtype} mask with values other than 0 and 1")


def by_causality[T](compute: Callable[[bool], T], causal: bool | jax.Array) -> T:
    """``compute(causal)``; a traced ``causal`` selects between both at run time."""
    if isinstance(causal, bool):
        return compute(causal)
    return jax.lax.cond(causal, lambda: compute(True), lambda: compute(False))


def favor_heads(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: FavorMask,
    *,
    chunk_size: int,
    eps: float | None,
    sequence_axis: str | None = None,
    implementation: str = "auto",
) -> jax.Array:
    """``favor_attention`` over ``(B, T, N, H)`` heads with a ``FavorMask`` (on the local shard
    of a sequence split over the mesh axis ``sequence_axis``, if given), by ``implementation``
    (``favor_attention``'s)."""
    return by_causality(
        lambda causal: favor_attention(
            query,
            key,
            value,
            projection,
            feature_map=feature_map,
            causal=causal,
            mask=mask.key_padding,
            chunk_size=chunk_size,
            eps=eps,
            sequence_axis=sequence_axis,
            implementation=implementation,
        ),
        mask.causal,
    )


def favor_heads_weights(
    query: jax.Array,
    key: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: FavorMask,
    *,
    eps: float | None,
) -> jax.Array:
    """The ``(B, N, T, S)`` weights that ``favor_heads`` applies (``favor_attention_weights``)."""
    return by_causality(
        lambda causal: favor_attention_weights(
            query,
            key,
            projection,
            feature_map=feature_map,
            causal=causal,
            mask=mask.key_padding,
            eps=eps,
        ),
        mask.causal,
    )


def decode_heads(
    state: DecodeState,
    index: jax.Array,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: jax.Array | None,
    *,
    chunk_size: int,
    eps: float | None,
) -> tuple[DecodeState, jax.Array]:
    """T tokens of causal FAVOR while decoding, on ``(B, T, N, H)`` heads after ``index`` tokens
    (the cache's): one token is a step (``favor_decode_step``); T > 1 tokens are a prefill
    (``favor_prefill``, the chunked causal form in one call), which starts the sequence
    (``check_prefill_start``). The new state keeps ``state``'s dtype.

    ``mask``: ``None``; for one token, whether its key is attended to, B elements (any shape,
    e.g. ``(B, 1, 1, 1)``); for a prefill, a key padding mask or Flax mask as ``favor_mask``
    reads them (causality is implied).
    """
    batch, length = query.shape[:2]
    if length == 1:
        return decode_step(state, query, key, value, projection, feature_map, mask, eps=eps)
    check_prefill_start(index)
    padding = favor_mask(
        mask,
        batch_shape=(batch,),
        num_heads=query.shape[2],
        query_length=length,
        key_length=length,
        causal=True,
    ).key_padding
    out, prefilled = favor_prefill(
        query,
        key,
        value,
        projection,
        feature_map=feature_map,
        mask=padding,
        chunk_size=chunk_size,
        eps=eps,
    )
    return jax.tree.map(lambda new, old: new.astype(old.dtype), prefilled, state), out


PREFILL_START = (
    "a call of T > 1 tokens while decoding (a prefill) starts a sequence: the cache must be "
    "empty (cache_index 0, as init or init_cache leave it); continue a sequence one token per "
    "call"
)


def check_prefill_start(index: jax.Array) -> None:
    """A prefill needs an empty cache (``index`` 0): raises ``ValueError`` here for a concrete
    ``index``, at run time (``jax.debug.callback``) for a traced one."""
    if is_concrete(index):
        _raise_unless_start(np.asarray(index))
    else:
        jax.debug.callback(_raise_unless_start, index)


def _raise_unless_start(index: np.ndarray) -> None:
    if int(index) != 0:
        raise ValueError(f"{PREFILL_START}; got cache_index {int(index)}")


def decode_step(
    state: DecodeState,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: PerHead[Projection],
    feature_map: FeatureMap | PerHead[FeatureMap],
    mask: jax.Array | None,
    *,
    eps: float | None,
) -> tuple[DecodeState, jax.Array]:
    """One token of causal FAVOR (``favor_decode_step``) on ``(B, 1, N, H)`` heads.

    ``mask``: ``None`` or a mask for the new token's key (True = attend) of size B (any shape
    of B elements, e.g. ``(B, 1, 1, 1)``).
    """
    batch = query.shape[0]
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.size != batch:
            raise ValueError(
                f"while decoding, mask must say whether the new token is attended to: B = "
                f"{batch} elements (e.g. shape (B, 1, 1, 1)); got shape {mask.shape}"
            )
        mask = mask.reshape(batch).astype(bool)
    state, out = favor_decode_step(
        state,
        query[:, 0],
        key[:, 0],
        value[:, 0],
        projection,
        feature_map=feature_map,
        mask=mask,
        eps=eps,
    )
    return state, out[:, None]


def isolating_non_finite(
    attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
    *,
    causal: bool = False,
) -> jax.Array:
    """Exact attention ``attend(query, key, value)`` (Flax's ``dot_product_attention`` with
    ``mask``, and the causal mask when ``causal``, applied inside) on ``(B, T, N, H)`` heads,
    with non-finite inputs isolated as in
    FAVOR (``rfjax.attention.favor_attention``): a query, key or value row holding a NaN or inf
    is zeroed before ``attend`` (Flax multiplies masked weights by values, so 0 * NaN would reach
    every row), and the output rows that attend to it are NaN: a query's own row, every row
    whose ``mask`` (nonzero = attend, broadcastable to ``(B, N, T, S)``; ``None``: all)
    allows a key or value. Masked keys and values are never read."""
    bad_query, bad_key = (~jnp.all(jnp.isfinite(x), axis=-1) for x in (query, key))
    bad_key = bad_key | ~jnp.all(jnp.isfinite(value), axis=-1)  # (B, S, N)
    query = jnp.where(bad_query[..., None], 0, query)
    key, value = (jnp.where(bad_key[..., None], 0, x) for x in (key, value))
    out = attend(query, key, value)
    groups = bad_query.shape[-1] // bad_key.shape[-1]  # grouped key/value heads read by N/N_kv
    reads_bad = jnp.repeat(jnp.moveaxis(bad_key, 1, 2), groups, axis=1)[:, :, None, :]  # B,N,1,S
    if causal:  # row t reads keys j <= t only
        length, keys = query.shape[1], key.shape[1]
        reads_bad = reads_bad & (jnp.arange(keys)[None, :] <= jnp.arange(length)[:, None])
    if mask is not None:
        reads_bad = reads_bad & (jnp.asarray(mask) != 0)
    batch, length, heads = bad_query.shape
    poisoned = jnp.broadcast_to(jnp.any(reads_bad, axis=-1), (batch, heads, length))
    poisoned = jnp.moveaxis(poisoned, 1, 2) | bad_query
    return jnp.where(poisoned[..., None], jnp.nan, out)


def keys_and_values(
    inputs_q: jax.Array,
    inputs_k: jax.Array | None,
    inputs_v: jax.Array | None,
    inputs_kv: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """Flax's call forms: (q), (q, k), (q, k, v) or (q, inputs_kv=kv)."""
    if inputs_kv is not None:
        if inputs_k is not None or inputs_v is not None:
            raise ValueError(
                "inputs_kv gives both keys and values: pass either inputs_kv or "
                "inputs_k/inputs_v, not both"
            )
        return inputs_kv, inputs_kv
    if inputs_k is None and inputs_v is not None:
        raise ValueError(
            "inputs_v needs inputs_k (for keys and values from one array pass inputs_k only)"
        )
    inputs_k = inputs_q if inputs_k is None else inputs_k
    return inputs_k, inputs_k if inputs_v is None else inputs_v


def cosine_scores(
    query: jax.Array, key: jax.Array, log_temperature: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Unit query and key per head ``(..., N, H)``, scaled so that q.k / sqrt(H) = tau q^.k^
    with tau = exp(log_temperature) of shape ``(N,)`` (``query_key_norm``)."""
    head_dim = query.shape[-1]
    scale = jnp.sqrt(jnp.exp(log_temperature) * math.sqrt(head_dim))[:, None]

    def unit(x):
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)

    return unit(query) * scale.astype(query.dtype), unit(key) * scale.astype(key.dtype)


def kv_cache_step(
    cached_key: jax.Array,
    cached_value: jax.Array,
    index: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Exact attention's decode call, as Flax's for one token: writes the keys and values
    ``(B, T, N, H)`` of T tokens at positions ``index, ..., index + T - 1`` of the caches
    ``(B, L, N, H)``; returns the caches and the mask ``(B, 1, T, L)`` under which query t sees
    the positions <= index + t (and ``mask``, if given, broadcast against it). T > 1 tokens are
    a prefill, which starts a sequence (``check_prefill_start``).

    A token whose key or value holds a NaN or inf is written as a NaN key and a zero value:
    attention that selects masked scores (Flax's and JAX's ``dot_product_attention``) then
    gives NaN to exactly the rows that attend to it (their scores hold a NaN) and nothing to
    the others (its score is selected away, its value is 0), as ``isolating_non_finite`` does,
    without a pass over the whole cache per token (which made a decode step 2.8x Flax's at
    L = 16k on CPU)."""
    batch, capacity = cached_key.shape[:2]
    length = key.shape[1]
    if length > capacity:
        raise ValueError(
            f"the decode cache holds L = {capacity} positions (the length init or init_cache "
            f"was given); got {length} tokens in one call (keys of shape {key.shape})"
        )
    if length > 1:
        check_prefill_start(index)
    usable = jnp.all(jnp.isfinite(key), axis=-1) & jnp.all(jnp.isfinite(value), axis=-1)
    key = jnp.where(usable[..., None], key, jnp.nan)
    value = jnp.where(usable[..., None], value, 0)
    zero = jnp.zeros((), index.dtype)
    at = (zero, index, zero, zero)
    cached_key = jax.lax.dynamic_update_slice(cached_key, key.astype(cached_key.dtype), at)
    cached_value = jax.lax.dynamic_update_slice(cached_value, value.astype(cached_value.dtype), at)
    seen = jnp.arange(capacity)[None, :] <= index + jnp.arange(length)[:, None]
    written = jnp.broadcast_to(seen, (batch, 1, length, capacity))
    return cached_key, cached_value, written if mask is None else written & jnp.asarray(mask, bool)


# --- Flax's MultiHeadAttention arguments, as the Performer applies them -------------------------


def check_flax_arguments(
    attention_kind: str,
    *,
    attention_fn: object,
    default_attention_fn: object,
    rope_attention_fn: object = None,
    **unsupported: object,
) -> Callable[..., jax.Array] | None:
    """Flax's attention arguments that FAVOR replaces, checked for ``attention_kind``.

    The exact kind takes them all (Flax's meaning). The Performer computes FAVOR in place of
    ``attention_fn`` and so takes it only at Flax's default, or as
    ``functools.partial(rope_attention_fn, rope=...)`` (NNX's rotary attention: the returned
    rotation is applied to queries and keys before FAVOR, which then estimates the softmax of
    the rotated scores); the ``unsupported`` ones (Flax's einsum overrides of the T x S
    products FAVOR never forms) only at ``None``.

    Returns:
      The rotary embedding to apply to queries and keys (an ``nnx.RoPE``), or None.

    Raises:
      ValueError: naming the argument that the Performer cannot apply.
    """
    if attention_kind != "performer":
        return None
    for name, value in unsupported.items():
        if value is not None:
            raise ValueError(
                f"{name} overrides a product of softmax attention (q k^T or its weights times "
                f"v) that attention_kind='performer' never forms; got {name}={value!r}: leave "
                "it None, or use attention_kind='exact'"
            )
    if attention_fn is default_attention_fn:
        return None
    if (
        rope_attention_fn is not None
        and isinstance(attention_fn, functools.partial)
        and attention_fn.func is rope_attention_fn
        and set(attention_fn.keywords) == {"rope"}
        and not attention_fn.args
    ):
        return attention_fn.keywords["rope"]
    accepted = "the default" + (
        " or functools.partial(nnx.dot_product_attention_with_rope, rope=rope)"
        if rope_attention_fn is not None
        else ""
    )
    raise ValueError(
        f"attention_fn: attention_kind='performer' computes FAVOR in place of softmax "
        f"attention, so attention_fn must be {accepted}; got {attention_fn!r} (use "
        "attention_kind='exact' for another attention function)"
    )


def matmul_precision(precision: object) -> contextlib.AbstractContextManager:
    """A context in which FAVOR's products run at Flax's ``precision`` (``None``: JAX's default;
    a ``jax.lax.Precision``, its name, or a pair of equal ones), through
    ``jax.default_matmul_precision``."""
    if precision is None:
        return contextlib.nullcontext()
    if isinstance(precision, (tuple, list)):
        if len(precision) != 2 or precision[0] != precision[1]:
            raise ValueError(
                "precision as a pair sets the two operands of one product; FAVOR runs several "
                f"products, so give one precision (or an equal pair); got {precision!r}"
            )
        precision = precision[0]
    try:
        name = jax.lax.Precision(precision).name.lower()
    except (ValueError, TypeError):
        raise TypeError(
            "precision must be None, a jax.lax.Precision or its name ('default', 'high', "
            f"'highest'), or a pair of equal ones, for attention_kind='performer'; got "
            f"{precision!r}"
        ) from None
    return jax.default_matmul_precision(name)


def repeat_kv_heads(key: jax.Array, value: jax.Array, num_heads: int) -> tuple[jax.Array, ...]:
    """Grouped key/value heads ``(..., N_kv, H)`` repeated to the N query heads (query head i
    reads key/value head i // (N / N_kv), as Flax's ``dot_product_attention`` groups them)."""
    groups = num_heads // key.shape[-2]
    if groups == 1:
        return key, value
    return jnp.repeat(key, groups, axis=-2), jnp.repeat(value, groups, axis=-2)


def rotate(rope: Callable[..., jax.Array], x: jax.Array, positions: jax.Array | None) -> jax.Array:
    """``nnx.RoPE`` applied per head to ``(..., L, N, H)`` (as
    ``nnx.dot_product_attention_with_rope`` applies it)."""
    if positions is None:
        return jax.vmap(rope, in_axes=-2, out_axes=-2)(x)
    return jax.vmap(rope, in_axes=(-2, None), out_axes=-2)(x, positions)
