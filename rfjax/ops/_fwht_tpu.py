"""Pallas TPU (Mosaic TPU) kernels: ``fwht`` and the fused structured-coupling chain.

Both work on tiles of ``block_rows`` whole vectors of length n (a power of two) in VMEM, so that
every vector stays on one core and a NaN in one vector never reaches another:

* n <= ``DENSE_MAX`` (512): a (rows, n) tile times H_n, one MXU matmul (H_n is an operand, read
  once per core);
* n = 128 a >= 1024: each vector viewed as an a x 128 matrix X (a free reshape in HBM, tiles
  (rows, a, 128) with a >= 8 sublanes), transformed to H_a X H_128 (H_n = H_a (x) H_128): one
  matmul of the (rows a, 128) tile by H_128, then one batched matmul by H_a.

Precision: float32 matmuls at ``Precision.HIGHEST`` (full float32 products and sums, no
single-pass bfloat16), bfloat16 operands straight into the MXU with float32 accumulation (products
with +-1 are exact), float16 converted to float32 in VMEM; everything after the first matmul is
float32, rounded once to the output dtype. float64 is not supported (TPUs have no float64).
Lengths up to 2^14 (the limits are the backend's entry in ``rfjax.ops._fwht_backends``, which
checks them before the kernel is called).

The chain (``chain_rows``) is y_b = N_b S (H D_{b,k}) ... (H D_{b,1}) x for each block b of a
``HadamardProjection`` (H normalised, S the optional simplex map, N_b the row norms): one read of
the input tile and one write of each output tile, every stage in VMEM.

Every kernel also runs in Pallas' TPU interpret mode (``pltpu.InterpretParams``) on CPU, which
simulates VMEM, the grid and partial blocks; that is how they are tested here. Whether Mosaic
compiles them for a given TPU generation, and how fast, has not been measured.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from rfjax.ops._fwht_xla import hadamard_matrix

LANES = 128
DENSE_MAX = 512
_TILE_ELEMENTS = 1 << 16  # entries per tile (block_rows * n): 256 KiB of float32


def _factor_dtype(dtype) -> jnp.dtype:
    """The dtype of H in the first matmul: bfloat16 stays bfloat16 on the MXU, else float32."""
    return jnp.dtype(jnp.bfloat16) if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(jnp.float32)


def _matmul(y: jax.Array, h: jax.Array) -> jax.Array:
    """y @ h with float32 results; float32 operands at full float32 precision."""
    if y.dtype == jnp.float16:
        y = y.astype(jnp.float32)
    if y.dtype != h.dtype:  # a float32 intermediate meets a bfloat16 H: exact to widen H
        h = h.astype(jnp.float32)
    return jnp.dot(y, h, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _transform_tile(y: jax.Array, h: jax.Array, h_a: jax.Array | None) -> jax.Array:
    """H_n applied to each vector of the tile ``y`` (unnormalised), float32 result.

    ``y`` is (rows, n) with ``h`` = H_n, or (rows, a, 128) with ``h`` = H_128 and ``h_a`` = H_a.
    """
    if h_a is None:
        return _matmul(y, h)
    rows, a, lanes = y.shape
    z = _matmul(y.reshape(rows * a, lanes), h).reshape(rows, a, lanes)  # X H_128
    left = jnp.broadcast_to(h_a.astype(jnp.float32), (rows, a, a))
    return jnp.einsum(  # H_a (X H_128), one (a, a) @ (a, 128) product per vector
        "rij,rjc->ric",
        left,
        z,
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _tiling(n: int) -> tuple[int, ...]:
    """The shape of one vector in a tile: (n,) up to DENSE_MAX, else (n / 128, 128)."""
    return (n,) if n <= DENSE_MAX else (n // LANES, LANES)


def _factors(n: int, dtype) -> list[jax.Array]:
    """The Hadamard operands of the kernels: [H_n] or [H_128, H_{n/128}]."""
    sizes = [n] if n <= DENSE_MAX else [LANES, n // LANES]
    return [jnp.asarray(hadamard_matrix(m), _factor_dtype(dtype)) for m in sizes]


def _whole(array: jax.Array) -> pl.BlockSpec:
    """A block that is the whole (small, constant) array on every grid step."""
    zeros = (0,) * array.ndim
    return pl.BlockSpec(array.shape, lambda *_: zeros)


def _block_rows(rows: int, n: int) -> int:
    """Vectors per tile: the whole array when it is small, else a multiple of 8 (sublanes)."""
    target = max(8, _TILE_ELEMENTS // n)
    return rows if rows <= target else target


def _fwht_kernel(x_ref, *refs, scale):
    *h_refs, o_ref = refs
    h, h_a = (h_refs[0][...], None) if len(h_refs) == 1 else (h_refs[0][...], h_refs[1][...])
    y = _transform_tile(x_ref[...], h, h_a)
    if scale != 1.0:
        y = y * scale
    o_ref[...] = y.astype(o_ref.dtype)


def _interpret_params():
    return pltpu.InterpretParams(out_of_bounds_reads="uninitialized", uninitialized_memory="nan")


def _fwht(x: jax.Array, normalize: bool, *, interpret: bool) -> jax.Array:
    n = x.shape[-1]
    if x.size == 0:
        return x
    rows = x.size // n
    block_rows = _block_rows(rows, n)
    vector = _tiling(n)
    factors = _factors(n, x.dtype)
    kernel = functools.partial(_fwht_kernel, scale=1.0 / math.sqrt(n) if normalize else 1.0)
    zeros = (0,) * len(vector)
    tile = pl.BlockSpec((block_rows, *vector), lambda i: (i, *zeros))
    y = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, *vector), x.dtype),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=[tile, *(_whole(h) for h in factors)],
        out_specs=tile,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=_interpret_params() if interpret else False,
        name="rfjax_fwht_tpu",
    )(x.reshape(rows, *vector), *factors)
    return y.reshape(x.shape)


def fwht_rows(x: jax.Array, normalize: bool) -> jax.Array:
    """H_n x (optionally / sqrt(n)) along the last axis of ``x``, compiled for a TPU."""
    return _fwht(x, normalize, interpret=False)


def fwht_rows_interpret(x: jax.Array, normalize: bool) -> jax.Array:
    """The same kernel in Pallas' TPU interpret mode (on CPU; for tests)."""
    return _fwht(x, normalize, interpret=True)


# ---------------------------------------------------------------------------------------------
# The fused chain y_b = N_b S (H D_{b,k}) ... (H D_{b,1}) x
# ---------------------------------------------------------------------------------------------


def simplex_rows(z: jax.Array, p: int) -> jax.Array:
    """S z for each vector of a tile (its last ``z.ndim - 1`` axes hold the p entries in order).

    (Sz)_i = sqrt(p/(p-1)) z_i - (sqrt(p)+1)/(p-1)^{3/2} sigma for i < p - 1 and
    (Sz)_{p-1} = sigma / sqrt(p-1), with sigma = sum_{j<p-1} z_j (SimRF App. B.2.1; the map of
    ``rfjax.ops.apply_simplex``, written with a mask instead of slices).
    """
    vector_axes = tuple(range(1, z.ndim))
    flat = jnp.zeros(z.shape, jnp.int32)
    stride = 1
    for axis in reversed(vector_axes):
        flat = flat + stride * lax.broadcasted_iota(jnp.int32, z.shape, axis)
        stride *= z.shape[axis]
    head = flat < p - 1
    sigma = jnp.sum(jnp.where(head, z, 0.0), axis=vector_axes, keepdims=True)
    scaled = math.sqrt(p / (p - 1)) * z - (math.sqrt(p) + 1) / (p - 1) ** 1.5 * sigma
    return jnp.where(head, scaled, sigma * (1.0 / math.sqrt(p - 1)))


def _chain_kernel(x_ref, signs_ref, norms_ref, *refs, p, simplex):
    *h_refs, o_ref = refs
    h, h_a = (h_refs[0][...], None) if len(h_refs) == 1 else (h_refs[0][...], h_refs[1][...])
    y = x_ref[...]
    for stage in range(signs_ref.shape[0]):
        y = y * signs_ref[stage].astype(y.dtype)  # +-1: exact in every dtype
        y = _transform_tile(y, h, h_a) * (1.0 / math.sqrt(p))
    if simplex:
        y = simplex_rows(y, p)
    o_ref[...] = (y * norms_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _chain(x, signs, norms, simplex: bool, *, interpret: bool) -> jax.Array:
    p = x.shape[-1]
    num_blocks, num_stages, _ = signs.shape
    rows = x.size // p
    if rows == 0:
        return jnp.zeros((*x.shape[:-1], num_blocks, p), x.dtype)
    block_rows = _block_rows(rows, p)
    vector = _tiling(p)
    zeros = (0,) * len(vector)
    factors = _factors(p, x.dtype)
    in_specs = [
        pl.BlockSpec((block_rows, *vector), lambda i, b: (i, *zeros)),
        pl.BlockSpec((None, num_stages, *vector), lambda i, b: (b, 0, *zeros)),
        pl.BlockSpec((None, 1, *vector), lambda i, b: (b, 0, *zeros)),
        *(_whole(h) for h in factors),
    ]
    # Output: block b of vector r goes to [r, b, :] of a (rows, B, p) array. TPU tiles need a last
    # dimension of 128 lanes (or the whole axis) and a second-last one of 8 sublanes (or the
    # whole axis), so the array is written as (rows, B p) for p = 128 ... 512, as
    # (rows, B a, 128) for p = 128 a >= 1024, and as (B, rows, p) below 128 (transposed after).
    if p < LANES:
        out_shape: tuple[int, ...] = (num_blocks, rows, p)
        out_spec = pl.BlockSpec((None, block_rows, p), lambda i, b: (b, i, 0))
    elif len(vector) == 1:
        out_shape = (rows, num_blocks * p)
        out_spec = pl.BlockSpec((block_rows, p), lambda i, b: (i, b))
    else:
        out_shape = (rows, num_blocks * vector[0], LANES)
        out_spec = pl.BlockSpec((block_rows, *vector), lambda i, b: (i, b, 0))
    y = pl.pallas_call(
        functools.partial(_chain_kernel, p=p, simplex=simplex),
        out_shape=jax.ShapeDtypeStruct(out_shape, x.dtype),
        grid=(pl.cdiv(rows, block_rows), num_blocks),
        in_specs=in_specs,
        out_specs=out_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=_interpret_params() if interpret else False,
        name="rfjax_hd_chain_tpu",
    )(
        x.reshape(rows, *vector),
        signs.reshape(num_blocks, num_stages, *vector),
        norms.reshape(num_blocks, 1, *vector),
        *factors,
    )
    if p < LANES:
        y = jnp.moveaxis(y, 0, 1)
    return y.reshape(*x.shape[:-1], num_blocks, p)


def chain_rows(x, signs, norms, simplex: bool) -> jax.Array:
    """``(..., p) -> (..., B, p)``: the structured-coupling chain of each block, for a TPU."""
    return _chain(x, signs, norms, simplex, interpret=False)


def chain_rows_interpret(x, signs, norms, simplex: bool) -> jax.Array:
    """The same kernel in Pallas' TPU interpret mode (on CPU; for tests)."""
    return _chain(x, signs, norms, simplex, interpret=True)
