"""The Pallas Mosaic GPU kernel behind ``fwht`` (``implementation="mosaic_gpu"``), for sm90+.

Mosaic GPU is the supported Pallas backend for Hopper (sm90) and newer GPUs; the Triton backend is
deprecated (see ``rfjax.ops._fwht_triton``, kept for sm80-sm89). The transform is computed as
matrix products on the tensor cores (warpgroup MMA, ``plgpu.wgmma``):

* 16 <= n <= 128: a tile of 64 vectors (rows) in shared memory times H_n, one MMA;
* 256 <= n <= 2^14: n = a b with a = max(16, n / 128) and b = n / a; each vector viewed as an
  a x b matrix X (a free reshape) becomes H_a X H_b (H_n = H_a (x) H_b): first the tile of
  vectors as (R a, b) rows times H_b (R = 64 / a vectors, or 1 when a = 128), then, per vector,
  H_a (zero-padded to 64 rows when a < 64) times X H_b.

Operands: the tensor cores take bfloat16/float16 with float32 accumulation. Products with +-1
are exact, so bfloat16 and float16 inputs enter as they are; a float32 operand (a float32 input,
or the float32 intermediate X H_b) enters as three bfloat16 parts whose sum is exactly that
value (bit masks, so no compiler may fold the split away), each part through its own MMA into
the same accumulator. Every vector is computed from its own entries only (no zero of a padded
matrix ever multiplies another vector's entries), so a NaN stays in its vector. The result is
rounded once to the input dtype. float64 is not supported (the limits, float16/bfloat16/float32
and 16 <= n <= 2^14, are the backend's entry in ``rfjax.ops._fwht_backends``, which checks
them before the kernel is called).

The row count is padded up to a whole number of tiles (one copy of the input) when needed.

Two launches of the one kernel (``_kernel``: H_b and H_a loaded once per program, then its
tiles through ``plgpu.emit_pipeline``):

* ``fwht_rows`` (``"mosaic_gpu"``): one tile per program, the launch of the H200 runs;
* ``fwht_rows_pipelined`` (``"mosaic_gpu_pipelined"``): up to ``TILES_PER_PROGRAM`` tiles per
  program through two input buffers where shared memory holds them (``_Plan.shared_bytes``;
  one at n = 2^14 in float32), so the next tile loads while one is transformed. At n = 8,192
  in float32 a program needs 120 KiB of shared memory: one runs per SM, and its load, MMAs and
  store followed one another (1.83x a copy, ``benchmarks/gpu_runs/2026-11-30-h200``).

Which launch is faster is a GPU's to measure (``benchmarks/fwht_gpu.py`` times every
registered backend); the slower one is then removed.

Testing: the kernel runs on CPU in Pallas' Mosaic GPU interpret mode (``InterpretGPUParams``:
it simulates shared memory, the TMA copies, barriers and MMAs, with float32 accumulation), and it
is lowered for an abstract H100 (``lowering_platforms=("cuda",)``) on CPU, which runs the Mosaic
GPU lowering and layout inference. On an H200 (JAX 0.11.2, ``benchmarks/gpu_runs/2026-11-26-h200``)
it compiled for sm90 and passed the tests of ``tests/rfjax/ops/test_fwht.py`` that take its lengths
(the dense transform at n = 16 ... 4096 in float32 within 4 eps (1 + log2 n) |x| per vector, float16
and bfloat16 within 2 ulps, ``hd_chain``), and agreed with the XLA butterfly within 1e-5
relative at every n = 64 ... 2^14 in float32 on 2^24 entries; bfloat16 was not benchmarked there.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rfjax._tensor_cores import SHARED_MEMORY_BYTES, bfloat16_parts, mma_transforms
from rfjax.ops._fwht_xla import hadamard_matrix

_WARPGROUP_ROWS = 64  # the M of one warpgroup MMA
TILES_PER_PROGRAM = 8  # the pipelined launch: tiles per program, at most (a divisor of all)


def split_factors(n: int) -> tuple[int, int]:
    """(a, b) with n = a b: (1, n) up to 128, else a = max(16, n / 128) (MMA K >= 16)."""
    if n <= 128:
        return 1, n
    a = max(16, n // 128)
    return a, n // a


def _mma_dtype(dtype) -> jnp.dtype:
    """The tensor-core operand dtype: float16 stays float16, the others go through bfloat16."""
    return jnp.dtype(jnp.float16) if jnp.dtype(dtype) == jnp.float16 else jnp.dtype(jnp.bfloat16)


class _Plan:
    """Shapes of one launch: a tile is ``tile_rows`` rows of the (rows a, b) view; a program
    transforms ``tiles_per_program`` tiles through ``stages`` input buffers."""

    def __init__(self, rows: int, n: int, dtype, pipelined: bool):
        self.n, self.dtype = n, jnp.dtype(dtype)
        self.a, self.b = split_factors(n)
        self.vectors_per_tile = max(1, _WARPGROUP_ROWS // self.a)
        self.tile_rows = self.vectors_per_tile * self.a
        self.padded_rows = -(-rows // self.vectors_per_tile) * self.vectors_per_tile
        self.num_tiles = self.padded_rows // self.vectors_per_tile
        self.mma_dtype = _mma_dtype(dtype)
        self.split_input = self.dtype == jnp.float32
        self.left_rows = max(_WARPGROUP_ROWS, self.a)  # H_a padded to a whole warpgroup
        # The two operands of an MMA must share one swizzle: the one of the narrower factor.
        self.mma_transforms = mma_transforms(
            min(self.a, self.b) if self.a > 1 else self.b, self.mma_dtype
        )
        self.tiles_per_program, self.stages = 1, 1
        if pipelined:
            self.tiles_per_program = _largest_divisor(self.num_tiles, TILES_PER_PROGRAM)
            self.stages = 2 if self.shared_bytes(2) <= SHARED_MEMORY_BYTES else 1
        self.num_programs = self.num_tiles // self.tiles_per_program

    def shared_bytes(self, stages: int) -> int:
        """Shared memory of a program with ``stages`` input buffers: the scratch, the
        pipeline's buffers and the barriers (8 bytes each: two for H_b and H_a, one per
        stage), as Mosaic GPU counts it."""
        itemsize, half = self.dtype.itemsize, 2
        total = stages * self.tile_rows * self.b * itemsize + self.b * self.b * half
        total += 8 * (2 + stages)
        if self.split_input or self.a > 1:
            total += 3 * self.tile_rows * self.b * half
        if self.a > 1:
            total += self.left_rows * self.a * half
            if self.left_rows != self.a:
                total += self.left_rows * self.b * itemsize
        return total


def _largest_divisor(n: int, most: int) -> int:
    return max(d for d in range(1, min(n, most) + 1) if n % d == 0)


def _kernel(
    *refs,
    plan: _Plan,
    scale: float,
    hb_smem,
    barriers,
    parts=None,
    ha_smem=None,
    z_smem=None,
):
    """One program: H_b (and H_a) loaded once, then its ``plan.tiles_per_program`` tiles
    through a pipeline of ``plan.stages`` input buffers (the next tiles' loads in flight while
    one is transformed); ``refs`` are the global-memory operands (x, H_b[, H_a]) and the output.
    """
    (x_gmem, hb_gmem, *ha_gmem, o_gmem) = refs
    program = lax.axis_index("programs")
    plgpu.copy_gmem_to_smem(hb_gmem, hb_smem, barriers.at[0])
    if ha_smem is not None:
        plgpu.copy_gmem_to_smem(ha_gmem[0], ha_smem, barriers.at[1])

    def tile_index(step):
        return program * plan.tiles_per_program + step

    def step(indices, x_smem):
        @pl.when(indices[0] == 0)  # H_b and H_a arrive while the first tiles load
        def _():
            plgpu.barrier_wait(barriers.at[0])
            if ha_smem is not None:
                plgpu.barrier_wait(barriers.at[1])

        _tile(
            x_smem,
            o_gmem,
            tile_index(indices[0]),
            plan=plan,
            scale=scale,
            hb_smem=hb_smem,
            parts=parts,
            ha_smem=ha_smem,
            z_smem=z_smem,
        )

    tile_spec = plgpu.BlockSpec(
        (plan.tile_rows, plan.b),
        lambda i: (tile_index(i), 0),
        transforms=() if plan.split_input else plan.mma_transforms,
    )
    plgpu.emit_pipeline(
        step,
        grid=(plan.tiles_per_program,),
        in_specs=[tile_spec],
        max_concurrent_steps=plan.stages,
    )(x_gmem)
    plgpu.wait_smem_to_gmem(0)


def _tile(x_smem, o_gmem, tile, *, plan: _Plan, scale: float, hb_smem, parts, ha_smem, z_smem):
    """One tile, from its input buffer ``x_smem`` to rows of ``o_gmem``.

    ``x_smem`` holds the input tile and then the output (stage 1 only) or one vector's product
    (stage 2 with a >= 64); ``parts`` the bfloat16 parts of the float32 input (stage 1) and then
    of X H_b (stage 2). Every copy out has been read before the tile ends: the pipeline loads a
    later tile into ``x_smem`` once this one returns.
    """
    # Stage 1: the tile (rows of b entries) times H_b.
    if plan.split_input:
        _store_parts(parts, x_smem[...])
        lhs = [parts.at[i] for i in range(3)]
    else:
        lhs = [x_smem]
    y = pl.run_scoped(
        functools.partial(_mma, pairs=[(part, hb_smem) for part in lhs]),
        plgpu.ACC((plan.tile_rows, plan.b), jnp.float32),
    )
    first_row = tile * plan.tile_rows
    if ha_smem is None:
        x_smem[...] = (y * scale).astype(x_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem.at[pl.ds(first_row, plan.tile_rows)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        return
    # Stage 2: per vector, H_a (padded to a warpgroup) times its a x b block of X H_b. The
    # product goes to shared memory whole and its first a rows to global memory (a TMA copy of a
    # slice: no register array is sliced).
    _store_parts(parts, y)
    z_smem = x_smem if z_smem is None else z_smem
    for v in range(plan.vectors_per_tile):
        rows = pl.ds(v * plan.a, plan.a)
        z = pl.run_scoped(
            functools.partial(_mma, pairs=[(ha_smem, parts.at[i, rows]) for i in range(3)]),
            plgpu.ACC((plan.left_rows, plan.b), jnp.float32),
        )
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous vector's copy is out
        z_smem[...] = (z * scale).astype(z_smem.dtype)
        plgpu.commit_smem()
        out_rows = pl.ds(first_row + v * plan.a, plan.a)
        plgpu.copy_smem_to_gmem(z_smem.at[pl.ds(0, plan.a)], o_gmem.at[out_rows])
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _store_parts(parts, value) -> None:
    """The three bfloat16 parts of the float32 ``value`` into ``parts[0:3]``, fenced for MMAs."""
    for i, part in enumerate(bfloat16_parts(value)):
        parts[i] = part
    plgpu.commit_smem()


def _mma(acc_ref, pairs) -> jax.Array:
    """sum of lhs @ rhs over ``pairs`` (shared-memory refs) into the float32 accumulator."""
    for lhs, rhs in pairs:
        plgpu.wgmma(acc_ref, lhs, rhs)
    plgpu.wgmma_wait(0)
    return acc_ref[...]


def _transform(x: jax.Array, normalize: bool, *, interpret: bool, pipelined: bool) -> jax.Array:
    n = x.shape[-1]
    if x.size == 0:
        return x
    rows = x.size // n
    plan = _Plan(rows, n, x.dtype, pipelined)
    flat = x.reshape(rows, n)
    if plan.padded_rows != rows:
        flat = jnp.pad(flat, ((0, plan.padded_rows - rows), (0, 0)))
    view = flat.reshape(plan.padded_rows * plan.a, plan.b)
    operands = [view, jnp.asarray(hadamard_matrix(plan.b), plan.mma_dtype)]
    stage2 = plan.a > 1
    if stage2:  # H_a in the top a rows of a (left_rows, a) matrix; the other rows are zero
        ha = jnp.zeros((plan.left_rows, plan.a), jnp.bfloat16)
        operands.append(ha.at[: plan.a].set(jnp.asarray(hadamard_matrix(plan.a), jnp.bfloat16)))
    mma_b = plan.mma_transforms
    scratch: dict[str, Any] = dict(
        hb_smem=plgpu.SMEM((plan.b, plan.b), plan.mma_dtype, transforms=mma_b),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=2),
    )
    if plan.split_input or stage2:
        scratch["parts"] = plgpu.SMEM((3, plan.tile_rows, plan.b), jnp.bfloat16, transforms=mma_b)
    if stage2:
        scratch["ha_smem"] = plgpu.SMEM((plan.left_rows, plan.a), jnp.bfloat16, transforms=mma_b)
        if plan.left_rows != plan.a:  # else the input tile's buffer holds the product
            scratch["z_smem"] = plgpu.SMEM((plan.left_rows, plan.b), x.dtype)
    kernel = plgpu.kernel(
        functools.partial(_kernel, plan=plan, scale=1.0 / math.sqrt(n) if normalize else 1.0),
        out_type=jax.ShapeDtypeStruct(view.shape, x.dtype),
        grid=(plan.num_programs,),
        grid_names=("programs",),
        scratch_types=scratch,
        interpret=plgpu.InterpretGPUParams() if interpret else False,
    )
    y = kernel(*operands)
    return y.reshape(plan.padded_rows, n)[:rows].reshape(x.shape)


def fwht_rows(x: jax.Array, normalize: bool) -> jax.Array:
    """H_n x (optionally / sqrt(n)) along the last axis of ``x``, compiled for a GPU (sm90+):
    one tile per program."""
    return _transform(x, normalize, interpret=False, pipelined=False)


def fwht_rows_interpret(x: jax.Array, normalize: bool) -> jax.Array:
    """The same kernel in Pallas' Mosaic GPU interpret mode (on CPU; for tests)."""
    return _transform(x, normalize, interpret=True, pipelined=False)


def fwht_rows_pipelined(x: jax.Array, normalize: bool) -> jax.Array:
    """The same transform with up to ``TILES_PER_PROGRAM`` tiles per program, the next tile
    loading while one is transformed (two input buffers where shared memory holds them)."""
    return _transform(x, normalize, interpret=False, pipelined=True)


def fwht_rows_pipelined_interpret(x: jax.Array, normalize: bool) -> jax.Array:
    """``fwht_rows_pipelined`` in Pallas' Mosaic GPU interpret mode (on CPU; for tests)."""
    return _transform(x, normalize, interpret=True, pipelined=True)
