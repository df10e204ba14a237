"""Flax NNX versions of rfjax's Performer modules.

``PerformerAttention`` is a drop-in for ``flax.nnx.MultiHeadAttention`` (exact or FAVOR
attention over any coupling and feature map) and ``PerformerViT`` a Vision Transformer made of
it; they share their attention maths with the linen modules of ``rfjax.nn`` (both call
``rfjax.attention``). Train them with ``nnx.Optimizer(model, optax..., wrt=nnx.Param)``: the
projection keys (``ProjectionKey``) and fitted feature-map fields (``FittedFeatureMap``) are
state, not parameters.
"""

from rfjax.nn.nnx._attention import FittedFeatureMap, PerformerAttention, ProjectionKey
from rfjax.nn.nnx._vit import PerformerViT

__all__ = ["FittedFeatureMap", "PerformerAttention", "PerformerViT", "ProjectionKey"]
