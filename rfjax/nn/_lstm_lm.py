"""An LSTM language model with tied input/output embeddings (HRF App. I, Rawat et al. 2019)."""

from __future__ import annotations

import math
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from rfjax._validation import check_int, check_rate, check_real, vocabulary_ids

LOGITS = ("dot", "cosine")
LOGIT_SCALE_PARAM = "log_logit_scale"


def _symmetric_uniform(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """U(-0.1, 0.1), the usual PTB LSTM embedding initialisation (Zaremba et al. 2014)."""
    return jax.random.uniform(key, shape, dtype, -0.1, 0.1)


def _unit(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)


class LSTMLanguageModel(nn.Module):
    """Stacked LSTM over token embeddings whose outputs are queries for a (sampled) softmax.

    tokens -> embedding (V x H) -> dropout -> num_layers LSTMs of width H (dropout after each)
    -> queries q of width H. The output layer is tied to the input embedding (Inan et al. 2017;
    Press and Wolf 2017): the logits are o_i = q.e_i with e_i the output table's rows, so the
    model returns the queries and the output table and leaves the softmax (full or sampled, see
    ``rfjax.sampled_softmax.sampled_softmax_loss``) to the caller. Every sequence starts from a
    zero state.

    ``logits="dot"``: the output table is the embedding and o_i = q.e_i (HRF App. I, PTB).
    ``logits="cosine"``: queries and table rows are normalised and scaled by sqrt(s), so
    o_i = s q_bar.e_bar with a learned scale s = 1/tau (parameter ``log_logit_scale``), the
    normalised-embedding softmax of Rawat et al. 2019 (arXiv:1907.10747, Eq. 1): the model's
    softmax is then exactly the softmax kernel exp(q_bar.e_bar / tau) that random features
    estimate (``logit_temperature`` gives tau).

    Attributes:
      vocab_size: V.
      hidden_size: H (embedding and LSTM width; 200 in HRF App. I).
      num_layers: stacked LSTM layers (2 in HRF App. I).
      dropout_rate: dropout on the embeddings and every LSTM output (0.5 in HRF App. I); uses
        the ``"dropout"`` RNG stream when ``train``.
      logits: ``"dot"`` or ``"cosine"``.
      initial_logit_scale: s at initialisation (``"cosine"`` only), finite and > 0.

    Examples:
      >>> import jax
      >>> model = LSTMLanguageModel(vocab_size=50, hidden_size=8, logits="cosine")
      >>> tokens = jax.numpy.zeros((2, 3), int)
      >>> params = model.init(jax.random.key(0), tokens, train=False)
      >>> queries, table = model.apply(params, tokens, train=False)
      >>> queries.shape, table.shape, round(float(logit_temperature(params)), 6)
      ((2, 3, 8), (50, 8), 0.1)
    """

    vocab_size: int
    hidden_size: int = 200
    num_layers: int = 2
    dropout_rate: float = 0.5
    logits: Literal["dot", "cosine"] = "dot"
    initial_logit_scale: float = 10.0

    @nn.compact
    def __call__(self, tokens: jax.Array, *, train: bool) -> tuple[jax.Array, jax.Array]:
        """Queries ``(B, T, H)`` for int tokens ``(B, T)``, and the output table ``(V, H)``."""
        check_int("vocab_size", self.vocab_size, minimum=1)
        check_int("hidden_size", self.hidden_size, minimum=1)
        check_int("num_layers", self.num_layers, minimum=0)
        if self.logits not in LOGITS:
            raise ValueError(f"logits must be one of {LOGITS}, got {self.logits!r}")
        check_real("initial_logit_scale", self.initial_logit_scale, positive=True)
        check_rate("dropout_rate", self.dropout_rate)
        tokens = vocabulary_ids("tokens", tokens, self.vocab_size)
        embed = nn.Embed(
            self.vocab_size,
            self.hidden_size,
            embedding_init=_symmetric_uniform,
            name="embedding",
        )
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(embed(tokens))
        for layer in range(self.num_layers):
            x = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size), name=f"lstm_{layer}")(x)
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        if self.logits == "dot":
            return x, embed.embedding
        log_scale = self.param(
            LOGIT_SCALE_PARAM, nn.initializers.constant(math.log(self.initial_logit_scale)), ()
        )
        root = jnp.exp(0.5 * log_scale)
        return _unit(x) * root, _unit(embed.embedding) * root


def logit_temperature(variables: dict) -> jax.Array:
    """tau = 1/s of a ``logits="cosine"`` model's variables (a scalar)."""
    params = variables["params"]
    if LOGIT_SCALE_PARAM not in params:
        raise ValueError(
            f"variables have no {LOGIT_SCALE_PARAM!r}: logit_temperature needs a model with "
            "logits='cosine'"
        )
    return jnp.exp(-params[LOGIT_SCALE_PARAM])
