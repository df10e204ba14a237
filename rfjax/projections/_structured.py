"""Fast structured couplings from HD products (fast ORF, fast SimRF), and the padding and HD
rotation helpers that the P-model families (``_p_model``: circulant, Toeplitz, ...) share.

These projections store their factors (O(p) numbers per block) and never form W to apply it:
``x W^T`` costs O(p log p) per block of rows and per input, through the fast Walsh-Hadamard
transform (``rfjax.ops.fwht``). ``matrix()`` forms W by applying the
projection to the identity, for tests and analysis only.

Padding. The Walsh-Hadamard transform needs a power-of-two length, so inputs are zero-padded
from d to p = 2^ceil(log2 d). A block of an HD coupling is then p rows of a p x p matrix, of
which only the first d columns ever meet the (padded) input: W_block = (M_p)[:, :d]. This is the
construction of the SimRF paper (App. B.2.2: inputs are padded "such that [their] length is a
power of 2", and results are compared "for the same effective d").

References:
  Reid et al., "Simplex Random Features", ICML 2023, arXiv:2301.13856, Sec. 4.2, App. B.2.
  Choromanski, Rowland, Weller, "The Unreasonable Effectiveness of Structured Random Orthogonal
  Embeddings", NeurIPS 2017, arXiv:1703.00864.
  Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices", arXiv:1604.07356.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._random import flat
from rfjax._validation import check_array_size, check_int
from rfjax.ops import hd_chain
from rfjax.projections._base import Projection
from rfjax.projections._dense import (
    SIMPLEX_MIN_DIM,
    _compute_dtype,
    _num_blocks,
    _validate,
    chi_norms,
)


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def _pad_last(x: jax.Array, length: int) -> jax.Array:
    """Zero-pads the last axis of ``x`` to ``length`` (no copy when it already has it)."""
    extra = length - x.shape[-1]
    if extra == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def apply_hd(x: jax.Array, signs: jax.Array) -> jax.Array:
    """(H D_k) ... (H D_2)(H D_1) x along the last axis, H the normalised Hadamard matrix.

    One ``rfjax.ops.hd_chain`` of a single block with unit norms (a fused kernel on CPU and TPU:
    every rotation of a vector in one pass; elsewhere k ``fwht`` calls and products, the same
    numbers).

    Args:
      x: ``(..., p)`` with p a power of two.
      signs: the Rademacher diagonals, ``(k, p)``, D_1 first, in the dtype of ``x``.

    Returns:
      The rotated ``x``, of its shape; O(k p log p) per vector.
    """
    ones = jnp.ones((1, x.shape[-1]), x.dtype)
    return hd_chain(x, signs[None], ones)[..., 0, :]


def _output_dtype(x: jax.Array, leaf: jax.Array) -> jnp.dtype:
    return jnp.result_type(x.dtype, leaf.dtype)


class _UnjittedApply(Protocol):
    def _apply_unjitted(self, x: jax.Array) -> jax.Array: ...


@jax.jit
def _jit_apply(projection: _UnjittedApply, x: jax.Array) -> jax.Array:
    """``projection._apply_unjitted(x)`` compiled as one computation (no op-by-op dispatch)."""
    return projection._apply_unjitted(x)


@jax.jit
def _jit_padded_matrix(projection: HadamardProjection) -> jax.Array:
    eye = jnp.eye(projection.padded_dim, dtype=projection.norms.dtype)
    return projection._apply_padded(eye).T


def _stack_rows(blocks: jax.Array, num_features: int) -> jax.Array:
    """``(..., num_blocks, rows) -> (..., num_features)``: concatenate blocks, drop the tail."""
    flat = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1])
    return flat[..., :num_features]


# ---------------------------------------------------------------------------------------------
# HD products: fast ORF and fast SimRF
# ---------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HadamardProjection(Projection):
    """Blocks W_b = N_b [S] (H D_{b,k}) ... (H D_{b,1}), restricted to the first d columns.

    Per block b: k independent Rademacher diagonals D_{b,i} (p x p, p = 2^ceil(log2 d)), the
    normalised Hadamard matrix H, optionally the simplex matrix S of SimRF Eq. 9 (p x p, applied
    in O(p)), and p i.i.d. chi_p norms N_b. The input is zero-padded to p, so only the first d
    columns of the p x p block are used. Applying costs O(k p log p) per block and input.

    Attributes:
      signs: the diagonals, shape ``(num_blocks, k, p)``, entries +-1 (D_1 first).
      norms: the row norms in R^p, shape ``(num_blocks, p)``.
      input_dim: d, also ``dim`` (static).
      output_dim: m, also ``num_features`` (static); the last block is truncated.
      simplex: whether S is applied (fast SimRF) or not (fast ORF) (static).
    """

    signs: jax.Array
    norms: jax.Array
    input_dim: int = dataclasses.field(metadata={"static": True})
    output_dim: int = dataclasses.field(metadata={"static": True})
    simplex: bool = dataclasses.field(default=False, metadata={"static": True})

    @property
    def dim(self) -> int:
        return self.input_dim

    @property
    def num_features(self) -> int:
        return self.output_dim

    @property
    def padded_dim(self) -> int:
        """p, the power of two the inputs are padded to."""
        return self.signs.shape[-1]

    @property
    def block_size(self) -> int:
        return self.padded_dim

    def _apply_padded(self, x: jax.Array) -> jax.Array:
        """``(..., p) -> (..., m)``: the rows in R^p applied to padded inputs.

        One ``rfjax.ops.hd_chain`` call: a fused kernel where one exists (TPU), else the
        ``fwht`` calls and products.
        """
        dtype = _output_dtype(x, self.norms)
        blocks = hd_chain(
            x.astype(dtype),
            self.signs.astype(dtype),
            self.norms.astype(dtype),
            simplex=self.simplex,
        )
        return _stack_rows(blocks, self.num_features)

    def _apply(self, x: jax.Array) -> jax.Array:
        return _jit_apply(self, x)

    def _apply_unjitted(self, x: jax.Array) -> jax.Array:
        return self._apply_padded(_pad_last(x, self.padded_dim))

    def matrix(self) -> jax.Array:
        return self._apply(jnp.eye(self.dim, dtype=self.norms.dtype)).T

    def padded_matrix(self) -> jax.Array:
        """The rows in R^p before truncation to d columns, shape ``(num_features, p)``.

        Within a block these rows are exactly orthogonal (fast ORF) or have pairwise cosine
        exactly -1/(p-1) (fast SimRF); ``matrix()`` is its first d columns.
        """
        return _jit_padded_matrix(self)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _hd_factors(key, dim, num_features, dtype, num_rotations):
    padded = next_power_of_two(dim)
    num_blocks = _num_blocks(padded, num_features)
    sign_key, norm_key = jax.random.split(key)
    signs = flat(jax.random.rademacher, sign_key, (num_blocks, num_rotations, padded), dtype)
    norms = chi_norms(norm_key, (num_blocks, padded), padded, _compute_dtype(dtype))
    return signs, norms.astype(dtype)


_HD_APPROXIMATION_NOTE = """
    Exact and approximate properties (p = 2^ceil(log2 d), the padded dimension):

    * exact: within a block the rows in R^p (``padded_matrix()``) are {geometry}; each row has
      mean 0 and E[w w^T] = I_d (the Rademacher diagonals make the coordinates of a row
      sign-symmetric with E[u_j^2] = 1/p), and blocks are independent;
    * approximate: the directions in R^p are only approximately Haar-distributed (the HD
      product is a discrete random orthogonal matrix), so a row is only approximately
      N(0, I_d): the law of its norm is chi_d exactly only when d is a power of two, and the
      higher moments (hence E[exp(w.v)], the positive and Fourier feature estimates) carry a
      small bias that shrinks as p and k grow. By exact enumeration at p = 4, k = 3, the first
      coordinate of a direction takes only the values 0, +-1/2, +-1 (E[u_1^4] = 0.109 against
      0.125 under Haar), and E[exp(w.v)] is 0.5% below exp(|v|^2/2) at v = 0.8 e_1 and 2.2%
      below at v = 1.5 e_1. At d = 5 (p = 8) a KS test of the row norms against chi_5 detects
      the difference with 2 * 10^4 draws.

    Norms: each row is scaled by a chi_p norm in R^p, so a row is the first d coordinates of an
    (approximately) N(0, I_p) vector, as in the paper's padded construction. Renormalising the
    truncated rows to exact chi_d norms was rejected: for small p a truncated row of an HD product
    is exactly zero with positive probability (about 6% of rows at d = 3, 2% at d = 5, with
    k = 3), which leaves nothing to renormalise, and E[w w^T] = I_d would no longer be exact.
"""


def _check_num_rotations(num_rotations: object) -> int:
    return check_int("num_rotations", num_rotations, minimum=1)


def _check_hd_sizes(dim: int, num_features: int, dtype: jnp.dtype, num_rotations: int) -> None:
    """The size caps on the factors ``_hd_factors`` draws: the signs and the Gaussian draw of
    the chi_p norms (p Gaussian vectors in R^p per block)."""
    padded = next_power_of_two(dim)
    num_blocks = _num_blocks(padded, num_features)
    arguments = {"dim": dim, "num_features": num_features}
    check_array_size(
        "the Rademacher diagonals",
        (num_blocks, num_rotations, padded),
        dtype,
        {**arguments, "num_rotations": num_rotations},
    )
    check_array_size(
        "the Gaussian draw of the chi_p norms (p = 2^ceil(log2 d))",
        (num_blocks, padded, padded),
        _compute_dtype(dtype),
        arguments,
    )


def hd_orthogonal(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    dtype: DTypeLike = jnp.float32,
    num_rotations: int = 3,
) -> HadamardProjection:
    """Fast orthogonal random features: blocks W = N (H D_k) ... (H D_1) on zero-padded inputs.

    The Haar rotation R of ORF is replaced by the HD product R_HD = prod_i H D_i (SimRF Eq.
    89-90, k = 3 in the paper), H the normalised p x p Hadamard matrix and D_i independent
    Rademacher diagonals; N holds i.i.d. chi_p norms. A block is p rows; ceil(m/p) independent
    blocks are drawn and the last one truncated. Applying costs O(k p log p) per block and
    input, storage O((k + 1) p) per block; W is never formed.
    {note}
    Args:
      key: a PRNG key.
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      dtype: floating dtype of the factors.
      num_rotations: k >= 1, the number of HD factors.

    Returns:
      A ``HadamardProjection`` with ``block_size == p``.

    Examples:
      >>> import jax
      >>> w = hd_orthogonal(jax.random.key(0), 5, 12)
      >>> w.matrix().shape, w.block_size
      ((12, 5), 8)

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 89-90 and App. B.2; Yu et al. 2016,
      arXiv:1610.09072 (structured ORF).
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype)
    num_rotations = _check_num_rotations(num_rotations)
    _check_hd_sizes(dim, num_features, dtype, num_rotations)
    signs, norms = _hd_factors(key, dim, num_features, dtype, num_rotations)
    return HadamardProjection(signs, norms, dim, num_features, simplex=False)


def fast_simplex(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    dtype: DTypeLike = jnp.float32,
    num_rotations: int = 3,
) -> HadamardProjection:
    """Fast simplex random features: blocks W = N S (H D_k) ... (H D_1) on zero-padded inputs.

    SimRF's W = D S R with the Haar R replaced by the HD product (SimRF Sec. 4.2, App. B.2):
    everything lives in the padded dimension p = 2^ceil(log2 d) as in the paper, so S is the
    p x p simplex matrix (applied in O(p), App. B.2.1) and a block is p rows whose directions
    in R^p point at the vertices of a regular simplex (pairwise cosine exactly -1/(p-1)). When
    d is a power of two this is the SimRF geometry in R^d; otherwise the truncation to the
    first d coordinates leaves the rows approximately, not exactly, at that angle. N holds
    i.i.d. chi_p norms; blocks are independent, the last one is truncated.
    {note}
    Args:
      key: a PRNG key.
      dim: input dimension d >= 2.
      num_features: number of rows m >= 1.
      dtype: floating dtype of the factors.
      num_rotations: k >= 1, the number of HD factors.

    Returns:
      A ``HadamardProjection`` with ``block_size == p`` and ``simplex == True``.

    Examples:
      >>> import jax
      >>> w = fast_simplex(jax.random.key(0), 5, 12)
      >>> w.matrix().shape, w.block_size, w.simplex
      ((12, 5), 8, True)

    References:
      Reid et al. 2023, arXiv:2301.13856, Sec. 4.2, App. B.2.1 and Eq. 89-90.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype, min_dim=SIMPLEX_MIN_DIM)
    num_rotations = _check_num_rotations(num_rotations)
    _check_hd_sizes(dim, num_features, dtype, num_rotations)
    signs, norms = _hd_factors(key, dim, num_features, dtype, num_rotations)
    return HadamardProjection(signs, norms, dim, num_features, simplex=True)


hd_orthogonal.__doc__ = (hd_orthogonal.__doc__ or "").format(
    note=_HD_APPROXIMATION_NOTE.format(geometry="exactly orthogonal")
)
fast_simplex.__doc__ = (fast_simplex.__doc__ or "").format(
    note=_HD_APPROXIMATION_NOTE.format(geometry="at pairwise cosine exactly -1/(p-1)")
)
