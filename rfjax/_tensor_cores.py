"""What rfjax's tensor-core kernels share (fwht's Triton and Mosaic GPU kernels, fused attention's
Mosaic GPU kernels): float32 values as exact sums of bfloat16 parts, and the shared-memory layout
of a Mosaic GPU MMA operand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

SHARED_MEMORY_BYTES = 232_448  # an sm90 block's shared memory, at most (227 KiB)


def bfloat16_parts(x: jax.Array) -> list[jax.Array]:
    """Three bfloat16 arrays whose sum is the float32 ``x`` exactly, for tensor-core operands.

    Each part is the top 16 bits of what is left (a bit mask, so it is exactly a bfloat16 value
    and no compiler may fold the split away as excess precision); bfloat16 keeps 8 significant
    bits and float32's exponent range, so three parts hold all 24 bits.
    """
    parts = []
    for _ in range(3):
        bits = lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-65536)  # 0xFFFF0000
        part = lax.bitcast_convert_type(bits, jnp.float32)
        parts.append(part.astype(jnp.bfloat16))
        x = x - part
    return parts


def mma_transforms(columns: int, dtype) -> tuple:
    """Mosaic GPU's shared-memory tiling and swizzle of an MMA operand with ``columns`` minor
    entries (imported here: Mosaic GPU only where a kernel asks for it)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(columns * itemsize * 8)
    return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)
