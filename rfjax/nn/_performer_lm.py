"""PerformerLM: a decoder-only language model with causal FAVOR (or exact) attention, whose
sequence can be split over devices."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import check_int, vocabulary_ids
from rfjax.features import FeatureMap
from rfjax.nn._attention import ATTENTION_KINDS, AttentionKind, PerformerAttention
from rfjax.nn._attention_compute import isolating_non_finite


def sinusoidal_positions(positions: jax.Array, dim: int) -> jax.Array:
    """``(T,) -> (T, dim)``: sin and cos of position / 10000^(2i / dim), dim even (Vaswani et
    al. 2017)."""
    frequencies = jnp.exp(-math.log(10_000.0) * jnp.arange(0, dim, 2) / dim)
    angles = positions[:, None].astype(jnp.float32) * frequencies[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def exact_causal_attention(query, key, value, mask=None, **unused) -> jax.Array:
    """``jax.nn.dot_product_attention`` in the place of Flax's ``attention_fn``: causal when no
    mask is given, else under ``mask`` (the decode cache's, or a split sequence's), with
    non-finite rows isolated (``isolating_non_finite``: a NaN token reached every earlier
    position, its masked weight 0 times its NaN value). Dropout and the other options Flax
    passes are not used (the LM has none)."""
    del unused
    if mask is not None:
        mask = mask.astype(bool)  # Flax's masks are float
    attend = functools.partial(jax.nn.dot_product_attention, mask=mask, is_causal=mask is None)
    return isolating_non_finite(attend, query, key, value, mask, causal=mask is None)


def token_nll(hidden: jax.Array, table: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
    """-log softmax(h_t table^T)[target_t] for every position, ``(B, T)``, float32.

    The (B, C, V) logits of one chunk of C positions at a time (``lax.map`` over chunks, each
    rematerialised in the backward pass), never the (B, T, V) logits of the whole sequence:
    at V = 10,000 and T = 65,536 those are 2.6 GB per sequence in float32.
    """
    batch, length = targets.shape
    chunk = min(chunk, length)
    pad = -length % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))

    @jax.checkpoint
    def one_chunk(inputs):
        h, t = inputs  # (B, C, D), (B, C)
        logits = (h @ table.T).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return jax.nn.logsumexp(logits, axis=-1) - picked

    def split(x):
        return jnp.moveaxis(x.reshape(batch, -1, chunk, *x.shape[2:]), 1, 0)

    nll = jax.lax.map(one_chunk, (split(hidden), split(targets)))  # (n, B, C)
    return jnp.moveaxis(nll, 0, 1).reshape(batch, -1)[:, :length]


class _DecoderBlock(nn.Module):
    """Pre-norm block: x + Attn(LN(x)) (causal), then x + MLP(LN(x))."""

    num_heads: int
    mlp_dim: int
    attention_kind: AttentionKind
    performer: dict  # PerformerAttention's options (performer only)
    sequence_axis: str | None
    decode: bool
    dtype: DTypeLike | None

    @nn.compact
    def __call__(self, x: jax.Array, *, projection_step) -> jax.Array:
        y = nn.LayerNorm(dtype=self.dtype)(x)
        if self.attention_kind == "performer":
            y = PerformerAttention(
                num_heads=self.num_heads,
                causal=True,
                sequence_axis=self.sequence_axis,
                decode=self.decode,
                dtype=self.dtype,
                **self.performer,
            )(y, projection_step=projection_step)
        elif self.decode:  # Flax's key/value cache, taking a prompt at once (a prefill)
            y = PerformerAttention(
                num_heads=self.num_heads,
                attention_kind="exact",
                attention_fn=exact_causal_attention,
                decode=True,
                dtype=self.dtype,
            )(y)
        else:
            attention = nn.MultiHeadDotProductAttention(
                num_heads=self.num_heads, attention_fn=exact_causal_attention, dtype=self.dtype
            )
            if self.sequence_axis is None:
                y = attention(y)
            else:  # every device's queries against the gathered keys of the whole sequence
                local = y.shape[1]
                full = jax.lax.all_gather(y, self.sequence_axis, axis=1, tiled=True)
                first = jax.lax.axis_index(self.sequence_axis) * local
                visible = jnp.arange(full.shape[1])[None, :] <= first + jnp.arange(local)[:, None]
                y = attention(y, full, full, mask=visible[None, None])
        x = x + y
        y = nn.LayerNorm(dtype=self.dtype)(x)
        y = nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype)(y))
        return x + nn.Dense(x.shape[-1], dtype=self.dtype)(y)


class PerformerLM(nn.Module):
    """A decoder-only Transformer language model with causal Performer (or exact) attention.

    Token embedding (scaled by sqrt(D)) plus sinusoidal positions, ``num_layers`` pre-norm
    blocks (causal multi-head attention, GELU MLP), a final LayerNorm and logits tied to the
    embedding. ``attention_kind="performer"`` attends with ``PerformerAttention(causal=True)``
    (FAVOR over ``num_features`` features of ``feature_map`` drawn with ``coupling``, redrawn
    every ``redraw_interval`` steps of ``projection_step`` from the ``"projection"`` RNG
    stream); ``"exact"`` with ``jax.nn.dot_product_attention`` (causal softmax) inside Flax's
    ``MultiHeadDotProductAttention``, whose parameters are laid out as the Performer's, so the
    two kinds initialise identically from the same key.

    Calls: ``model.apply(variables, tokens)`` gives the logits ``(B, T, V)``;
    ``model.apply(variables, tokens, targets)`` the per-token negative log-likelihood
    ``(B, T)`` (``token_nll``: chunks of ``loss_chunk`` positions, never the whole (B, T, V)
    logits, which at V = 10,000 and T = 64k are 2.6 GB per sequence).

    Sequence parallel (``sequence_axis``): inside ``jax.shard_map`` over a mesh axis that splits
    the sequence (``tokens`` of shape ``(B, T / D)`` on each device, in order), each device
    returns its positions' outputs of the whole sequence: positions count from the device's
    first (axis index times T / D); the Performer's causal state crosses devices
    (``favor_attention``'s ``sequence_axis``); exact attention gathers the keys and values of
    the whole sequence (each device holds (T / D) x T scores per head). Parameters and the
    ``"projection"`` key must be replicated.

    Decoding (``decode=True``, not with ``sequence_axis``): ``init`` with tokens of the longest
    length creates the ``"cache"`` collection; each ``apply(..., mutable=["cache"])`` then
    takes one token ``(B, 1)`` and returns its logits ``(B, 1, V)``, or, on the empty cache,
    a prompt ``(B, T)`` at once (a prefill: the Performer's causal FAVOR in its chunked form,
    ``rfjax.attention.favor_prefill``). The Performer's cache is FAVOR's recurrent state
    (``rfjax.attention.favor_decode_step``: O(m H) per head and token, whatever the length)
    with the drawn projection; the exact kind's is Flax's key/value cache (O(T) per token, in
    ``PerformerAttention(attention_kind="exact")``, whose parameters are laid out as
    ``MultiHeadDotProductAttention``'s). Pass the ``projection_step`` the parallel model was
    trained or evaluated at, with the ``"projection"`` stream (see ``PerformerAttention``:
    calls without the stream use the cache's projection). ``rfjax.nn.generate`` generates
    tokens from a prompt in one compiled program.

    Attributes:
      vocab_size: V.
      num_layers, embed_dim, num_heads, mlp_dim: sizes (``embed_dim`` even and a multiple of
        ``num_heads``).
      attention_kind: ``"performer"`` or ``"exact"``.
      feature_map, coupling, num_features, redraw_interval, chunk_size, implementation,
        query_key_norm, eps: ``PerformerAttention``'s (performer only).
      sequence_axis: the mesh axis that splits the sequence, or None.
      decode: decoding with a cache, one token per call after an optional prefill (see
        above).
      loss_chunk: positions per chunk of the loss's logits.
      dtype: computation dtype.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> model = PerformerLM(vocab_size=50, num_layers=1, embed_dim=16, num_heads=2,
      ...                     mlp_dim=32, num_features=8)
      >>> tokens = jnp.zeros((2, 12), jnp.int32)
      >>> variables = model.init(jax.random.key(0), tokens)
      >>> rngs = {"projection": jax.random.key(1)}
      >>> model.apply(variables, tokens, rngs=rngs).shape
      (2, 12, 50)
      >>> model.apply(variables, tokens, tokens, rngs=rngs).shape  # per-token NLL
      (2, 12)

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794 (causal
      FAVOR); Vaswani et al., "Attention Is All You Need", 2017 (sinusoidal positions).
    """

    vocab_size: int
    num_layers: int = 2
    embed_dim: int = 128
    num_heads: int = 4
    mlp_dim: int = 512
    attention_kind: AttentionKind = "performer"
    feature_map: str | FeatureMap = "positive"
    coupling: str = "orthogonal"
    num_features: int = 64
    redraw_interval: int = 1000
    chunk_size: int = 64
    implementation: str = "auto"
    query_key_norm: bool = False
    eps: float | None = None
    sequence_axis: str | None = None
    decode: bool = False
    loss_chunk: int = 512
    dtype: DTypeLike | None = None

    def _check(self) -> None:
        for name in ("vocab_size", "embed_dim", "num_heads", "mlp_dim", "loss_chunk"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("num_layers", self.num_layers, minimum=0)
        if self.embed_dim % 2 or self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim must be even and a multiple of num_heads ({self.num_heads}), got "
                f"{self.embed_dim}"
            )
        if self.attention_kind not in ATTENTION_KINDS:
            raise ValueError(
                f"attention_kind must be one of {ATTENTION_KINDS}, got {self.attention_kind!r}"
            )
        if self.decode and self.sequence_axis is not None:
            raise ValueError(
                f"decode=True takes one token at a time and cannot split it over devices; got "
                f"sequence_axis={self.sequence_axis!r}"
            )

    def _positions(self, length: int) -> jax.Array:
        """The global positions of this call's tokens: after the cache's (decode), offset by
        the device's place on ``sequence_axis`` (split), else 0..T-1."""
        local = jnp.arange(length, dtype=jnp.int32)
        if self.decode:
            decoding = self.has_variable("cache", "position")
            position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
            if decoding:
                start = position.value
                position.value = start + length
                return start + local
            return local
        if self.sequence_axis is not None:
            return jax.lax.axis_index(self.sequence_axis) * length + local
        return local

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        targets: jax.Array | None = None,
        *,
        projection_step: jax.Array | int | None = None,
    ) -> jax.Array:
        """Logits ``(B, T, V)`` of ``tokens`` ``(B, T)``, or the per-token NLL ``(B, T)`` of
        ``targets`` (see the class docstring)."""
        self._check()
        tokens = vocabulary_ids("tokens", tokens, self.vocab_size)
        embed = nn.Embed(self.vocab_size, self.embed_dim, name="embed")
        positions = sinusoidal_positions(self._positions(tokens.shape[1]), self.embed_dim)
        x = embed(tokens) * math.sqrt(self.embed_dim) + positions.astype(embed.embedding.dtype)
        performer = dict(
            feature_map=self.feature_map,
            coupling=self.coupling,
            num_features=self.num_features,
            redraw_interval=self.redraw_interval,
            chunk_size=self.chunk_size,
            implementation=self.implementation,
            query_key_norm=self.query_key_norm,
            eps=self.eps,
        )
        block = functools.partial(
            _DecoderBlock,
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            attention_kind=self.attention_kind,
            performer=performer,
            sequence_axis=self.sequence_axis,
            decode=self.decode,
            dtype=self.dtype,
        )
        for _ in range(self.num_layers):
            x = block()(x, projection_step=projection_step)
        hidden = nn.LayerNorm(dtype=self.dtype)(x)
        if targets is None:
            # embed.attend's product written as a contraction over the table's feature axis:
            # hidden @ table.T made a transposed copy of the (V, D) table at every decoded token
            # (in the compiled loop of rfjax.nn.generate, where the table is an argument).
            hidden, table = embed.promote_dtype(hidden, embed.embedding, dtype=embed.dtype)
            return jnp.einsum("btd,vd->btv", hidden, table)
        targets = vocabulary_ids("targets", targets, self.vocab_size)
        return token_nll(hidden, embed.embedding, targets, self.loss_chunk)
