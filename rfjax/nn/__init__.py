"""Flax modules built on random features.

``PerformerAttention`` is a drop-in for ``flax.linen.MultiHeadDotProductAttention`` with exact
or Performer (FAVOR) attention over any coupling; ``PerformerViT`` is a Vision Transformer
made of it, ``PerformerLM`` a decoder-only causal language model whose sequence can be split
over devices; ``generate`` generates tokens from such a model in one compiled program (a
prefill of the prompt, then a scan over the new tokens carrying the decode cache).
``ImplicitAttentionPolicy`` is an implicit-attention policy (patch importance by exact or
random-feature attention, top-k masking, an MLP controller) for evolution strategies.
``ConformerEncoder`` is a Conformer-Performer encoder, ``LSTMLanguageModel`` an LSTM language
model that returns its queries and tied output table, for a full softmax or a sampled one
(``rfjax.sampled_softmax``).
Projections are drawn from the RNG stream ``"projection"`` and redrawn by the
explicit ``projection_step`` (see ``PerformerAttention``). ``rfjax.nn.nnx`` holds the Flax NNX
versions (``PerformerAttention`` as a drop-in for ``flax.nnx.MultiHeadAttention``, and
``PerformerViT``), which share the attention maths with these linen modules.
"""

from rfjax.nn._attention import (
    ATTENTION_KINDS,
    FEATURE_MAP_COLLECTION,
    PROJECTION_STREAM,
    PerformerAttention,
)
from rfjax.nn._conformer import ConformerEncoder, conformer_attentions, fit_conformer_clusters
from rfjax.nn._generate import Generated, generate
from rfjax.nn._iap import (
    IAP_ATTENTIONS,
    AttentionDraw,
    ImplicitAttentionPolicy,
    image_patches,
    patch_centres,
    top_k_mask,
    top_k_patches,
)
from rfjax.nn._lstm_lm import LOGITS, LSTMLanguageModel, logit_temperature
from rfjax.nn._patch_importance import (
    random_feature_importance,
    softmax_importance,
)
from rfjax.nn._performer_lm import PerformerLM
from rfjax.nn._vit import PerformerViT

__all__ = [
    "ATTENTION_KINDS",
    "FEATURE_MAP_COLLECTION",
    "IAP_ATTENTIONS",
    "LOGITS",
    "PROJECTION_STREAM",
    "AttentionDraw",
    "ConformerEncoder",
    "Generated",
    "ImplicitAttentionPolicy",
    "LSTMLanguageModel",
    "PerformerAttention",
    "PerformerLM",
    "PerformerViT",
    "conformer_attentions",
    "fit_conformer_clusters",
    "generate",
    "image_patches",
    "logit_temperature",
    "patch_centres",
    "random_feature_importance",
    "softmax_importance",
    "top_k_mask",
    "top_k_patches",
]
