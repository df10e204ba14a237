"""Flax modules built on random features.

``PerformerAttention`` is a drop-in for ``flax.linen.MultiHeadDotProductAttention`` with exact
or Performer (FAVOR) attention over any coupling; ``PerformerViT`` is a Vision Transformer
made of it. Projections are drawn from the RNG stream ``"projection"`` and redrawn by the
explicit ``projection_step`` (see ``PerformerAttention``).
"""

from rfjax.nn._attention import ATTENTION_KINDS, PROJECTION_STREAM, PerformerAttention
from rfjax.nn._vit import PerformerViT

__all__ = ["ATTENTION_KINDS", "PROJECTION_STREAM", "PerformerAttention", "PerformerViT"]
