"""The attributes and call arguments of ``PerformerAttention`` (linen and NNX), checked and read
as the Performer applies them: the attention kind, coupling and feature map, a sequence split
over devices, Flax's call forms and the Flax arguments that FAVOR replaces (``attention_fn``,
the einsum overrides, ``precision``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Literal

import jax

from rfjax import features
from rfjax._validation import check_bool, check_int, check_real
from rfjax.features import FeatureMap
from rfjax.projections import available as available_couplings

AttentionKind = Literal["exact", "performer"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = ("exact", "performer")


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
    causal: object,
    sequence_axis: str | None = None,
) -> int:
    """Validates the attention's attributes; returns the head dim H = features / num_heads."""
    num_heads = check_int("num_heads", num_heads, minimum=1)
    check_bool("causal", causal)
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
    if query_key_norm:
        check_real("initial_temperature", initial_temperature, positive=True)
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
