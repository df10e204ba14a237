"""FAVOR attention: linear attention through random features, over any feature map and coupling.

``favor_attention(query, key, value, projection, ...)`` takes BTNH arrays like
``jax.nn.dot_product_attention`` and a drawn projection (any coupling in ``rfjax.projections``),
bidirectional or causal (chunked prefix sums with a memory-bounded custom VJP), with key padding
masks and a causal-safe stabiliser, on one device or sequence parallel (``sequence_axis``: a
sequence split along its length over a mesh axis inside ``jax.shard_map``);
``favor_prefill`` gives the decode state after a prompt in one chunked pass and
``favor_decode_init``/``favor_decode_step`` decode token by token; ``favor_attention_weights``
forms the attention matrix; ``softmax_attention`` is the exact reference;
``fused_kernel_settings`` tunes the fused kernels' launch on a GPU. Feature maps are
those of ``rfjax.features`` (by name, or ``FeatureMap`` objects with their parameters);
attention adds only the data normaliser H^{-1/4} (``data_normalizer``) and the stabiliser.
Projections and maps are shared by the heads or marked ``PerHead``; draw projections with
``draw_projection`` and redraw them with ``redraw_key(rng, step, redraw_interval=...)``.
"""

from rfjax.attention._decode import (
    DecodeState,
    favor_decode_init,
    favor_decode_step,
    favor_prefill,
)
from rfjax.attention._favor import favor_attention
from rfjax.attention._head_features import data_normalizer
from rfjax.attention._kernel_settings import fused_kernel_settings
from rfjax.attention._per_head import PerHead, draw_projection, redraw_key
from rfjax.attention._reference import softmax_attention
from rfjax.attention._weights import favor_attention_weights

__all__ = [
    "DecodeState",
    "PerHead",
    "data_normalizer",
    "draw_projection",
    "favor_attention",
    "favor_attention_weights",
    "favor_decode_init",
    "favor_decode_step",
    "favor_prefill",
    "fused_kernel_settings",
    "redraw_key",
    "softmax_attention",
]
