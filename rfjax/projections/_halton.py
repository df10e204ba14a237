"""Randomised quasi-Monte Carlo projections from the Halton sequence (Avron et al. 2016)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from rfjax._validation import check_array_size, check_float_dtype, check_int, check_key
from rfjax.projections._base import DenseProjection


def _sieve_length(count: int) -> int:
    """The sieve that holds the first ``count`` primes: past the prime-counting bound."""
    return max(16, int(count * (np.log(count + 1) + np.log(np.log(count + 3)) + 3))) + 1


def first_primes(count: int) -> np.ndarray:
    """The first ``count`` primes, by a sieve sized with the prime-counting bound."""
    limit = _sieve_length(count) - 1
    sieve = np.ones(limit + 1, dtype=bool)
    sieve[:2] = False
    for p in range(2, int(limit**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = False
    return np.flatnonzero(sieve)[:count]


def halton_points(num_points: int, dim: int) -> np.ndarray:
    """Points 1..num_points of the Halton sequence in [0, 1)^dim, in float64.

    Coordinate j is the radical inverse of the index in the j-th prime base. Index 0 (the
    origin) is skipped.
    """
    bases = first_primes(dim).astype(np.float64)
    index = np.arange(1, num_points + 1, dtype=np.float64)[:, None]
    points = np.zeros((num_points, dim))
    scale = 1.0 / bases
    remaining = np.repeat(index, dim, axis=1)
    while np.any(remaining > 0):
        digit = np.mod(remaining, bases)
        points += digit * scale
        remaining = np.floor(remaining / bases)
        scale = scale / bases
    return points


def uniform_resolution(dtype: DTypeLike) -> float:
    """The clip of ``halton``'s shifted points in ``dtype``: they lie in [r, 1 - r], r =
    ``finfo(dtype).epsneg`` (the gap below 1, 2^-24 in float32), so their Gaussian quantiles lie
    in [-q, q], q = -Phi^{-1}(r) (5.29 in float32, 8.21 in float64)."""
    return float(jnp.finfo(dtype).epsneg)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _halton(key, dim, num_features, dtype):
    compute = jnp.promote_types(dtype, jnp.float32)
    points = jnp.asarray(halton_points(num_features, dim), compute)
    shift = jax.random.uniform(key, (dim,), compute)
    shifted = jnp.mod(points + shift, 1.0)
    # Symmetric: a sum that rounds to an integer gives exactly 0 (about once in 5 * 10^6
    # coordinates in float32), and a lower clip at the smallest normal number sent it to
    # Phi^{-1}(1.2e-38) = -13 while the top stops at 1 - epsneg (+5.29): a point mass far out
    # in one tail only.
    resolution = uniform_resolution(compute)
    shifted = jnp.clip(shifted, resolution, 1.0 - resolution)
    return jax.scipy.special.ndtri(shifted).astype(dtype)


def halton(
    key: jax.Array, dim: int, num_features: int, *, dtype: DTypeLike = jnp.float32
) -> DenseProjection:
    """Randomised Halton projections: w_i = Phi^{-1}(frac(h_i + u)), u ~ U[0, 1)^d.

    h_1..h_m are the first m points of the Halton sequence (prime bases 2, 3, 5, ...) and one
    uniform random shift u (a Cranley-Patterson rotation) is shared by all rows. Each shifted
    point is uniform on [0, 1)^d, so each row is marginally N(0, I_d) exactly; the rows are
    coupled through the low-discrepancy pattern. Shifted points are clipped symmetrically to
    [r, 1 - r], r the gap below 1 of the compute dtype (``uniform_resolution``: 2^-24 in
    float32), before the inverse Gaussian CDF Phi^{-1}: no row is infinite, and each is
    N(0, I_d) to the dtype's resolution, its tails cut at the same |w| = -Phi^{-1}(r) on both
    sides (5.29 in float32, 8.21 in float64: a Gaussian passes it with probability 1.2e-7 and
    2.2e-16).

    When it helps: in low input dimension. Random Fourier features of standardised digits
    (``benchmarks/sklearn_gram_error.py``, 512 features, 10 seeds) have relative Gram error
    0.102 +- 0.001 with Halton against 0.133 +- 0.005 i.i.d. at d = 8, but 0.38 +- 0.01 against
    0.147 +- 0.003 at d = 64 (the coordinates of large prime bases are strongly correlated over
    the first m points). Use it for d of about 10 or less; prefer ``orthogonal`` beyond.

    Args:
      key: a PRNG key (only the shift is random).
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      dtype: floating dtype of W.

    Returns:
      A ``DenseProjection`` of shape ``(m, d)``; all rows form one coupled block.

    References:
      Avron, Sindhwani, Yang, Mahoney, "Quasi-Monte Carlo Feature Maps for Shift-Invariant
      Kernels", JMLR 2016, arXiv:1412.8293.
    """
    check_key("key", key)
    dim = check_int("dim", dim, minimum=1)
    num_features = check_int("num_features", num_features, minimum=1)
    dtype = check_float_dtype("dtype", dtype)
    arguments = {"dim": dim, "num_features": num_features}
    check_array_size("the Halton points", (num_features, dim), np.float64, arguments)
    check_array_size(
        "the sieve of the first d primes", (_sieve_length(dim),), np.bool_, {"dim": dim}
    )
    return DenseProjection(_halton(key, dim, num_features, dtype), block_size=num_features)
