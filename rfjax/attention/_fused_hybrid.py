"""The Pallas kernels of fused FAVOR attention (``_fused``) for the angular hybrid (HRF Eq. 12,
variant II; ``rfjax.features.angular_hybrid_features``), with the arguments of the affine maps'
kernels (``_fused_kernels``), so that the same passes run them.

The hybrid's score of a query x and a key y is lambda P(x, y) + (1 - lambda) R(x, y): P and R the
positive (antithetic) and trigonometric estimates from the base projection W, and
lambda = 1/2 - sigma(x) . sigma(y), sigma = sgn(T x) / sqrt(2n) from the sign projection T. The
kernels never form Lemma 2.3's flat features ((n + 1) 4m of them):

* the rows' parts in the XLA form's units (``_scaled_bases``): per row s = max(max_i l_i, a)
  with l = [z, -z] - |x|^2/2 - log(2m)/2 the positive log-features (z = W x, from W2 = [W; -W]),
  a = |x|^2/2 - log(m)/2, and the bases psi+ = e^{l - s}, psi' = e^{a - s} [sin z, cos z]
  (``_Part``), in tiles of ``FEATURE_TILE`` features read from W2's rows, each kernel a loop
  over the tiles that holds one tile's bases (and their cotangents) at a time;
* within a chunk, the (C, C) scores (1/2 - Lambda) o (psi+ psi+^T) + (1/2 + Lambda) o
  (psi' psi'^T), Lambda = sigma sigma^T, times e^{s_j - c_t} (c_t the running maximum of s over
  the keys j <= t, the XLA form's per-key shift; every factor <= 1): products of (C, C), (C, 2m)
  and (C, n) matrices;
* across chunks, one state per sign channel l = 0..n and base: the key coefficients
  (1 for l = 0; -sigma_l for psi+ and +sigma_l for psi' otherwise) multiply the keys' [v, 1],
  and each query contracts the channels' reads with its coefficients (1/2, sigma_l). The states
  are rows of one ``(2 (n + 1) 2m, P)`` array (base, then channel, then feature), read and
  written a tile at a time through ref slices, relative to the chunk's key maximum (scalar
  references: ``reference_width`` 1).

The rows' outputs are in the XLA form's units, e^{-s(q_t) - c_t}, so that the signed maps'
denominator floor clips the same rows. The signs are piecewise constant: no gradient reaches T or
the rows through them. Every value an operation takes is a power-of-two block of at least 16 in
its product dimensions (Triton's rules: no concatenation or slicing of values)."""

from __future__ import annotations

import dataclasses
import math
import sys
import typing

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rfjax.attention._checks import log_floor
from rfjax.attention._fused_kernels import CHUNK, tile_width

FEATURE_TILE = 16  # features per tile (of the 2m of each base), or fewer (``_tile_width``)
_BASES = 2  # positive, trigonometric


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _tile_width(double: int) -> int:
    """The features per tile of a base's 2m (``tile_width``; Triton takes 2m in tiles of 16
    only)."""
    return tile_width(double, FEATURE_TILE)


@dataclasses.dataclass(frozen=True)
class AngularHybridSpec:
    """How the kernels read the angular hybrid: parameters W2 = [W; -W] ``(2m, H)`` and the sign
    projection T ``(n', H)`` (``signs`` = n rows, zeros to n' = the next power of two >= 16:
    sgn(0) = 0 adds nothing to sigma . sigma); states of width 2 (n + 1) 2m (bases, channels,
    features), one reference per key (``reference_width`` 1)."""

    signs: int

    @property
    def kernels(self) -> typing.Any:
        """The module of the kernels (this one)."""
        return sys.modules[__name__]

    def width(self, weights: jax.Array, aux: jax.Array) -> int:
        """The width of the states and summaries: 2 (n + 1) 2m."""
        del aux
        return _BASES * (self.signs + 1) * weights.shape[0]

    def reference_width(self, weights: jax.Array, aux: jax.Array) -> int:
        """The width of the key maxima (the references): one per key."""
        del weights, aux
        return 1

    def operand_dtype(self, matmul_dtype: jnp.dtype) -> jnp.dtype:
        """The products' operand dtype: float32 whatever the inputs' (the bases are signed and
        the scores' sums cancel, so a bfloat16 operand's rounding is amplified by a row's
        condition number; the XLA form computes the hybrid in float32 too)."""
        del matmul_dtype
        return jnp.dtype(jnp.float32)

    def padded_aux(self, aux: jax.Array, head_dim: int) -> jax.Array:
        """T ``(n, H)`` -> ``(n', H')``, zeros in the new rows and columns."""
        rows = max(16, _next_power_of_two(aux.shape[0]))
        return jnp.pad(aux, ((0, rows - aux.shape[0]), (0, head_dim - aux.shape[1])))

    def unpadded_aux(self, grad: jax.Array, aux: jax.Array) -> jax.Array:
        """dT (zeros: the signs are piecewise constant) in T's shape and dtype."""
        return grad[: aux.shape[0], : aux.shape[1]].astype(aux.dtype)


# ------------------------------------------------------------------------ in-kernel pieces


def _dot(a, b, matmul_dtype, *, transpose_a: bool = False, transpose_b: bool = False):
    """a b (a^T, b^T with the flags), operands in ``matmul_dtype``, accumulated in float32."""
    a = a.T if transpose_a else a
    b = b.T if transpose_b else b
    return jnp.dot(
        a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=jnp.float32
    )


def _iota(shape: tuple[int, ...], axis: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


class _Part:
    """A block of R rows' parts (``_scaled_bases``'s, in the XLA form's units): per row the
    log-scale s, e^{a - s} ``(R, 1)`` and sigma ``(R, n')``; a tile's z and bases psi+, psi'
    ``(R, FT)`` formed when asked (``tile_of``), from the tile's rows of W2, so that a kernel holds
    one tile's at a time. With ``valid``, rows left out get s at the log floor and zero parts."""

    def __init__(self, spec: AngularHybridSpec, rows, w_ref, t_ref, valid=None):
        self.rows = x = rows.astype(jnp.float32)
        self.w_ref = w_ref
        self.valid = valid
        double = w_ref.shape[0]  # 2m
        self.tile = _tile_width(double)
        self.tiles = double // self.tile
        self.base_width = double
        self.channels = spec.signs + 1
        squared = jnp.sum(x * x, axis=1, keepdims=True)
        positive_shift = -0.5 * squared - 0.5 * math.log(double)
        trigonometric = 0.5 * squared - 0.5 * math.log(double // 2)
        lowest = jnp.full(squared.shape, -jnp.inf, jnp.float32)
        largest = jax.lax.fori_loop(
            0,
            self.tiles,
            lambda i, top: jnp.maximum(top, self._projected(i).max(axis=1, keepdims=True)),
            lowest,
        )
        scale = jnp.maximum(largest + positive_shift, trigonometric)
        self.positive_shift = positive_shift - scale
        self.trigonometric_scale = self._kept(jnp.exp(trigonometric - scale))
        self.scale = (
            scale if valid is None else jnp.where(valid, scale, log_floor(jnp.dtype(jnp.float32)))
        )
        projected = jnp.dot(x, t_ref[...].astype(jnp.float32).T, preferred_element_type=jnp.float32)
        self.sigma = jnp.sign(projected) * (1.0 / math.sqrt(2.0 * spec.signs))

    def _kept(self, a: jax.Array) -> jax.Array:
        return a if self.valid is None else jnp.where(self.valid, a, 0)

    def first(self, i):
        """The first feature (row of W2) of tile i."""
        return i * self.tile if isinstance(i, int) else pl.multiple_of(i * self.tile, self.tile)

    def weights(self, i) -> jax.Array:
        """Tile i of W2's rows ``(FT, H)``."""
        return self.w_ref[pl.ds(self.first(i), self.tile), :].astype(jnp.float32)

    def _projected(self, i) -> jax.Array:
        return jnp.dot(self.rows, self.weights(i).T, preferred_element_type=jnp.float32)

    def _sine(self, i) -> jax.Array:
        """Tile i's features of the first half (sin z; the second half's are cos(-z) = cos z)."""
        columns = _iota((1, self.tile), 1) + self.first(i)
        return columns < self.base_width // 2

    def tile_of(self, i) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Tile i's z and bases (psi+, psi') ``(R, FT)``."""
        z = self._projected(i)
        positive = self._kept(jnp.exp(z + self.positive_shift))
        trigonometric = self.trigonometric_scale * jnp.where(self._sine(i), jnp.sin(z), jnp.cos(z))
        return z, (positive, trigonometric)

    def bases(self, i) -> tuple[jax.Array, jax.Array]:
        """Tile i's bases (psi+, psi') ``(R, FT)``."""
        return self.tile_of(i)[1]

    def sign(self, index) -> jax.Array:
        """sigma_l ``(R, 1)`` of channel l >= 1 (0 for l = 0)."""
        chosen = jnp.where(_iota(self.sigma.shape, 1) == index - 1, self.sigma, 0)
        return jnp.sum(chosen, axis=1, keepdims=True)

    def query_coefficient(self, index) -> jax.Array:
        """Channel l's query coefficient ``(R, 1)``: 1/2 (l = 0), sigma_l (both bases)."""
        return jnp.where(index == 0, 0.5, self.sign(index))

    def key_coefficients(self, index) -> tuple[jax.Array, jax.Array]:
        """Channel l's key coefficients ``(R, 1)`` per base: 1 (l = 0), -sigma_l (psi+),
        sigma_l (psi')."""
        sign = self.sign(index)
        return jnp.where(index == 0, 1.0, -sign), jnp.where(index == 0, 1.0, sign)

    def row(self, base: int, index, i):
        """The first state row of (base, channel l, tile i)."""
        return (base * self.channels + index) * self.base_width + self.first(i)

    def no_cotangents(self, grad_weights: jax.Array) -> _Pullback:
        """The start of a pullback of these rows' bases (``pulled_back``), adding to dW2's
        tiles ``grad_weights`` (``_grad_weights``)."""
        return _Pullback(jnp.zeros_like(self.rows), jnp.zeros_like(self.scale), grad_weights)

    def pulled_back(self, i, tile, grads, pullback: _Pullback) -> _Pullback:
        """``pullback`` plus tile i's share of that of sum(g+ psi+ + g' psi') (``tile`` its
        ``tile_of(i)``, ``grads`` the pair (g+, g') ``(R, FT)``), s a constant:
        dz = g+ psi+ + g' e^{a - s} h'(z) (h' = cos for sin, -sin for cos); the rows get
        dz W2_i and the total multiplying them sum(g' psi' - g+ psi+); dW2_i^T gets x^T dz."""
        z, (positive_base, trigonometric_base) = tile
        positive = grads[0] * positive_base
        derivative = jnp.where(self._sine(i), jnp.cos(z), -jnp.sin(z))
        grad_z = positive + grads[1] * self.trigonometric_scale * derivative
        total = jnp.sum(grads[1] * trigonometric_base - positive, axis=1, keepdims=True)
        share = jnp.dot(self.rows.T, grad_z, preferred_element_type=jnp.float32)[None]
        tiles = pullback.weights
        return _Pullback(
            pullback.rows + jnp.dot(grad_z, self.weights(i), preferred_element_type=jnp.float32),
            pullback.total + total,
            tiles + jnp.where(_iota(tiles.shape, 0) == i, share, 0),
        )

    def write(self, pullback: _Pullback, ref, index) -> None:
        """The rows' cotangents, d rows = sum_i dz_i W2_i + total x, into ``ref[index]``."""
        ref[index, :] = (pullback.rows + pullback.total * self.rows).astype(ref.dtype)


class _Pullback(typing.NamedTuple):
    """A pullback through ``_Part``'s bases in progress: the rows' cotangents ``(R, H)`` less
    the term ``total`` ``(R, 1)`` times the rows, and dW2's tiles transposed
    (``_grad_weights``)."""

    rows: jax.Array
    total: jax.Array
    weights: jax.Array


def _tiles(part: _Part, step, carry):
    """``step(i, carry)`` over the feature tiles i."""
    return jax.lax.fori_loop(0, part.tiles, step, carry)


def _channels(part: _Part, step, carry):
    """``step(l, carry)`` over the sign channels l = 0..n."""
    return jax.lax.fori_loop(0, part.channels, step, carry)


def _summaries(part, weights, coefficients, values, sum_ref, count_ref, matmul_dtype, counted):
    """Per channel l and base b, into the state rows: sum_r w_r c_l^b(r) psi^b_r values_r^T and
    sum_r u_r c_l^b(r) psi^b_r (``weights`` w and ``counted`` u ``(R, 1)``, ``coefficients(index)``
    the pair of ``(R, 1)`` per base), a feature tile at a time."""

    def tile_step(i, carry):
        bases = part.bases(i)

        def channel(index, carry):
            for base, (coefficient, f) in enumerate(zip(coefficients(index), bases, strict=True)):
                scaled = coefficient * f
                rows = pl.ds(part.row(base, index, i), part.tile)
                sum_ref[rows, :] = _dot(weights * scaled, values, matmul_dtype, transpose_a=True)
                count_ref[:, rows] = jnp.sum(counted * scaled, axis=0, keepdims=True)
            return carry

        return _channels(part, channel, carry)

    _tiles(part, tile_step, 0)


def _read(part: _Part, state, count, weights, matmul_dtype):
    """sum_l a_l(q) sum_b psi^b_q [S^b_l, z^b_l] times ``weights`` ``(R, 1)``: (num ``(R, P)``,
    den ``(R, 1)``); ``state(row)``, ``count(row)`` read a tile of the state."""

    def tile_step(i, sums):
        bases = part.bases(i)

        def channel(index, sums):
            num, den = sums
            coefficient = part.query_coefficient(index)
            for base, f in enumerate(bases):
                row = part.row(base, index, i)
                num = num + coefficient * _dot(f, state(row), matmul_dtype)
                den = den + coefficient * jnp.sum(f * count(row), axis=1, keepdims=True)
            return num, den

        return _channels(part, channel, sums)

    rows, value_width = part.rows.shape[0], state(0).shape[1]
    zeros = (jnp.zeros((rows, value_width), jnp.float32), jnp.zeros((rows, 1), jnp.float32))
    num, den = _tiles(part, tile_step, zeros)
    return weights * num, weights * den


def _read_cotangents(part: _Part, i, state, count, weights, grad, grad_den, grads, matmul_dtype):
    """``grads`` (per base, tile i) plus the cotangents of tile i's bases in ``_read``'s terms
    with cotangents (G ``(R, P)``, g ``(R, 1)``): w a_l (G S^b_l^T + g z^b_l)."""

    def channel(index, grads):
        coefficient = weights * part.query_coefficient(index)
        out = []
        for base, grad_base in enumerate(grads):
            row = part.row(base, index, i)
            read = _dot(grad, state(row), matmul_dtype, transpose_b=True) + grad_den * count(row)
            out.append(grad_base + coefficient * read)
        return tuple(out)

    return _channels(part, channel, grads)


def _later_cotangents(
    part: _Part, i, bases, later, later_count, weights, values, sums, matmul_dtype
):
    """The keys' cotangents from the later queries' summaries L^b_l ``(2m, P)``, ``(1, 2m)``
    (relative to the reference of ``weights`` = e^{s_j - c} ``(R, 1)``), tile i of them
    (``bases`` the keys' psi^b of the tile): ``sums`` = (the bases' cotangents, dv) plus
    (w_j c^b_l(k_j) (L^b_l v_j + l^b_l), w_j sum c^b_l L^b_l^T psi^b_j)."""

    def channel(index, sums):
        grads, grad_v = sums
        out = []
        for base, (coefficient, f) in enumerate(
            zip(part.key_coefficients(index), bases, strict=True)
        ):
            scale = weights * coefficient
            row = part.row(base, index, i)
            state = later(row)
            read = _dot(values, state, matmul_dtype, transpose_b=True) + later_count(row)
            out.append(grads[base] + scale * read)
            grad_v = grad_v + scale * _dot(f, state, matmul_dtype)
        return tuple(out), grad_v

    return _channels(part, channel, sums)


class _Pairs:
    """A chunk's within-chunk scores S_tj = (m+_tj P_tj + m'_tj R_tj) for j <= t: P, R the
    bases' Gram matrices (summed over the feature tiles), m+ = (1/2 - Lambda) E,
    m' = (1/2 + Lambda) E, E_tj = e^{s_j - c_t} for the keys that count (0 otherwise),
    c_t = max(c, max_{j <= t} s_j) from the chunk's start c."""

    def __init__(self, query: _Part, key: _Part, valid, start, matmul_dtype):
        size = query.rows.shape[0]
        key_scale = key.scale.T  # (1, C)
        self.attends = (_iota((size, size), 1) <= _iota((size, size), 0)) & (valid.T > 0)
        own = jnp.max(jnp.where(self.attends, key_scale, -jnp.inf), axis=1, keepdims=True)
        self.row_shift = jnp.maximum(own, start)  # c_t (C, 1)
        decay = jnp.where(self.attends, jnp.exp(key_scale - self.row_shift), 0)
        agreement = _dot(query.sigma, key.sigma, matmul_dtype, transpose_b=True)
        self.mixes = ((0.5 - agreement) * decay, (0.5 + agreement) * decay)

        def gram(i, grams):
            products = zip(query.bases(i), key.bases(i), strict=True)
            return tuple(
                g + _dot(a, b, matmul_dtype, transpose_b=True)
                for g, (a, b) in zip(grams, products, strict=True)
            )

        zeros = jnp.zeros((size, size), jnp.float32)
        grams = _tiles(query, gram, (zeros, zeros))
        self.scores = self.mixes[0] * grams[0] + self.mixes[1] * grams[1]

    def grad_grams(self, products: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The cotangents of the bases' Gram matrices, given those of the scores ``(C, C)``."""
        products = jnp.where(self.attends, products, 0)
        return products * self.mixes[0], products * self.mixes[1]


def _weight_tiles(dw_ref) -> tuple[int, int]:
    """dW2's ``(2m, H)`` feature tiles: (their number, their width)."""
    tile = _tile_width(dw_ref.shape[0])
    return dw_ref.shape[0] // tile, tile


def _grad_weights(dw_ref) -> jax.Array:
    """Zeros for dW2's tiles transposed, tile i's x^T dz_i at ``[i]`` of a
    ``(tiles', H, FT)`` value (tiles' the next power of two of the number of tiles: Triton
    cannot write into a value's columns, and a select along a leading axis costs less than
    ``_fused_kernels._placed``'s product)."""
    tiles, tile = _weight_tiles(dw_ref)
    return jnp.zeros((_next_power_of_two(tiles), dw_ref.shape[1], tile), jnp.float32)


def _store_weights(dw_ref, dt_ref, grad_weights) -> None:
    """dW2 from its tiles (``_grad_weights``); dT = 0 (the signs are piecewise constant)."""
    tiles, tile = _weight_tiles(dw_ref)
    chosen = _iota(grad_weights.shape, 0)
    for i in range(tiles):
        grad = jnp.sum(jnp.where(chosen == i, grad_weights, 0), axis=0)
        dw_ref[pl.ds(i * tile, tile), :] = grad.T
    dt_ref[...] = jnp.zeros(dt_ref.shape, dt_ref.dtype)


# -------------------------------------------------------------------------------- kernels


def key_summary_kernel(
    k_ref, v_ref, valid_ref, w_ref, t_ref, max_ref, sum_ref, count_ref, *, spec, matmul_dtype
):
    """A chunk's key maximum d = max_j s_j ``(1, 1)`` and its channels' sums
    sum_j e^{s_j - d} c^b_l(k_j) psi^b_j [v_j, 1]^T: ``(F, P)`` and ``(1, F)``."""
    valid = valid_ref[...] > 0
    key = _Part(spec, k_ref[...], w_ref, t_ref, valid)
    top = jnp.max(key.scale, axis=0, keepdims=True)
    weights = jnp.where(valid, jnp.exp(key.scale - top), 0)
    values = jnp.where(valid, v_ref[...].astype(jnp.float32), 0)
    max_ref[...] = top
    coefficients = key.key_coefficients
    _summaries(key, weights, coefficients, values, sum_ref, count_ref, matmul_dtype, weights)


def output_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    t_ref,
    start_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    shift_ref,
    *,
    spec,
    matmul_dtype,
):
    """One chunk's numerator ``(C, P)``, denominator ``(C, 1)`` and row shifts c_t
    ``(C, 1)``: the within-chunk scores (``_Pairs``) and the earlier keys' state (relative to
    the chunk's start c) read with e^{c - c_t}."""
    valid = valid_ref[...]
    query = _Part(spec, q_ref[...], w_ref, t_ref)
    key = _Part(spec, k_ref[...], w_ref, t_ref, valid > 0)
    values = jnp.where(valid > 0, v_ref[...].astype(jnp.float32), 0)
    start = start_ref[...]
    pairs = _Pairs(query, key, valid, start, matmul_dtype)
    num, den = _read(
        query,
        lambda row: state_ref[pl.ds(row, query.tile), :],
        lambda row: count_ref[:, pl.ds(row, query.tile)],
        jnp.exp(start - pairs.row_shift),
        matmul_dtype,
    )
    num_ref[...] = num + _dot(pairs.scores, values, matmul_dtype)
    den_ref[...] = den + jnp.sum(pairs.scores, axis=1, keepdims=True)
    shift_ref[...] = pairs.row_shift


def query_summary_kernel(
    q_ref,
    w_ref,
    t_ref,
    reference_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    sum_ref,
    count_ref,
    *,
    spec,
    matmul_dtype,
):
    """sum_t e^{r - c_t} a_l(q_t) psi^b_t [G_t, g_t]^T over a chunk's rows, per channel and
    base, for a reference r ``(1, 1)``: ``(F, P)`` and ``(1, F)``."""
    query = _Part(spec, q_ref[...], w_ref, t_ref)
    weights = jnp.exp(reference_ref[...] - shift_ref[...])
    grad = grad_ref[...].astype(jnp.float32)

    def coefficients(index):
        coefficient = query.query_coefficient(index)
        return coefficient, coefficient

    counted = weights * grad_den_ref[...]
    _summaries(query, weights, coefficients, grad, sum_ref, count_ref, matmul_dtype, counted)


def cotangent_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    t_ref,
    start_ref,
    end_ref,
    state_ref,
    count_ref,
    later_ref,
    later_count_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    dt_ref,
    *,
    spec,
    matmul_dtype,
):
    """The cotangents of a group of chunks (causal): rows (dq, dk ``(C, H)``, dv ``(C, P)`` per
    chunk) and dW2 summed over the group; dT = 0. Per chunk, a loop over the feature tiles for
    the queries (each tile's bases' cotangents from the pairs and the state, pulled back at
    once), then one for the keys (from the pairs and the later chunks' summary): a step holds
    one tile's (holding every tile's for the chunk spilled 26,468 bytes per thread on sm90)."""
    chunk, tile = CHUNK, _tile_width(w_ref.shape[0])

    def chunk_step(c, grad_weights):
        rows = pl.ds(c * chunk, chunk)
        valid = valid_ref[rows, :]
        query = _Part(spec, q_ref[rows, :], w_ref, t_ref)
        key = _Part(spec, k_ref[rows, :], w_ref, t_ref, valid > 0)
        values = jnp.where(valid > 0, v_ref[rows, :].astype(jnp.float32), 0)
        grad = grad_ref[rows, :].astype(jnp.float32)
        grad_den = grad_den_ref[rows, :].astype(jnp.float32)
        start, end = start_ref[c], end_ref[c]
        pairs = _Pairs(query, key, valid, start, matmul_dtype)
        # D_tj = G_t . [v_j, 1] (1 for the keys that count).
        products = _dot(grad, values, matmul_dtype, transpose_b=True) + grad_den * valid.T
        grad_grams = pairs.grad_grams(products)
        query_weights = jnp.exp(start - shift_ref[rows, :])

        def query_tile(i, pullback):
            bases = zip(grad_grams, key.bases(i), strict=True)
            grads = tuple(_dot(g, f, matmul_dtype) for g, f in bases)
            grads = _read_cotangents(
                query,
                i,
                lambda row: state_ref[c, pl.ds(row, tile), :],
                lambda row: count_ref[c, :, pl.ds(row, tile)],
                query_weights,
                grad,
                grad_den,
                grads,
                matmul_dtype,
            )
            return query.pulled_back(i, query.tile_of(i), grads, pullback)

        pullback = _tiles(query, query_tile, query.no_cotangents(grad_weights))
        query.write(pullback, dq_ref, rows)
        key_weights = jnp.where(valid > 0, jnp.exp(key.scale - end), 0)

        def key_tile(i, carry):
            pullback, grad_v = carry
            grads = tuple(
                _dot(g, f, matmul_dtype, transpose_a=True)
                for g, f in zip(grad_grams, query.bases(i), strict=True)
            )
            own = key.tile_of(i)
            grads, grad_v = _later_cotangents(
                key,
                i,
                own[1],
                lambda row: later_ref[c, pl.ds(row, tile), :],
                lambda row: later_count_ref[c, :, pl.ds(row, tile)],
                key_weights,
                values,
                (grads, grad_v),
                matmul_dtype,
            )
            grads = [jnp.where(valid > 0, g, 0) for g in grads]
            return key.pulled_back(i, own, grads, pullback), grad_v

        grad_v = _dot(pairs.scores, grad, matmul_dtype, transpose_a=True)
        pullback, grad_v = _tiles(key, key_tile, (key.no_cotangents(pullback.weights), grad_v))
        dv_ref[rows, :] = jnp.where(valid > 0, grad_v, 0).astype(dv_ref.dtype)
        key.write(pullback, dk_ref, rows)
        return pullback.weights

    chunks = q_ref.shape[0] // chunk
    grad_weights = jax.lax.fori_loop(0, chunks, chunk_step, _grad_weights(dw_ref))
    _store_weights(dw_ref, dt_ref, grad_weights)


def readout_kernel(
    q_ref,
    w_ref,
    t_ref,
    shift_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    row_shift_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional read-out of a chunk of queries against the keys' state relative to their
    maximum c ``(1, 1)``: numerator, denominator and the row shifts (c for every row)."""
    query = _Part(spec, q_ref[...], w_ref, t_ref)
    shift = shift_ref[...]
    ones = jnp.ones_like(query.scale)
    num_ref[...], den_ref[...] = _read(
        query,
        lambda row: state_ref[pl.ds(row, query.tile), :],
        lambda row: count_ref[:, pl.ds(row, query.tile)],
        ones,
        matmul_dtype,
    )
    row_shift_ref[...] = ones * shift


def query_cotangent_kernel(
    q_ref,
    w_ref,
    t_ref,
    shift_ref,
    state_ref,
    count_ref,
    row_shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dw_ref,
    dt_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional queries' cotangents over a group of chunks: ``_read``'s terms pulled back
    to dq a feature tile at a time, and dW2 summed over the group; dT = 0."""
    del shift_ref, row_shift_ref  # every row reads the state in its own units
    tile = _tile_width(w_ref.shape[0])

    def chunk_step(c, grad_weights):
        rows = pl.ds(c * CHUNK, CHUNK)
        query = _Part(spec, q_ref[rows, :], w_ref, t_ref)
        grad = grad_ref[rows, :].astype(jnp.float32)
        grad_den = grad_den_ref[rows, :].astype(jnp.float32)
        ones = jnp.ones_like(query.scale)

        def query_tile(i, pullback):
            zeros = jnp.zeros((CHUNK, tile), jnp.float32)
            grads = _read_cotangents(
                query,
                i,
                lambda row: state_ref[pl.ds(row, tile), :],
                lambda row: count_ref[:, pl.ds(row, tile)],
                ones,
                grad,
                grad_den,
                (zeros, zeros),
                matmul_dtype,
            )
            return query.pulled_back(i, query.tile_of(i), grads, pullback)

        pullback = _tiles(query, query_tile, query.no_cotangents(grad_weights))
        query.write(pullback, dq_ref, rows)
        return pullback.weights

    chunks = q_ref.shape[0] // CHUNK
    grad_weights = jax.lax.fori_loop(0, chunks, chunk_step, _grad_weights(dw_ref))
    _store_weights(dw_ref, dt_ref, grad_weights)


def key_cotangent_kernel(
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    t_ref,
    shift_ref,
    grad_state_ref,
    grad_count_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    dt_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional keys' cotangents over a group of chunks from the state's (dS, dz), relative
    to the keys' maximum c: ``_later_cotangents`` with e^{s_j - c}, pulled back to dk a feature
    tile at a time; dv; dW2 summed over the group; dT = 0."""
    tile = _tile_width(w_ref.shape[0])
    shift = shift_ref[...]

    def chunk_step(c, grad_weights):
        rows = pl.ds(c * CHUNK, CHUNK)
        valid = valid_ref[rows, :] > 0
        key = _Part(spec, k_ref[rows, :], w_ref, t_ref, valid)
        values = jnp.where(valid, v_ref[rows, :].astype(jnp.float32), 0)
        weights = jnp.where(valid, jnp.exp(key.scale - shift), 0)

        def key_tile(i, carry):
            pullback, grad_v = carry
            zeros = jnp.zeros((CHUNK, tile), jnp.float32)
            own = key.tile_of(i)
            grads, grad_v = _later_cotangents(
                key,
                i,
                own[1],
                lambda row: grad_state_ref[pl.ds(row, tile), :],
                lambda row: grad_count_ref[:, pl.ds(row, tile)],
                weights,
                values,
                ((zeros, zeros), grad_v),
                matmul_dtype,
            )
            grads = [jnp.where(valid, g, 0) for g in grads]
            return key.pulled_back(i, own, grads, pullback), grad_v

        start = (key.no_cotangents(grad_weights), jnp.zeros_like(values))
        pullback, grad_v = _tiles(key, key_tile, start)
        dv_ref[rows, :] = jnp.where(valid, grad_v, 0).astype(dv_ref.dtype)
        key.write(pullback, dk_ref, rows)
        return pullback.weights

    chunks = k_ref.shape[0] // CHUNK
    grad_weights = jax.lax.fori_loop(0, chunks, chunk_step, _grad_weights(dw_ref))
    _store_weights(dw_ref, dt_ref, grad_weights)
