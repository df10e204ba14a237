"""The Pallas GPU (Triton) kernel behind ``fwht``.

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
* ``DENSE_MAX`` < n <= ``MAX_N`` (8192): H_n = H_a (x) H_b with n = a b, a = 2^floor(k/2),
  b = 2^ceil(k/2) (16 <= a <= b <= 128). A vector reshaped row-major to the a x b matrix X is
  transformed to H_a X H_b, two 2-D dots of O(a + b) work per entry. The operand is viewed as
  ``(rows, a, b)``; each program owns ``block_rows`` vectors, builds H_a and H_b once and loops
  over its vectors (``lax.fori_loop``, one (a, b) tile loaded and stored per step).

Grid: one axis over blocks of rows; a last, partial block is handled by the masked loads and
stores Pallas emits for blocks that do not divide the array (rows are independent, so the
undefined padding rows never reach a stored entry).

Precision: float32 dots run with ``Precision.HIGHEST`` (Triton's IEEE mode, not TF32), float64
dots in float64. Half inputs (float16, bfloat16) enter the first dot in their own dtype with
float32 accumulation (products with +-1 are exact, so this is the float32 computation), the
second dot and the 1/sqrt(n) scaling run in float32, and the result is rounded once. The
accumulation order differs from the butterfly's (sums of up to max(n, b) terms instead of log2 n
pairwise stages), so float32 results agree with ``xla_butterfly`` to rounding, not bitwise.

Limits (``supports``): float16, bfloat16, float32 and 16 <= n <= 8192; float64 and shorter
lengths run when asked for explicitly (``implementation="pallas"``/``"pallas_interpret"``)
but ``"auto"`` leaves them to the XLA butterfly (Triton's float64 dot is slow, and n < 16 would
pay a 16/n padding). Verified only in interpret mode (no GPU was available when it was written):
the kernel uses only primitives the Triton lowering implements (iota, integer bit operations,
2-D ``dot_general`` with dimensions >= 16, ``fori_loop``, dynamic first-axis ref indexing),
but compilation, register pressure at n = 8192 (the (64, 128) tile plus a 128 x 128 H_b) and
speed were not checked on a device.

Under ``shard_map`` the output is typed as varying over the operand's manual axes. Interpret mode
there evaluates the kernel (traced without those types) on varying operands and would reject
its in-kernel constants, so it runs with ``shard_map``'s varying-axes check switched off (a
private JAX config, ``jax._src.config._check_vma``); rows are independent, so nothing is lost.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

DENSE_MAX = 128
MAX_N = 8192
MIN_DOT = 16  # tt.dot needs M, N, K >= 16
_TILE_ELEMENTS = 16384  # operand entries per program (block_rows * n)
_KERNEL_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
_HALF_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_ALL_DTYPES = (*_KERNEL_DTYPES, jnp.dtype(jnp.float64))


def supports(shape, dtype) -> bool:
    """Whether ``implementation="auto"`` sends a transform of the last axis of ``shape`` here."""
    if len(shape) == 0 or jnp.dtype(dtype) not in _KERNEL_DTYPES:
        return False
    n = int(shape[-1])
    return MIN_DOT <= n <= MAX_N and (n & (n - 1)) == 0


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


def _dot(a, b, acc_dtype):
    # HIGHEST: IEEE float32 on Triton (not TF32); for half operands the accumulation dtype.
    return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=acc_dtype)


def _dense_kernel(x_ref, o_ref, *, n, acc_dtype, scale):
    x = x_ref[...]
    y = _dot(x, _hadamard(n, x.dtype), acc_dtype)
    if scale != 1.0:
        y = y * jnp.asarray(scale, acc_dtype)
    o_ref[...] = y.astype(o_ref.dtype)


def _kron_kernel(x_ref, o_ref, *, a, b, block_rows, acc_dtype, scale):
    h_b = _hadamard(b, x_ref.dtype)  # first dot in the input dtype (exact products)
    h_a = _hadamard(a, acc_dtype)  # second dot on the accumulated values

    def transform(x):  # x: (a, b), one vector in row-major order
        y = _dot(x, h_b, acc_dtype)  # X H_b
        y = _dot(h_a, y, acc_dtype)  # H_a X H_b
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


def fwht_rows(x: jax.Array, normalize: bool, *, interpret: bool) -> jax.Array:
    """The transform of the last axis of ``x`` (any leading shape) by the Pallas kernel."""
    dtype = jnp.dtype(x.dtype)
    n = int(x.shape[-1])
    if dtype not in _ALL_DTYPES:
        raise TypeError(f"the Pallas fwht kernel does not handle dtype {dtype}")
    if n > MAX_N or (n & (n - 1)) != 0:
        raise ValueError(
            f"the Pallas fwht kernel handles power-of-two lengths up to {MAX_N}, got {n}; use "
            "implementation='auto' or 'xla'"
        )
    if x.size == 0:
        return x
    rows = x.size // n
    mat = jax.typeof(x).manual_axis_type  # the shard_map axes the operand varies over
    if interpret and not mat.empty:
        # Interpret mode evaluates the kernel (traced without shard_map types) on operands that
        # vary over manual axes, and then rejects its in-kernel constants (H, the loop carry)
        # as non-varying. Rows are independent, so the check is vacuous here: switch it off.
        from jax._src import config

        with config._check_vma(False):
            y = _pallas_rows(x.reshape(rows, n), normalize, interpret, None)
    else:
        y = _pallas_rows(x.reshape(rows, n), normalize, interpret, mat)
    return y.reshape(x.shape)


def _pallas_rows(x2, normalize, interpret, mat):
    rows, n = x2.shape
    dtype = jnp.dtype(x2.dtype)
    acc_dtype = jnp.dtype(jnp.float32) if dtype in _HALF_DTYPES else dtype
    scale = float(1.0 / np.sqrt(n)) if normalize else 1.0
    # Under shard_map the output varies over the same mesh axes as the operand.
    out_type = functools.partial(jax.ShapeDtypeStruct, dtype=dtype, manual_axis_type=mat)
    call = functools.partial(
        pl.pallas_call,
        compiler_params=_compiler_params(n, interpret),
        interpret=interpret,
        name="rfjax_fwht",
    )

    if n <= DENSE_MAX:
        width = max(n, MIN_DOT)
        if width != n:  # H_width[:n, :n] == H_n
            x2 = jnp.pad(x2, ((0, 0), (0, width - n)))
        block_rows = _block_rows(rows, width, MIN_DOT)
        kernel = functools.partial(_dense_kernel, n=width, acc_dtype=acc_dtype, scale=scale)
        spec = pl.BlockSpec((block_rows, width), lambda i: (i, 0))
        y = call(
            kernel,
            out_shape=out_type((rows, width)),
            grid=(pl.cdiv(rows, block_rows),),
            in_specs=[spec],
            out_specs=spec,
        )(x2)
        return y[:, :n]

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
    y = call(
        kernel,
        out_shape=out_type((rows, a, b)),
        grid=(pl.cdiv(rows, block_rows),),
        in_specs=[spec],
        out_specs=spec,
    )(x2.reshape(rows, a, b))
    return y.reshape(rows, n)
