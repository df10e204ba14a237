"""FAVOR attention: linear attention through random features, over any feature map and coupling.

``favor_attention(query, key, value, projection, ...)`` takes BTNH arrays like
``jax.nn.dot_product_attention`` and a drawn projection (any coupling in ``rfjax.projections``),
bidirectional or causal (chunked prefix sums with a memory-bounded custom VJP), with key padding
masks and a causal-safe stabiliser; ``favor_decode_init``/``favor_decode_step`` decode token by
token; ``softmax_attention`` is the exact reference. Signed and hybrid HRF feature-map pairs
(``TrigonometricFeatureMap``, ``AngularHybridFeatureMap``, ``ClusterHybridFeatureMap`` on a
``HybridProjection``) plug into ``feature_map=(query_map, key_map)``. Projections are
arguments: draw them with ``draw_projection`` and redraw them with
``redraw_key(rng, step, redraw_interval=...)``.
"""

from rfjax.attention._favor import (
    DecodeState,
    draw_projection,
    favor_attention,
    favor_attention_weights,
    favor_decode_init,
    favor_decode_step,
    redraw_key,
    softmax_attention,
)
from rfjax.attention._feature_maps import (
    ExponentialFeatureMap,
    ReluFeatureMap,
    SoftmaxFeatureMap,
    data_normalizer,
)
from rfjax.attention._hybrid_maps import (
    AngularHybridFeatureMap,
    ClusterHybridFeatureMap,
    HybridProjection,
    TrigonometricFeatureMap,
)

__all__ = [
    "AngularHybridFeatureMap",
    "ClusterHybridFeatureMap",
    "DecodeState",
    "ExponentialFeatureMap",
    "HybridProjection",
    "ReluFeatureMap",
    "SoftmaxFeatureMap",
    "TrigonometricFeatureMap",
    "data_normalizer",
    "draw_projection",
    "favor_attention",
    "favor_attention_weights",
    "favor_decode_init",
    "favor_decode_step",
    "redraw_key",
    "softmax_attention",
]
