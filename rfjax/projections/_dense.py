"""Dense couplings: i.i.d. Gaussian, orthogonal (ORF), simplex (SimRF) and simplex+ (SimRF+).

All samplers share the signature ``(key, dim, num_features, *, dtype) -> DenseProjection``. Every
row is marginally N(0, I_d): the coupled ones draw independent chi_d norms and Haar rotations
(QR with the sign fix). When ``num_features`` is not a multiple of ``dim``, ceil(m/d) independent
blocks are drawn and the last one is truncated (SimRF paper, footnote 2; Performer ORF). When
m < d (one partial block), ``orthogonal``, ``simplex`` and ``norm_coupled`` draw only the m rows
they use, a uniformly random orthonormal m-frame from the QR of a d x m Gaussian matrix (the law
of m rows of a Haar rotation; ``haar_rows``), at O(d m^2) rather than the O(d^3) of a d x d
rotation; for m >= d they draw exactly as before.

Sizes are checked before anything compiles: an argument implying an array past
``rfjax._validation.MAX_ARRAY_BYTES`` (2 GiB) is a ``ValueError`` naming it.

References:
  Yu et al., "Orthogonal Random Features", NeurIPS 2016, arXiv:1610.09072.
  Reid et al., "Simplex Random Features", ICML 2023, arXiv:2301.13856 (Eq. 8-9, 15-17).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._random import flat
from rfjax._validation import (
    check_array_size,
    check_choice,
    check_float_dtype,
    check_int,
    check_iterations,
    check_key,
)
from rfjax.ops import apply_simplex
from rfjax.projections._base import DenseProjection

# The simplex constructions need at least two input dimensions (a simplex in R^d, d >= 2).
SIMPLEX_MIN_DIM = 2


def _validate(
    key: jax.Array, dim: int, num_features: int, dtype: DTypeLike, *, min_dim: int = 1
) -> tuple[int, int, jnp.dtype]:
    check_key("key", key)
    dim = check_int("dim", dim, minimum=min_dim)
    num_features = check_int("num_features", num_features, minimum=1)
    return dim, num_features, check_float_dtype("dtype", dtype)


def _compute_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """QR and Gauss-Seidel run in float32 at least (no half-precision LAPACK)."""
    return jnp.promote_types(dtype, jnp.float32)


def haar_rotations(key: jax.Array, num_blocks: int, dim: int, dtype: jnp.dtype) -> jax.Array:
    """Haar-distributed orthogonal matrices, shape ``(num_blocks, dim, dim)``.

    QR of a Gaussian matrix with the sign fix Q diag(sign(diag(R))); without the fix the rows are
    not isotropic (docs/maths/couplings.md, orthogonal).
    """
    gaussian_matrices = flat(jax.random.normal, key, (num_blocks, dim, dim), dtype)
    q, r = jnp.linalg.qr(gaussian_matrices)
    signs = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))
    signs = jnp.where(signs == 0, 1, signs)
    return q * signs[..., None, :]


def chi_norms(key: jax.Array, shape: tuple[int, ...], dim: int, dtype: jnp.dtype) -> jax.Array:
    """Independent chi_d draws of the given shape: norms of standard Gaussian vectors in R^dim."""
    return jnp.linalg.norm(flat(jax.random.normal, key, (*shape, dim), dtype), axis=-1)


def simplex_directions(dim: int, dtype: DTypeLike = jnp.float32) -> jax.Array:
    """The d unit vectors s_i of SimRF Eq. 9, as rows of a ``(dim, dim)`` matrix.

    They point at the vertices of a regular simplex in the hyperplane ``u_d = 0``: unit norm,
    pairwise cosine -1/(d-1), summing to zero. For ``dim == 1`` the single direction is e_1.

    Args:
      dim: d >= 1.
      dtype: floating dtype of the result.

    Returns:
      S, shape ``(dim, dim)``.

    Raises:
      TypeError: if ``dim`` is not an integer or ``dtype`` is not a floating dtype.
      ValueError: if ``dim < 1``.

    Examples:
      >>> s = simplex_directions(3)
      >>> [round(float(c), 4) for c in (s[0] @ s[1], s[0] @ s[0])]
      [-0.5, 1.0]

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 9.
    """
    dim = check_int("dim", dim, minimum=1)
    dtype = check_float_dtype("dtype", dtype)
    check_array_size("the matrix S", (dim, dim), dtype, {"dim": dim})
    if dim == 1:
        return jnp.ones((1, 1), dtype)
    return apply_simplex(jnp.eye(dim, dtype=dtype), axis=0)


def _num_blocks(dim: int, num_features: int) -> int:
    return -(-num_features // dim)


def haar_rows(key: jax.Array, num_blocks: int, rows: int, dim: int, dtype: jnp.dtype) -> jax.Array:
    """The first ``rows`` rows of ``num_blocks`` Haar-distributed orthogonal matrices, shape
    ``(num_blocks, rows, dim)``.

    ``rows == dim``: ``haar_rotations``. ``rows < dim``: Q^T for the QR of a ``(dim, rows)``
    Gaussian matrix with the sign fix, a uniformly distributed orthonormal ``rows``-frame of
    R^dim, which is the law of any ``rows`` rows of a Haar rotation (invariance), at O(d r^2)
    and O(d r) memory.
    """
    if rows == dim:
        return haar_rotations(key, num_blocks, dim, dtype)
    gaussian_matrices = flat(jax.random.normal, key, (num_blocks, dim, rows), dtype)
    q, r = jnp.linalg.qr(gaussian_matrices)
    signs = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))
    signs = jnp.where(signs == 0, 1, signs)
    return jnp.swapaxes(q * signs[..., None, :], -1, -2)


def _block_rows(dim: int, num_features: int, whole_blocks: bool) -> int:
    """The rows of each block that are drawn: d, or m when one partial block is all there is
    (m < d) and the construction does not need the whole block (``whole_blocks``)."""
    return dim if whole_blocks else min(dim, num_features)


def _check_blocks(dim: int, num_features: int, dtype: jnp.dtype, whole_blocks: bool) -> None:
    """The size cap on the Gaussian draw behind the blocks' rotations (and their chi norms)."""
    rows = _block_rows(dim, num_features, whole_blocks)
    check_array_size(
        "the Gaussian draw of the blocks' rotations",
        (_num_blocks(dim, num_features), rows, dim),
        _compute_dtype(dtype),
        {"dim": dim, "num_features": num_features},
    )


def _rotations_and_norms(key, dim, num_features, dtype, *, whole_blocks=False):
    """Per block of a coupled projection: the rows drawn of a Haar rotation and as many
    independent chi_d norms (all d of a block, or the m of one partial block: ``_block_rows``).

    Shapes ``(num_blocks, rows, dim)`` and ``(num_blocks, rows)``, in at least float32.
    """
    compute = _compute_dtype(dtype)
    rotation_key, norm_key = jax.random.split(key)
    num_blocks = _num_blocks(dim, num_features)
    rows = _block_rows(dim, num_features, whole_blocks)
    rotations = haar_rows(rotation_key, num_blocks, rows, dim, compute)
    return rotations, chi_norms(norm_key, (num_blocks, rows), dim, compute)


def _stack_blocks(blocks: jax.Array, num_features: int) -> jax.Array:
    """``(num_blocks, dim, dim) -> (num_features, dim)``: stack and truncate the last block."""
    return blocks.reshape(-1, blocks.shape[-1])[:num_features]


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _gaussian(key, dim, num_features, dtype):
    return flat(jax.random.normal, key, (num_features, dim), dtype)


def gaussian(
    key: jax.Array, dim: int, num_features: int, *, dtype: DTypeLike = jnp.float32
) -> DenseProjection:
    """I.i.d. Gaussian projections (IIDRF): every entry of W is N(0, 1).

    Args:
      key: a PRNG key.
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      dtype: floating dtype of W.

    Returns:
      A ``DenseProjection`` with ``weights`` of shape ``(m, d)`` and ``block_size == 1``.

    Examples:
      >>> import jax
      >>> w = gaussian(jax.random.key(0), 4, 8)
      >>> w.matrix().shape
      (8, 4)
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype)
    check_array_size(
        "the matrix W", (num_features, dim), dtype, {"dim": dim, "num_features": num_features}
    )
    return DenseProjection(_gaussian(key, dim, num_features, dtype), block_size=1)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _orthogonal(key, dim, num_features, dtype):
    rotations, norms = _rotations_and_norms(key, dim, num_features, dtype)
    return _stack_blocks(norms[..., None] * rotations, num_features).astype(dtype)


def orthogonal(
    key: jax.Array, dim: int, num_features: int, *, dtype: DTypeLike = jnp.float32
) -> DenseProjection:
    """Orthogonal random features (ORF): blocks W = D R with R Haar on O(d), D chi_d norms.

    Rows within a block are exactly orthogonal; blocks are independent; when ``num_features`` is
    not a multiple of ``dim`` the last block is truncated. Each row is marginally N(0, I_d).
    For m < d only the m rows are drawn (a d x m QR, ``haar_rows``: the law of m rows of a
    d x d Haar rotation), so d may be large.

    Args:
      key: a PRNG key.
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      dtype: floating dtype of W (QR runs in at least float32).

    Returns:
      A ``DenseProjection`` of shape ``(m, d)`` with ``block_size == dim``.

    References:
      Yu et al. 2016, arXiv:1610.09072; SimRF paper Sec. 2.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype)
    _check_blocks(dim, num_features, dtype, whole_blocks=False)
    return DenseProjection(_orthogonal(key, dim, num_features, dtype), block_size=dim)


def _partial_simplex_block(rotation: jax.Array, norms: jax.Array, rows: int) -> jax.Array:
    """A partial block of ``rows`` < d vectors pointing at an r-vertex simplex, then rotated."""
    dim = rotation.shape[-1]
    directions = simplex_directions(rows, rotation.dtype)
    directions = jnp.pad(directions, ((0, 0), (0, dim - rows)))
    return norms[:rows, None] * (directions @ rotation)


def _simplex_gram_factor(dim: int, rows: int, dtype: jnp.dtype) -> jax.Array:
    """L, lower triangular with L L^T the Gram matrix of ``rows`` of the d simplex directions
    (1 on the diagonal, -1/(d-1) off it; positive definite for rows < d)."""
    gram = (dim * jnp.eye(rows, dtype=dtype) - jnp.ones((rows, rows), dtype)) / (dim - 1)
    return jnp.linalg.cholesky(gram)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _simplex(key, dim, num_features, dtype, partial_block):
    rotations, norms = _rotations_and_norms(key, dim, num_features, dtype)
    if num_features < dim:
        # One partial block: S_m R = L (Q' R) for S_m = L Q' (Q' orthonormal rows), and Q' R
        # is a uniform m-frame like the drawn one, so mixing the frame by any factor of the
        # rows' Gram matrix draws them with the block's law (the r-simplex: S_r itself).
        mixing = (
            simplex_directions(num_features, norms.dtype)
            if partial_block == "simplex"
            else _simplex_gram_factor(dim, num_features, norms.dtype)
        )
        return (norms[0][:, None] * (mixing @ rotations[0])).astype(dtype)
    blocks = norms[..., None] * apply_simplex(rotations, axis=-2)  # D (S R), S in O(d) per column
    weights = _stack_blocks(blocks, num_features)
    rest = num_features % dim
    if partial_block == "simplex" and rest:
        last = _partial_simplex_block(rotations[-1], norms[-1], rest)
        weights = weights.at[num_features - rest :].set(last)
    return weights.astype(dtype)


def simplex(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    dtype: DTypeLike = jnp.float32,
    partial_block: Literal["truncate", "simplex"] = "truncate",
) -> DenseProjection:
    """Simplex random features (SimRF, Eq. 8): blocks W = D S R.

    D holds i.i.d. chi_d norms, R is Haar on O(d) and S (rows s_i of Eq. 9) points the d rows of
    a block at the vertices of a regular simplex: pairwise cosine -1/(d-1). S R is formed with
    the O(d)-per-vector product of App. B.2.1. Each row is marginally N(0, I_d); blocks are
    independent.

    Args:
      key: a PRNG key.
      dim: input dimension d >= 2.
      num_features: number of rows m >= 1.
      dtype: floating dtype of W.
      partial_block: what the last block of r = m mod d rows is when m is not a multiple of d.
        ``"truncate"`` (default, as in the paper and the Performer): the first r rows of a full
        d-simplex block. ``"simplex"``: an r-vertex simplex (cosine -1/(r-1)), which has lower
        RF-conformity and is also unbiased (docs/maths/couplings.md, not in the paper).
        When m < d, the m rows are drawn with that partial block's law without a d x d
        rotation (a d x m QR, ``haar_rows``).

    Returns:
      A ``DenseProjection`` of shape ``(m, d)`` with ``block_size == dim``.

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 8-9 and App. B.2.1.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype, min_dim=SIMPLEX_MIN_DIM)
    check_choice("partial_block", partial_block, ("truncate", "simplex"))
    _check_blocks(dim, num_features, dtype, whole_blocks=False)
    weights = _simplex(key, dim, num_features, dtype, partial_block)
    return DenseProjection(weights, block_size=dim)


def _gauss_seidel_sweeps(norms: jax.Array, directions: jax.Array, num_sweeps: int) -> jax.Array:
    """SimRF+ Eq. 17: in-place sweeps w_i <- -(sum_{j!=i} w_j w^_j)/|...| with a running total."""
    dim = norms.shape[0]

    def update(i, state):
        dirs, total = state
        rest = total - norms[i] * dirs[i]
        length = jnp.linalg.norm(rest)
        new = jnp.where(length > 0, -rest / jnp.where(length > 0, length, 1), dirs[i])
        return dirs.at[i].set(new), rest + norms[i] * new

    def sweep(_, state):
        return jax.lax.fori_loop(0, dim, update, state)

    total = norms @ directions
    directions, _ = jax.lax.fori_loop(0, num_sweeps, sweep, (directions, total))
    return directions


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _simplex_plus(key, dim, num_features, dtype, num_sweeps):
    # The directions S+ depend on all d norms of a block: whole blocks, even for m < d.
    rotations, norms = _rotations_and_norms(key, dim, num_features, dtype, whole_blocks=True)
    start = simplex_directions(dim, norms.dtype)
    optimise = jax.vmap(_gauss_seidel_sweeps, in_axes=(0, None, None))
    directions = optimise(norms, start, num_sweeps)
    blocks = norms[..., None] * (directions @ rotations)
    return _stack_blocks(blocks, num_features).astype(dtype)


def simplex_plus(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    dtype: DTypeLike = jnp.float32,
    num_sweeps: int = 5,
) -> DenseProjection:
    """Weight-dependent simplex random features (SimRF+, Eq. 15-17): blocks W = D S+ R.

    Per block, norms D are drawn first (i.i.d. chi_d); the directions S+ start at the simplex
    geometry and are moved by ``num_sweeps`` Gauss-Seidel sweeps of Eq. 17 towards the fixed
    point of Eq. 16 (sum_i w_i w^_i = 0 when the norms allow a closed loop). The Haar R is applied
    afterwards, so each row is still marginally N(0, I_d). Norms and directions are drawn per
    block, following the paper (the official code reuses one draw for all blocks).

    Args:
      key: a PRNG key.
      dim: input dimension d >= 2.
      num_features: number of rows m >= 1.
      dtype: floating dtype of W (the sweeps run in at least float32).
      num_sweeps: number of Gauss-Seidel passes, >= 0 (0 gives SimRF). Each costs O(d^2).

    Returns:
      A ``DenseProjection`` of shape ``(m, d)`` with ``block_size == dim``.

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 15-17.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype, min_dim=SIMPLEX_MIN_DIM)
    num_sweeps = check_int("num_sweeps", num_sweeps, minimum=0)
    _check_blocks(dim, num_features, dtype, whole_blocks=True)
    check_iterations("num_sweeps", num_sweeps)
    weights = _simplex_plus(key, dim, num_features, dtype, num_sweeps)
    return DenseProjection(weights, block_size=dim)
