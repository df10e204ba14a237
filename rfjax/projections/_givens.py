"""Products of random Givens rotations: a fast, approximately Haar orthogonal coupling."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._random import flat
from rfjax._validation import check_array_size, check_int
from rfjax.projections._base import Projection
from rfjax.projections._dense import _compute_dtype, _num_blocks, _validate, chi_norms
from rfjax.projections._structured import _jit_apply


def default_num_layers(dim: int) -> int:
    """2 ceil(log2 d) layers (at least 1): d log2 d rotations in all, Kac's walk mixing scale."""
    return max(1, 2 * math.ceil(math.log2(dim))) if dim > 1 else 0


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[..., b, index[b, j]] for x ``(..., B, d)`` and index ``(B, d)``."""
    return jnp.take_along_axis(x, jnp.broadcast_to(index, x.shape), axis=-1)


def _rotate_pairs(y: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the coordinate pairs (y_0, y_1), (y_2, y_3), ...; an odd last one is kept."""
    pairs = cos.shape[-1]
    first, second = y[..., 0 : 2 * pairs : 2], y[..., 1 : 2 * pairs : 2]
    rotated = jnp.stack([cos * first - sin * second, sin * first + cos * second], axis=-1)
    rotated = rotated.reshape(*y.shape[:-1], 2 * pairs)
    return jnp.concatenate([rotated, y[..., 2 * pairs :]], axis=-1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GivensProjection(Projection):
    """Blocks W_b = N_b G_{b,L} ... G_{b,1} P_b D_b of d rows, applied in O(L d) per input.

    Per block: a Rademacher diagonal D_b, a uniformly random permutation P_b ((P x)_i =
    x_{pi(i)}), L layers G_{b,l} = Q_l^T B_l Q_l, each a random perfect matching of the
    coordinates (Q_l a uniform permutation, pairs (Q_l x)_{2k}, (Q_l x)_{2k+1}) with every pair
    rotated by its own angle theta ~ U[0, 2 pi) (B_l block-diagonal 2 x 2 rotations; for odd d
    one coordinate per layer is left alone), and d i.i.d. chi_d norms N_b.

    Attributes:
      signs: D, shape ``(num_blocks, d)``.
      permutation: pi, shape ``(num_blocks, d)``, int32.
      layer_permutations: Q_l as index arrays, shape ``(num_blocks, L, d)``, int32.
      layer_inverses: their inverses, shape ``(num_blocks, L, d)``, int32.
      angles: theta, shape ``(num_blocks, L, d // 2)``.
      norms: N, shape ``(num_blocks, d)``.
      output_dim: m, also ``num_features`` (static); the last block is truncated.
    """

    signs: jax.Array
    permutation: jax.Array
    layer_permutations: jax.Array
    layer_inverses: jax.Array
    angles: jax.Array
    norms: jax.Array
    output_dim: int = dataclasses.field(metadata={"static": True})

    @property
    def num_features(self) -> int:
        return self.output_dim

    @property
    def dim(self) -> int:
        return self.norms.shape[-1]

    @property
    def block_size(self) -> int:
        return self.dim

    @property
    def num_layers(self) -> int:
        """L, the number of Givens layers per block."""
        return self.angles.shape[-2]

    def _apply(self, x: jax.Array) -> jax.Array:
        return _jit_apply(self, x)

    def _apply_unjitted(self, x: jax.Array) -> jax.Array:
        dtype = jnp.result_type(x.dtype, self.norms.dtype)
        y = x.astype(dtype)[..., None, :] * self.signs.astype(dtype)  # (..., B, d)
        y = _gather(y, self.permutation)
        layers = (
            jnp.moveaxis(self.layer_permutations, -2, 0),
            jnp.moveaxis(self.layer_inverses, -2, 0),
            jnp.moveaxis(jnp.cos(self.angles).astype(dtype), -2, 0),
            jnp.moveaxis(jnp.sin(self.angles).astype(dtype), -2, 0),
        )

        def layer(y, factors):
            permutation, inverse, cos, sin = factors
            y = _rotate_pairs(_gather(y, permutation), cos, sin)
            return _gather(y, inverse), None

        y, _ = jax.lax.scan(layer, y, layers)
        y = y * self.norms.astype(dtype)
        return y.reshape(*y.shape[:-2], y.shape[-2] * y.shape[-1])[..., : self.num_features]

    def matrix(self) -> jax.Array:
        return self._apply(jnp.eye(self.dim, dtype=self.norms.dtype)).T


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _givens_factors(key, dim, num_features, dtype, num_layers):
    compute = _compute_dtype(dtype)
    num_blocks = _num_blocks(dim, num_features)
    sign_key, permutation_key, angle_key, norm_key = jax.random.split(key, 4)
    signs = flat(jax.random.rademacher, sign_key, (num_blocks, dim), dtype)
    identity = jnp.arange(dim, dtype=jnp.int32)
    permutations = jax.random.permutation(  # P and the L layer matchings, in one draw
        permutation_key,
        jnp.broadcast_to(identity, (num_blocks, num_layers + 1, dim)),
        axis=-1,
        independent=True,
    )
    permutation, layers = permutations[:, 0], permutations[:, 1:]
    inverses = jnp.argsort(layers, axis=-1).astype(jnp.int32)
    angle_shape = (num_blocks, num_layers, dim // 2)
    angles = flat(jax.random.uniform, angle_key, angle_shape, compute, maxval=2 * math.pi)
    norms = chi_norms(norm_key, (num_blocks, dim), dim, compute)
    return signs, permutation, layers, inverses, angles.astype(dtype), norms.astype(dtype)


def givens(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    dtype: DTypeLike = jnp.float32,
    num_layers: int | None = None,
) -> GivensProjection:
    """Orthogonal blocks from products of random Givens rotations, with chi_d norms.

    Per block of d rows: W = N G_L ... G_1 P D. Each layer G_l pairs the coordinates by a fresh
    random perfect matching (so the index pairs of a layer are distinct and disjoint; none is
    drawn with replacement) and rotates every pair by an independent angle ~ U[0, 2 pi). P is a
    uniform random permutation and D a Rademacher diagonal, N holds i.i.d. chi_d norms. Applying
    costs O(L d) per block and input (gathers and 2 x 2 rotations); W is never formed.

    Exact: the rows of a block are exactly orthogonal, their norms are exactly i.i.d. chi_d, and
    each row has mean 0 and E[w w^T] = I_d (P D make its coordinates exchangeable and
    sign-symmetric); blocks are independent. Approximate: the rotation G_L ... G_1 P D is not
    Haar-distributed, only close to it when L is of order log d (d/2 rotations per layer;
    Kac's random-rotation walk mixes after order d log d rotations), so higher moments of a row
    (E[exp(w.v)], the kernel estimates) carry a bias that vanishes as L grows. For d = 2 every
    layer is a uniform rotation and the block is exactly Haar; for d = 1 it is ±chi_1.

    Args:
      key: a PRNG key.
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      dtype: floating dtype of the factors.
      num_layers: L >= 0; ``None`` means ``default_num_layers(dim)`` = 2 ceil(log2 d).

    Returns:
      A ``GivensProjection`` with ``block_size == dim``.

    Examples:
      >>> import jax
      >>> w = givens(jax.random.key(0), 6, 9)
      >>> w.matrix().shape, w.num_layers
      ((9, 6), 6)

    References:
      Reid et al. 2023, arXiv:2301.13856, Sec. 4.2 (Givens products as a fast proxy for R);
      Dao et al. 2019, ICML (butterfly factorisations); Pillai & Smith, "Kac's walk on
      n-sphere mixes in n log n steps", Ann. Appl. Probab. 2017, arXiv:1507.08554.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype)
    if num_layers is None:
        num_layers = default_num_layers(dim)
    num_layers = check_int("num_layers", num_layers, minimum=0)
    num_blocks = _num_blocks(dim, num_features)
    arguments = {"dim": dim, "num_features": num_features}
    check_array_size(
        "the permutations (P and one matching per layer)",
        (num_blocks, num_layers + 1, dim),
        jnp.int32,
        {**arguments, "num_layers": num_layers},
    )
    check_array_size(
        "the Gaussian draw of the chi_d norms",
        (num_blocks, dim, dim),
        _compute_dtype(dtype),
        arguments,
    )
    signs, permutation, layers, inverses, angles, norms = _givens_factors(
        key, dim, num_features, dtype, num_layers
    )
    return GivensProjection(
        signs, permutation, layers, inverses, angles, norms, output_dim=num_features
    )
