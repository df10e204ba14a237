"""PerformerViT in Flax NNX: the Vision Transformer of ``rfjax.nn.PerformerViT`` as an
``nnx.Module``, its attention ``rfjax.nn.nnx.PerformerAttention``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from rfjax.nn._attention_arguments import AttentionKind
from rfjax.nn._vit import Pooling, check_vit_attributes, check_vit_images
from rfjax.nn.nnx._attention import PerformerAttention

__all__ = ["PerformerViT"]


class _Block(nnx.Module):
    """Pre-norm encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width, num_heads, mlp_dim, dropout_rate, attention, dtype, rngs):
        self.attention_norm = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.attention = PerformerAttention(num_heads, width, dtype=dtype, rngs=rngs, **attention)
        self.mlp_norm = nnx.LayerNorm(width, dtype=dtype, rngs=rngs)
        self.mlp_in = nnx.Linear(width, mlp_dim, dtype=dtype, rngs=rngs)
        self.mlp_out = nnx.Linear(mlp_dim, width, dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

    def __call__(self, x, *, train, projection_step):
        y = self.attention(self.attention_norm(x), projection_step=projection_step)
        x = x + self.dropout(y, deterministic=not train)
        y = nnx.gelu(self.mlp_in(self.mlp_norm(x)))
        y = self.mlp_out(self.dropout(y, deterministic=not train))
        return x + self.dropout(y, deterministic=not train)


class PerformerViT(nnx.Module):
    """ViT (patch embedding, learned position embedding, pre-norm blocks, MLP head) in NNX.

    The layers and attributes of ``rfjax.nn.PerformerViT``; NNX needs the input sizes at
    construction (``image_size``, ``channels``). Each block's attention is an
    ``rfjax.nn.nnx.PerformerAttention`` with its own projection key (from ``rngs``); the call's
    ``projection_step`` selects the projections (redrawn every ``redraw_interval`` steps).

    Args:
      num_classes: output logits.
      image_size: (height, width) of the images (multiples of ``patch_size``).
      channels: image channels (images ``(B, H, W)`` have 1).
      patch_size, hidden_size, num_layers, num_heads, mlp_dim, dropout_rate, pooling,
        representation_size, attention_kind, coupling, num_features, feature_map,
        redraw_interval, query_key_norm, initial_temperature, dtype: as in
        ``rfjax.nn.PerformerViT``.
      rngs: ``nnx.Rngs`` (``"params"``; ``"dropout"`` when ``dropout_rate > 0``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from rfjax.nn import nnx as rnnx
      >>> vit = rnnx.PerformerViT(10, image_size=(28, 28), num_features=8, rngs=nnx.Rngs(0))
      >>> vit(jnp.zeros((2, 28, 28))).shape
      (2, 10)

    References:
      Dosovitskiy et al., "An Image is Worth 16x16 Words", arXiv:2010.11929; Choromanski et
      al., arXiv:2009.14794; Reid et al., "Simplex Random Features", arXiv:2301.13856, Sec. 5.4.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        image_size: tuple[int, int],
        channels: int = 1,
        patch_size: int = 4,
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        mlp_dim: int = 128,
        dropout_rate: float = 0.0,
        pooling: Pooling = "cls",
        representation_size: int | None = None,
        attention_kind: AttentionKind = "performer",
        coupling: str = "orthogonal",
        num_features: int = 32,
        feature_map: str = "positive",
        redraw_interval: int = 1000,
        query_key_norm: bool = False,
        initial_temperature: float = 1.0,
        dtype: DTypeLike | None = None,
        rngs: nnx.Rngs,
    ) -> None:
        check_vit_attributes(
            num_classes=num_classes,
            patch_size=patch_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            mlp_dim=mlp_dim,
            dropout_rate=dropout_rate,
            pooling=pooling,
        )
        height, width = image_size
        check_vit_images((1, height, width, channels), patch_size)
        self.image_shape = (height, width, channels)
        self.pooling = pooling
        self.embedding = nnx.Conv(
            channels,
            hidden_size,
            (patch_size, patch_size),
            strides=(patch_size, patch_size),
            padding="VALID",
            dtype=dtype,
            rngs=rngs,
        )
        tokens = (height // patch_size) * (width // patch_size) + (pooling == "cls")
        self.cls = nnx.Param(jnp.zeros((1, 1, hidden_size))) if pooling == "cls" else nnx.data(None)
        self.position_embedding = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (1, tokens, hidden_size))
        )
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        attention = {
            "attention_kind": attention_kind,
            "coupling": coupling,
            "num_features": num_features,
            "feature_map": feature_map,
            "redraw_interval": redraw_interval,
            "query_key_norm": query_key_norm,
            "initial_temperature": initial_temperature,
        }
        self.blocks = nnx.List(
            [
                _Block(hidden_size, num_heads, mlp_dim, dropout_rate, attention, dtype, rngs)
                for _ in range(num_layers)
            ]
        )
        self.encoder_norm = nnx.LayerNorm(hidden_size, dtype=dtype, rngs=rngs)
        self.pre_logits = (
            nnx.Linear(hidden_size, representation_size, dtype=dtype, rngs=rngs)
            if representation_size is not None
            else nnx.data(None)
        )
        self.head = nnx.Linear(
            hidden_size if representation_size is None else representation_size,
            num_classes,
            kernel_init=nnx.initializers.zeros,
            dtype=dtype,
            rngs=rngs,
        )

    def __call__(
        self,
        images: jax.Array,
        *,
        train: bool = False,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Logits ``(B, num_classes)`` for ``images`` ``(B, H, W)`` or ``(B, H, W, C)``."""
        images = images[..., None] if images.ndim == 3 else images
        if images.shape[1:] != self.image_shape:
            raise ValueError(
                f"images must have shape (B, *{self.image_shape}) (or (B, H, W) for one "
                f"channel), as given at construction; got {images.shape}"
            )
        x = self.embedding(images)
        x = x.reshape(x.shape[0], x.shape[1] * x.shape[2], x.shape[3])
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[2]))
            x = jnp.concatenate([cls, x], axis=1)
        x = self.dropout(x + self.position_embedding[...], deterministic=not train)
        for block in self.blocks:
            x = block(x, train=train, projection_step=projection_step)
        x = self.encoder_norm(x)
        x = x[:, 0] if self.cls is not None else jnp.mean(x, axis=1)
        if self.pre_logits is not None:
            x = jnp.tanh(self.pre_logits(x))
        return self.head(x)
