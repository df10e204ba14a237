"""Tests of ``rfjax.ops._fwht_triton`` that run without a GPU: the block heights it launches
with, the zero rows it pads to whole blocks, and the lengths and dtypes it refuses before
compiling (its entry of the backend table checks them before the kernel is called). Its
transforms are checked against the reference in test_fwht.py (interpret mode on CPU, compiled
on a GPU)."""

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.ops import _fwht_triton, fwht_backend

BACKEND = fwht_backend("pallas_triton_interpret")  # its entry of the backend table: the limits


def test_block_rows_are_powers_of_two_within_the_tile_and_at_least_the_minimum():
    minimum = _fwht_triton.MIN_DOT
    for rows, n, expected in [
        (1, 128, minimum),  # fewer rows than a dot needs: one block of the minimum height
        (40, 128, 64),  # the next power of two above the rows
        (1000, 128, _fwht_triton._TILE_ELEMENTS // 128),  # capped by the tile's entries
        (3, BACKEND.max_n, minimum),  # a long vector: the minimum, whatever the tile
    ]:
        assert _fwht_triton._block_rows(rows, n, minimum) == expected, (rows, n)


def test_rows_are_padded_with_zeros_to_whole_blocks():
    x = jnp.arange(10.0).reshape(5, 2)
    padded = _fwht_triton._pad_rows(x, 4)
    assert padded.shape == (8, 2)
    np.testing.assert_array_equal(padded[:5], x)
    np.testing.assert_array_equal(padded[5:], 0.0)
    whole = x[:4]
    assert _fwht_triton._pad_rows(whole, 4) is whole  # whole blocks: no copy


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        ((2, 12), jnp.float32, ValueError, "power-of-two lengths, got 12; pad with"),
        ((1, 16384), jnp.float32, ValueError, "up to 8192, got 16384"),
        ((2, 16), jnp.int32, TypeError, "float32 or float64, got int32"),
    ],
)
def test_unsupported_inputs_are_refused_before_compiling(shape, dtype, error, match):
    with pytest.raises(error, match=match):
        BACKEND.kernel()(jnp.zeros(shape, dtype), True)


def test_an_empty_input_is_returned_as_it_is():
    empty = jnp.zeros((0, 64), jnp.float32)
    assert _fwht_triton.fwht_rows_interpret(empty, False) is empty
