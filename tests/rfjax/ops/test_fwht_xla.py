"""``rfjax.ops._fwht_xla``: the Hadamard matrix, its Kronecker factors and the XLA forms of H x
(butterfly and Kronecker matmuls)."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from rfjax.ops._fwht_xla import (
    hadamard_matrix,
    kronecker_factors,
    kronecker_matmul,
    xla_butterfly,
)


def test_hadamard_matrix_is_sylvesters():
    np.testing.assert_array_equal(hadamard_matrix(16), scipy.linalg.hadamard(16))


@pytest.mark.parametrize("n", [1, 2, 64, 1 << 15])
def test_kronecker_factors_are_powers_of_two_whose_product_is_n(n):
    factors = kronecker_factors(n)
    assert np.prod(factors) == n and all(f & (f - 1) == 0 for f in factors)
    assert max(factors) // min(factors) <= 2  # as equal as possible


@pytest.mark.parametrize("form", [xla_butterfly, kronecker_matmul])
@pytest.mark.parametrize("normalize", [False, True])
def test_xla_forms_equal_the_dense_product(form, normalize):
    n = 32
    x = np.random.default_rng(1).standard_normal((3, n)).astype(np.float32)
    exact = x.astype(np.float64) @ scipy.linalg.hadamard(n).T / (np.sqrt(n) if normalize else 1)
    np.testing.assert_allclose(form(jnp.asarray(x), normalize), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", [xla_butterfly, kronecker_matmul])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_types_accumulate_in_float32_and_round_once(form, dtype):
    """n = 1024 (10 butterfly stages; Kronecker factors 32 x 32): the result is the exact
    transform of the half-precision input rounded once to its dtype (float32 sums are exact to
    far below its rounding), up to a rare double rounding. Sums kept in the half type (rounded
    at every stage or contraction) differed in 40-70% of the entries in bfloat16."""
    n = 1024
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, n)), dtype)
    exact = np.asarray(x, np.float64) @ scipy.linalg.hadamard(n).T / np.sqrt(n)
    once = np.asarray(jnp.asarray(exact, dtype), np.float64)
    got = form(x, True)
    assert got.dtype == dtype
    got = np.asarray(got, np.float64)
    assert np.mean(got != once) <= 0.01
    ulp = np.spacing(np.abs(once).astype(jnp.finfo(dtype).dtype)).astype(np.float64)
    assert np.all(np.abs(got - once) <= ulp)
