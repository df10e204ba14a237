"""The fast Walsh-Hadamard transform in plain XLA: a radix-2 butterfly, and Kronecker matmuls.

Both transform the last axis of their operand and run on every backend.

* ``xla_butterfly``: log2(n) stages of (a + b, a - b) on reshaped views; n log2 n additions.
* ``kronecker_matmul``: H_n = H_{a_1} (x) ... (x) H_{a_f} (Sylvester order, a_i powers of two
  of at most ``MAX_FACTOR`` = 128, the MXU and tensor-core tile), applied to the vector viewed as
  an a_1 x ... x a_f array by f small dense contractions, one per axis: n (a_1 + ... + a_f)
  multiply-adds instead of n log2 n additions, but as matrix products, which TPUs and GPUs run
  on their matrix units. The factors are as equal as possible (n = 2^15: 32 x 32 x 32).

Precision (both): float32 runs in float32 (matmuls at ``Precision.HIGHEST``, so no TF32 or
single-pass bfloat16: products with +-1 are exact and the sums are float32 sums; integer inputs
stay exact up to 2^24), float64 in float64, and half types (float16, bfloat16) accumulate in
float32 and are rounded once at the end (the first contraction takes the half-precision operand
directly with a float32 result: its products are exact).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HALF_TYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
MAX_FACTOR = 128


def accumulation_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """The dtype the transform accumulates in: float32 for half types, else ``dtype``."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) in HALF_TYPES else jnp.dtype(dtype)


def xla_butterfly(x: jax.Array, normalize: bool) -> jax.Array:
    """Pure-XLA radix-2 transform of the last axis: log2(n) stages of (a + b, a - b).

    Half-precision inputs are accumulated in float32 and rounded once at the end.
    """
    n = x.shape[-1]
    out_dtype = x.dtype
    y = x.astype(accumulation_dtype(x.dtype))
    lead = y.shape[:-1]
    half = 1
    while half < n:
        pairs = y.reshape(*lead, n // (2 * half), 2, half)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        half *= 2
    if normalize:
        y = y * (1.0 / np.sqrt(n))
    return y.astype(out_dtype)


def kronecker_factors(n: int, max_factor: int = MAX_FACTOR) -> tuple[int, ...]:
    """Powers of two of at most ``max_factor``, as equal as possible, whose product is ``n``.

    Examples:
      >>> kronecker_factors(1 << 15), kronecker_factors(256), kronecker_factors(1)
      ((32, 32, 32), (16, 16), (1,))
    """
    k = n.bit_length() - 1
    max_bits = max_factor.bit_length() - 1
    count = max(1, -(-k // max_bits))
    bits = [k // count + (1 if i < k % count else 0) for i in range(count)]
    return tuple(1 << b for b in bits)


@functools.cache
def hadamard_matrix(n: int) -> np.ndarray:
    """The n x n Sylvester-Hadamard matrix in natural order, H[i, j] = (-1)^popcount(i & j)."""
    i = np.arange(n)
    parity = np.zeros((n, n), dtype=np.int64)
    bits = np.bitwise_and(i[:, None], i[None, :])
    while bits.any():
        parity ^= bits & 1
        bits >>= 1
    return (1 - 2 * parity).astype(np.float32)


def kronecker_matmul(x: jax.Array, normalize: bool) -> jax.Array:
    """H_n x along the last axis as one small dense contraction per Kronecker factor."""
    n = x.shape[-1]
    out_dtype = jnp.dtype(x.dtype)
    acc_dtype = accumulation_dtype(out_dtype)
    factors = kronecker_factors(n)
    lead = x.shape[:-1]
    y = x.reshape(*lead, *factors)
    first_axis = len(lead)
    for i, size in enumerate(factors):
        h = jnp.asarray(hadamard_matrix(size), dtype=y.dtype)  # +-1: exact in every dtype
        axis = first_axis + i
        # Contract axis `axis` of y with H (symmetric) and put the result back in that place.
        y = lax.dot_general(
            y,
            h,
            (((axis,), (0,)), ((), ())),
            precision=lax.Precision.HIGHEST,
            preferred_element_type=acc_dtype,
        )
        y = jnp.moveaxis(y, -1, axis)
    y = y.reshape(x.shape)
    if normalize:
        y = y * (1.0 / np.sqrt(n))
    return y.astype(out_dtype)
