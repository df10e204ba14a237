"""Tests of ``rfjax.ops._fwht_mosaic_gpu`` that run without a GPU: the lengths and dtypes its
kernel takes (its entry ``"mosaic_gpu"`` of the backend table, which checks them before the
kernel is called) and how a length is split into two Hadamard factors for the tensor-core MMAs.
Its transform is checked against the reference in test_fwht.py (interpret mode on CPU, compiled
on an sm90+ GPU)."""

import jax.numpy as jnp
import pytest

from rfjax.ops import _fwht_mosaic_gpu, fwht_backend

BACKEND = fwht_backend("mosaic_gpu")


@pytest.mark.parametrize(
    ("n", "dtype", "error", "match"),
    [
        (8, jnp.float32, ValueError, "power-of-two lengths 16 ... 16384, got 8"),
        (48, jnp.float32, ValueError, "got 48"),
        (1 << 15, jnp.bfloat16, ValueError, "got 32768"),
        (64, jnp.dtype("float64"), TypeError, "float16, bfloat16 or float32, got float64"),
    ],
)
def test_check_supported_names_the_length_or_dtype_and_the_alternatives(n, dtype, error, match):
    with pytest.raises(error, match=match):
        BACKEND.check(n, dtype)
    for dtype in BACKEND.dtypes:
        BACKEND.check(BACKEND.min_n, dtype)
        BACKEND.check(BACKEND.max_n, dtype)


def test_split_factors_keep_the_mma_depth_at_least_16():
    assert _fwht_mosaic_gpu.split_factors(16) == (1, 16)
    assert _fwht_mosaic_gpu.split_factors(128) == (1, 128)
    assert _fwht_mosaic_gpu.split_factors(256) == (16, 16)  # n / 128 = 2 is raised to 16
    assert _fwht_mosaic_gpu.split_factors(1 << 14) == (128, 128)
    n = BACKEND.min_n
    while n <= BACKEND.max_n:
        a, b = _fwht_mosaic_gpu.split_factors(n)
        assert a * b == n and (a == 1 or a >= 16) and b >= 16, n
        n *= 2
