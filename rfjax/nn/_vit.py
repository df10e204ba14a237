"""PerformerViT: a Vision Transformer whose attention is exact or Performer (FAVOR)."""

from __future__ import annotations

from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import check_int, check_rate
from rfjax.nn._attention import AttentionKind, PerformerAttention

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[Pooling, ...] = ("cls", "mean")
# The blocks' attention keeps the name it had before PerformerAttention took Flax's auto-names,
# so that PerformerViT's parameter trees and checkpoints are unchanged.
ATTENTION_NAME = "PerformerAttention_0"


def check_vit_attributes(
    *,
    num_classes: object,
    patch_size: object,
    hidden_size: object,
    num_layers: object,
    num_heads: object,
    mlp_dim: object,
    dropout_rate: object,
    pooling: object,
) -> None:
    """Raises for sizes < 1 (``num_layers`` < 0), a ``dropout_rate`` outside [0, 1) and
    unknown poolings, naming the argument."""
    check_rate("dropout_rate", dropout_rate)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    for name, value in (
        ("num_classes", num_classes),
        ("patch_size", patch_size),
        ("hidden_size", hidden_size),
        ("num_heads", num_heads),
        ("mlp_dim", mlp_dim),
    ):
        check_int(name, value, minimum=1)
    check_int("num_layers", num_layers, minimum=0)


def check_vit_images(shape: tuple[int, ...], patch_size: int) -> None:
    """``shape`` must be ``(B, H, W, C)`` and the image sides H, W multiples of
    ``patch_size``."""
    if len(shape) != 4:
        raise ValueError(
            f"images must be (B, H, W) or (B, H, W, C) arrays; got shape {tuple(shape)}"
        )
    height, width = shape[1:3]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"image sides ({height}, {width}) must be multiples of patch_size {patch_size}"
        )


class _Block(nn.Module):
    """Pre-norm encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    num_heads: int
    mlp_dim: int
    dropout_rate: float
    attention: dict
    dtype: DTypeLike | None

    @nn.compact
    def __call__(self, x, *, train: bool, projection_step):
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = PerformerAttention(
            num_heads=self.num_heads, dtype=self.dtype, name=ATTENTION_NAME, **self.attention
        )(y, projection_step=projection_step, deterministic=not train)
        x = x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = nn.Dense(self.mlp_dim, dtype=self.dtype)(y)
        y = nn.gelu(y)
        y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = nn.Dense(x.shape[-1], dtype=self.dtype)(y)
        return x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)


class PerformerViT(nn.Module):
    """ViT (patch embedding, learned position embedding, pre-norm blocks, MLP head).

    Every block's attention is a ``PerformerAttention`` with ``attention_kind``, ``coupling``,
    ``num_features``, ``feature_map`` and ``redraw_interval``; the Performer kinds need the RNG
    stream ``"projection"`` and the step (``projection_step``) as described there. Dropout uses
    the ``"dropout"`` stream when ``train``.

    Attributes:
      num_classes: output logits.
      patch_size: square patch side (image sides must be multiples of it).
      hidden_size: token width D.
      num_layers: encoder blocks.
      num_heads: attention heads (D divisible by it).
      mlp_dim: hidden width of the block MLP.
      dropout_rate: dropout after attention and in the MLP, in [0, 1).
      pooling: ``"cls"`` (class token) or ``"mean"`` (mean over patch tokens).
      representation_size: width of a tanh pre-logits layer of the head (None: a linear head).
      attention_kind, coupling, num_features, feature_map, redraw_interval, query_key_norm,
        initial_temperature: as in ``PerformerAttention`` (``query_key_norm``: cosine scores
        tau q^.k^ with a learned per-head temperature, which bounds the scores and so the
        variance of the random-feature estimate of the softmax kernel).
      dtype: computation dtype.

    References:
      Dosovitskiy et al., "An Image is Worth 16x16 Words", arXiv:2010.11929; Choromanski et
      al., arXiv:2009.14794; Reid et al., "Simplex Random Features", arXiv:2301.13856, Sec. 5.4.
    """

    num_classes: int
    patch_size: int = 4
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_dim: int = 128
    dropout_rate: float = 0.0
    pooling: Pooling = "cls"
    representation_size: int | None = None
    attention_kind: AttentionKind = "performer"
    coupling: str = "orthogonal"
    num_features: int = 32
    feature_map: str = "positive"
    redraw_interval: int = 1000
    query_key_norm: bool = False
    initial_temperature: float = 1.0
    dtype: DTypeLike | None = None

    @nn.compact
    def __call__(
        self,
        images: jax.Array,
        *,
        train: bool = False,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Logits ``(B, num_classes)`` for ``images`` ``(B, H, W)`` or ``(B, H, W, C)``."""
        check_vit_attributes(
            num_classes=self.num_classes,
            patch_size=self.patch_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            dropout_rate=self.dropout_rate,
            pooling=self.pooling,
        )
        if images.ndim == 3:
            images = images[..., None]
        check_vit_images(images.shape, self.patch_size)
        p = self.patch_size
        x = nn.Conv(
            self.hidden_size,
            (p, p),
            strides=(p, p),
            padding="VALID",
            dtype=self.dtype,
            name="embedding",
        )(images)
        x = x.reshape(x.shape[0], x.shape[1] * x.shape[2], self.hidden_size)  # -1: B = 0
        if self.pooling == "cls":
            cls = self.param("cls", nn.initializers.zeros, (1, 1, self.hidden_size))
            x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, x.shape[2])), x], 1)
        position = self.param("position_embedding", nn.initializers.normal(0.02), (1, *x.shape[1:]))
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x + position)
        attention = {
            "attention_kind": self.attention_kind,
            "coupling": self.coupling,
            "num_features": self.num_features,
            "feature_map": self.feature_map,
            "redraw_interval": self.redraw_interval,
            "query_key_norm": self.query_key_norm,
            "initial_temperature": self.initial_temperature,
        }
        for layer in range(self.num_layers):
            x = _Block(
                num_heads=self.num_heads,
                mlp_dim=self.mlp_dim,
                dropout_rate=self.dropout_rate,
                attention=attention,
                dtype=self.dtype,
                name=f"block_{layer}",
            )(x, train=train, projection_step=projection_step)
        x = nn.LayerNorm(dtype=self.dtype, name="encoder_norm")(x)
        x = x[:, 0] if self.pooling == "cls" else jnp.mean(x, axis=1)
        if self.representation_size is not None:
            x = jnp.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name="pre_logits")(x))
        return nn.Dense(
            self.num_classes, kernel_init=nn.initializers.zeros, dtype=self.dtype, name="head"
        )(x)
