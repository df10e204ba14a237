"""Monte Carlo over independent keys in vmapped chunks, and the sample mean with its SE."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from experiments import outputs


def draw_in_chunks(
    draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    num_draws: int,
    draws_per_chunk: int,
    description: str,
) -> np.ndarray:
    """Stacks ``draw(keys)`` over ``num_draws`` independent keys in chunks (float64, draws first).

    ``draw`` maps a ``(count,)`` array of keys to a ``(count, ...)`` array (a jitted vmap).
    """
    results = []
    for start in outputs.progress(range(0, num_draws, draws_per_chunk), description):
        count = min(draws_per_chunk, num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        results.append(np.asarray(draw(keys), np.float64))
    return np.concatenate(results)


def mean_and_se(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the first axis and its standard error."""
    count = samples.shape[0]
    return samples.mean(axis=0), samples.std(axis=0, ddof=1) / np.sqrt(count)
