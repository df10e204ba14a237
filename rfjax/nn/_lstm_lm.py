"""An LSTM language model with tied input/output embeddings (HRF App. I, Rawat et al. 2019)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rfjax._validation import check_int


def _symmetric_uniform(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """U(-0.1, 0.1), the usual PTB LSTM embedding initialisation (Zaremba et al. 2014)."""
    return jax.random.uniform(key, shape, dtype, -0.1, 0.1)


class LSTMLanguageModel(nn.Module):
    """Stacked LSTM over token embeddings whose outputs are queries for a (sampled) softmax.

    tokens -> embedding (V x H) -> dropout -> num_layers LSTMs of width H (dropout after each)
    -> queries q of width H. The output layer is tied to the input embedding (Inan et al. 2017;
    Press and Wolf 2017): the logits are o_i = q.e_i with e_i the embedding rows, so the model
    returns the queries and the embedding table and leaves the softmax (full or sampled, see
    ``sampled_softmax_loss``) to the caller. Every sequence starts from a zero state.

    Attributes:
      vocab_size: V.
      hidden_size: H (embedding and LSTM width; 200 in HRF App. I).
      num_layers: stacked LSTM layers (2 in HRF App. I).
      dropout_rate: dropout on the embeddings and every LSTM output (0.5 in HRF App. I); uses
        the ``"dropout"`` RNG stream when ``train``.
    """

    vocab_size: int
    hidden_size: int = 200
    num_layers: int = 2
    dropout_rate: float = 0.5

    @nn.compact
    def __call__(self, tokens: jax.Array, *, train: bool) -> tuple[jax.Array, jax.Array]:
        """Queries ``(B, T, H)`` for int tokens ``(B, T)``, and the embedding table ``(V, H)``."""
        check_int("vocab_size", self.vocab_size, minimum=1)
        check_int("hidden_size", self.hidden_size, minimum=1)
        check_int("num_layers", self.num_layers, minimum=0)
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
        return x, embed.embedding
