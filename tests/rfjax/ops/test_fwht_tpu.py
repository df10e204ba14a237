"""Tests of ``rfjax.ops._fwht_tpu`` that run without a TPU: the lengths and dtypes its kernels
take, how one vector is laid out in a tile, the Hadamard factors and their dtypes, and the tile
heights. Its transforms are checked against the reference in test_fwht.py (interpret mode on
CPU, compiled on a TPU)."""

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.ops import _fwht_tpu, fwht_backend
from rfjax.ops._fwht_xla import hadamard_matrix

BACKEND = fwht_backend("pallas_tpu")  # its entry of the backend table: the limits


@pytest.mark.parametrize(
    ("n", "dtype", "error", "match"),
    [
        (24, jnp.float32, ValueError, "power-of-two lengths, got 24; pad with"),
        (1 << 15, jnp.float32, ValueError, "up to 16384, got 32768"),
        (64, jnp.dtype("float64"), TypeError, "float16, bfloat16 or float32, got float64"),
    ],
)
def test_check_supported_names_the_length_or_dtype_and_the_alternatives(n, dtype, error, match):
    with pytest.raises(error, match=match):
        BACKEND.check(n, dtype)
    for dtype in BACKEND.dtypes:
        BACKEND.check(BACKEND.max_n, dtype)


def test_long_vectors_are_tiled_as_lanes_with_two_hadamard_factors():
    dense = _fwht_tpu.DENSE_MAX
    assert _fwht_tpu._tiling(dense) == (dense,)
    assert _fwht_tpu._tiling(4 * dense) == (4 * dense // 128, 128)
    (h,) = _fwht_tpu._factors(64, jnp.float16)
    np.testing.assert_array_equal(h, hadamard_matrix(64))
    assert h.dtype == jnp.float32  # float16 inputs meet float32 factors
    h_lanes, h_rest = _fwht_tpu._factors(2048, jnp.bfloat16)
    assert h_lanes.shape == (128, 128) and h_rest.shape == (16, 16)
    assert h_lanes.dtype == jnp.bfloat16  # bfloat16 stays bfloat16 on the MXU
    # H_2048 = H_16 (x) H_128: the two factors applied to the (16, 128) tile of a vector.
    x = np.random.default_rng(0).standard_normal(2048)
    tile = x.reshape(16, 128)
    two_step = np.asarray(h_rest, np.float64) @ tile @ np.asarray(h_lanes, np.float64)
    np.testing.assert_allclose(two_step.reshape(-1), hadamard_matrix(2048) @ x, rtol=1e-12)


def test_tiles_hold_the_whole_array_when_small_else_a_bounded_multiple_of_eight_rows():
    tile = _fwht_tpu._TILE_ELEMENTS
    assert _fwht_tpu._block_rows(5, 128) == 5
    assert _fwht_tpu._block_rows(10_000, 128) == tile // 128
    assert _fwht_tpu._block_rows(100, BACKEND.max_n) == 8  # at least a full sublane group
