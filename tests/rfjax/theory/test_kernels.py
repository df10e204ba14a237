"""Tests of ``rfjax.theory._kernels``: the compiled kernels behind the closed forms agree with
SciPy's confluent hypergeometric function, give NaN beyond their range, and one executable per
kernel serves every dimension (d is an array argument, not a static one)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from rfjax.theory import _kernels

pytestmark = pytest.mark.usefixtures("float64")


def test_orthogonal_kernels_match_scipy_hyp1f1_and_share_one_executable():
    v2 = jnp.asarray([0.0, 0.25, 1.0, 4.0])
    _kernels.log_orthogonal(2, v2)  # compile once
    _kernels.rff_orthogonal(2, v2)
    compiled = (_kernels._log_orthogonal._cache_size(), _kernels._rff_orthogonal._cache_size())
    for dim in (3, 6, 64):
        np.testing.assert_allclose(
            _kernels.log_orthogonal(dim, v2),
            np.log(special.hyp1f1(dim, dim / 2, 0.5 * np.asarray(v2))),
            rtol=1e-12,
        )
        np.testing.assert_allclose(
            _kernels.rff_orthogonal(dim, v2),
            special.hyp1f1(dim, dim / 2, -0.5 * np.asarray(v2)),
            rtol=1e-9,
            atol=1e-14,
        )
    assert (
        _kernels._log_orthogonal._cache_size(),
        _kernels._rff_orthogonal._cache_size(),
    ) == compiled


def test_out_of_range_elements_are_nan_alone():
    limit = _kernels.SIMPLEX_RFF_MAX_DISTANCE
    z2 = jnp.asarray([1.0, (limit + 1.0) ** 2])
    values = np.asarray(_kernels.rff_simplex(6, z2))
    assert np.isfinite(values[0]) and np.isnan(values[1])
    log_rho = np.asarray(_kernels.log_orthogonal(6, jnp.asarray([1.0, 101.0**2])))
    assert np.isfinite(log_rho[0]) and np.isnan(log_rho[1])
