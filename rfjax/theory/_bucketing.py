"""Shape bucketing: one compilation of a kernel serves every eager call of a size class."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rfjax._validation import is_concrete

SMALLEST_BUCKET = 128
"""Eager inputs are padded to max(128, next power of two) elements: one executable per kernel
serves every call of up to 128 values (a few milliseconds of padding work at most)."""


def call_bucketed(
    kernel: Callable[..., jax.Array], parameters: tuple, arrays: tuple[jax.Array, ...]
) -> jax.Array:
    """``kernel(*parameters, *arrays)`` elementwise over the broadcast shape of ``arrays``.

    Concrete ``arrays`` are broadcast, flattened and zero-padded to a power-of-two length (every
    kernel here accepts 0 in every argument), and the result is cut back and reshaped.
    """
    shape = jnp.broadcast_shapes(*(array.shape for array in arrays))
    arrays = tuple(jnp.broadcast_to(array, shape) for array in arrays)
    if not all(is_concrete(array) for array in arrays):
        return kernel(*parameters, *arrays)
    size = math.prod(shape)
    padded = max(SMALLEST_BUCKET, 1 << max(size - 1, 0).bit_length())
    flat = tuple(jnp.pad(jnp.ravel(array), (0, padded - size)) for array in arrays)
    return kernel(*parameters, *flat)[:size].reshape(shape)
