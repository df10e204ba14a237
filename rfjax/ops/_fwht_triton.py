"""The Pallas GPU kernel on the Triton backend (``implementation="pallas_triton"``), sm80+.

Design: the transform as matrix products with Sylvester-Hadamard factors, run on the tensor
cores through ``jnp.dot`` (which Pallas lowers to ``tt.dot``), rather than log2(n) butterfly
stages in registers (the Triton backend cannot slice or shuffle register tensors along a
non-leading axis cheaply). H_n's entries are generated inside the kernel from iotas,
H[i, j] = (-1)^popcount(i & j), with shifts, xors and ands only; nothing but the operand is read
from memory. The operand is viewed as ``rows`` vectors of length n = 2^k (a free reshape) and
two regimes are used:

* n <= ``DENSE_MAX`` (128): each program loads a ``(block_rows, n)`` tile and computes
  ``tile @ H_n`` (one dot, O(n) work per entry, but n <= 128 keeps the kernel near memory
  bound). ``tt.dot`` needs every dimension >= 16, so lengths n < 16 are zero-padded to 16 outside
  the kernel and the first n outputs kept (H_16's top-left n x n block is H_n).
* ``DENSE_MAX`` < n <= 8192: H_n = H_a (x) H_b with n = a b, a = 2^floor(k/2),
  b = 2^ceil(k/2) (16 <= a <= b <= 128). A vector reshaped row-major to the a x b matrix X is
  transformed to H_a X H_b, two 2-D dots of O(a + b) work per entry. The operand is viewed as
  ``(rows, a, b)``; each program owns ``block_rows`` vectors, builds H_a and H_b once and loops
  over its vectors (``lax.fori_loop``, one (a, b) tile loaded and stored per step).

Grid: one axis over blocks of rows; the rows are padded with zeros to a whole number of blocks
(``_pad_rows``) and the padding dropped from the result, so no block is partial.

Precision: float32 dots run with ``Precision.HIGHEST`` (Triton's IEEE mode, not TF32), float64
dots in float64. Half inputs (float16, bfloat16) enter the first dot in their own dtype with
float32 accumulation (products with +-1 are exact). The kron regime's second dot then takes the
float32 intermediate as three bfloat16 parts whose sum is exact (``bfloat16_parts``) on the
tensor cores, whose float32 accumulation is not round-to-nearest: ample for a result rounded
once to a half type, not used for float32 results. The accumulation order differs from the
butterfly's (sums of up to max(n, b) terms instead of log2 n pairwise stages), so float32
results agree with ``xla_butterfly`` to rounding, not bitwise.

Limits: power-of-two n <= 8192, float16, bfloat16, float32 and float64 (Triton's float64 dot
is slow, and n < 16 pays a 16/n padding); the backend's entry in ``rfjax.ops._fwht_backends``
checks them before the kernel is called.

Status: JAX deprecated the Pallas Triton backend (0.11: "The Pallas Triton backend is deprecated
and will be removed in a future JAX version"; JAX's own warning is emitted when this kernel is
lowered, and rfjax does not filter it). Mosaic GPU, the supported Pallas GPU backend, needs sm90
(Hopper) or newer, so this kernel is kept for sm80-sm89 (Ampere, Ada), where
``implementation="pallas_triton"`` asks for it, and for bfloat16 on sm90+, where it measured
fastest at n = 64 ... 4096 and ``"auto"`` picks it (``GPU_AUTO_SM90``). Measurements and defects
seen on a GPU are in ``benchmarks/gpu_runs/``. A known slow case, not fixed: in float32 the
lengths that use a 128 x 128 factor at ``Precision.HIGHEST`` (n = 128, dense, and n = 8192,
64 x 128) took 53-86x a device copy on an H200 (4.4-5.1 ms for 2^24 entries, where the other
lengths took 2.1-4.5x; ``2026-11-26-h200``, ``2026-11-30-h200``); ``"auto"`` picks Mosaic GPU
there on sm90+.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from rfjax._tensor_cores import bfloat16_parts

DENSE_MAX = 128
MIN_DOT = 16  # tt.dot needs M, N, K >= 16
_TILE_ELEMENTS = 16384  # operand entries per program (block_rows * n)
_HALF_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _hadamard(n: int, dtype) -> jax.Array:
    """H_n built from iotas inside a kernel: (-1)^parity(i & j), bit operations only."""
    i = lax.broadcasted_iota(jnp.int32, (n, n), 0)
    j = lax.broadcasted_iota(jnp.int32, (n, n), 1)
    p = i & j
    bits, s = max(1, (n - 1).bit_length()), 1
    while s < bits:  # s: a power of two >= the number of index bits
        s *= 2
    while s > 1:  # fold the parity of the low 2s bits into bit 0
        s //= 2
        p = p ^ lax.shift_right_logical(p, jnp.int32(s))
    sign = (1 - 2 * (p & 1)).astype(jnp.float32)  # int -> float32 -> dtype: exact
    return sign.astype(dtype)


def _signed_dot(x, h, *, left: bool, acc_dtype, split: bool):
    """``h @ x`` (``left``) or ``x @ h`` for a +-1 matrix ``h`` (float32), in ``acc_dtype``.

    With ``split`` the float32 ``x`` enters as its three exact bfloat16 parts (tensor-core dots,
    whose float32 accumulation does not round to nearest: used only where the result is
    rounded to a half type). Otherwise ``x`` enters in its own dtype: products with +-1 are
    exact, and float32/float64 dots run in IEEE arithmetic (``Precision.HIGHEST``; not TF32).
    """
    parts = bfloat16_parts(x) if split else [x]
    total = None
    for part in parts:
        factor = h.astype(part.dtype)
        y = jnp.dot(
            *((factor, part) if left else (part, factor)),
            precision=lax.Precision.HIGHEST,
            preferred_element_type=acc_dtype,
        )
        total = y if total is None else total + y
    return total


def _dense_kernel(x_ref, o_ref, *, n, acc_dtype, scale):
    y = _signed_dot(
        x_ref[...], _hadamard(n, jnp.float32), left=False, acc_dtype=acc_dtype, split=False
    )
    if scale != 1.0:
        y = y * jnp.asarray(scale, acc_dtype)
    o_ref[...] = y.astype(o_ref.dtype)


def _kron_kernel(x_ref, o_ref, *, a, b, block_rows, acc_dtype, scale):
    h_b = _hadamard(b, jnp.float32)
    h_a = _hadamard(a, jnp.float32)
    split = x_ref.dtype in _HALF_DTYPES  # the second dot's operand is float32

    def transform(x):  # x: (a, b), one vector in row-major order
        y = _signed_dot(x, h_b, left=False, acc_dtype=acc_dtype, split=False)  # X H_b
        y = _signed_dot(y, h_a, left=True, acc_dtype=acc_dtype, split=split)  # H_a X H_b
        if scale != 1.0:
            y = y * jnp.asarray(scale, acc_dtype)
        return y.astype(o_ref.dtype)

    if block_rows is None:  # the block is one vector (leading block dimension squeezed)
        o_ref[...] = transform(x_ref[...])
        return

    def body(r, carry):
        o_ref[r] = transform(x_ref[r])
        return carry

    lax.fori_loop(0, block_rows, body, 0)


def _compiler_params(n: int, interpret: bool):
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu

    return plgpu.CompilerParams(num_warps=4 if n <= 1024 else 8, num_stages=1)


def _block_rows(rows: int, n: int, minimum: int) -> int:
    target = max(minimum, _TILE_ELEMENTS // n)
    return max(minimum, min(target, int(pl.next_power_of_2(rows))))


def fwht_rows(x: jax.Array, normalize: bool) -> jax.Array:
    """The transform of the last axis of ``x`` (any leading shape), compiled for a GPU."""
    return _transform(x, normalize, interpret=False)


def fwht_rows_interpret(x: jax.Array, normalize: bool) -> jax.Array:
    """The same kernel in Pallas' interpret mode (any backend; for tests)."""
    return _transform(x, normalize, interpret=True)


def _transform(x: jax.Array, normalize: bool, *, interpret: bool) -> jax.Array:
    n = int(x.shape[-1])
    if x.size == 0:
        return x
    rows = x.size // n
    mat = jax.typeof(x).manual_axis_type  # the shard_map axes the operand varies over
    return _pallas_rows(x.reshape(rows, n), normalize, interpret, mat).reshape(x.shape)


def _pallas_rows(x2, normalize, interpret, mat):
    rows, n = x2.shape
    dtype = jnp.dtype(x2.dtype)
    acc_dtype = jnp.dtype(jnp.float32) if dtype in _HALF_DTYPES else dtype
    scale = float(1.0 / np.sqrt(n)) if normalize else 1.0
    # Under shard_map the output varies over the same mesh axes as the operand.
    out_type = functools.partial(jax.ShapeDtypeStruct, dtype=dtype, manual_axis_type=mat)
    # One name per distinct kernel. On the H100 (2026-11-22) the plain and the normalised
    # transform in one program gave one result for both; that case had 5 rows in a block of 16,
    # the defect _pad_rows removes (seen again on an H200 with distinct names).
    name = f"rfjax_fwht_{rows}x{n}_{dtype.name}_{'normalized' if normalize else 'plain'}"
    call = functools.partial(
        pl.pallas_call,
        compiler_params=_compiler_params(n, interpret),
        interpret=interpret,
        name=name,
    )

    if n <= DENSE_MAX:
        width = max(n, MIN_DOT)
        if width != n:  # H_width[:n, :n] == H_n
            x2 = jnp.pad(x2, ((0, 0), (0, width - n)))
        block_rows = _block_rows(rows, width, MIN_DOT)
        kernel = functools.partial(_dense_kernel, n=width, acc_dtype=acc_dtype, scale=scale)
        spec = pl.BlockSpec((block_rows, width), lambda i: (i, 0))
        padded = _pad_rows(x2, block_rows)
        y = call(
            kernel,
            out_shape=out_type(padded.shape),
            grid=(padded.shape[0] // block_rows,),
            in_specs=[spec],
            out_specs=spec,
        )(padded)
        return y[:rows, :n]

    k = n.bit_length() - 1
    a, b = 1 << (k // 2), 1 << (k - k // 2)
    block_rows = _block_rows(rows, n, 1)
    squeeze = block_rows == 1  # one vector per program: no loop, leading block axis squeezed
    kernel = functools.partial(
        _kron_kernel,
        a=a,
        b=b,
        block_rows=None if squeeze else block_rows,
        acc_dtype=acc_dtype,
        scale=scale,
    )
    spec = pl.BlockSpec((None if squeeze else block_rows, a, b), lambda i: (i, 0, 0))
    padded = _pad_rows(x2, block_rows)
    y = call(
        kernel,
        out_shape=out_type((padded.shape[0], a, b)),
        grid=(padded.shape[0] // block_rows,),
        in_specs=[spec],
        out_specs=spec,
    )(padded.reshape(-1, a, b))
    return y.reshape(-1, n)[:rows]


def _pad_rows(x2: jax.Array, block_rows: int) -> jax.Array:
    """``x2`` with zero rows appended up to a whole number of blocks (no copy if it has one).

    On an H200 (``benchmarks/gpu_runs/2026-11-26-h200``) every failing case had a block taller
    than the whole array (1, 2 or 5 rows in a block of 16 rows), and a wrong result appeared in
    another output of the same program (the plain or the normalised transform of the same
    input), as stores past the array would give; partial last blocks of taller arrays were
    right. Whole blocks leave nothing to mask.
    """
    extra = -x2.shape[0] % block_rows
    return jnp.pad(x2, ((0, extra), (0, 0))) if extra else x2
