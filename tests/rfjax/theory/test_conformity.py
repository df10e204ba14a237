"""Tests of ``rfjax.theory._conformity``: the RF-conformity of one block (SimRF Eq. 19, 23, 24)
against reference values and mpmath (the simplex conformity up to |x + y| = 40), and over several
blocks. Checked in float64."""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import projections, theory
from tests.support import mpmath_reference
from tests.support.representatives import representatives
from tests.support.theory_points import DIM, pair, relative_error

pytestmark = pytest.mark.usefixtures("float64")


REFERENCE_TABLE = [
    # d, v, rho_IID, rho_ORF (Eq. 23), rho_SimRF (Eq. 24)
    (2, 0.5, 1.2840254167, 1.2747920097, 1.0559705651),
    (2, 1.0, 2.7182818285, 2.4730819061, 1.2556211681),
    (3, 1.0, 2.7182818285, 2.5133576683, 1.7327107038),
    (6, 0.5, 1.2840254167, 1.2792552572, 1.2232262240),
    (6, 1.0, 2.7182818285, 2.5795618214, 2.1818260611),
    (6, 2.0, 54.598150033, 30.541431876, 17.265657575),
    (16, 1.0, 2.7182818285, 2.6503451865, 2.4920772104),
    (64, 0.5, 1.2840254167, 1.2834220186, 1.2783973544),
    (64, 1.0, 2.7182818285, 2.6983450578, 2.6567831818),
    (64, 2.0, 54.598150033, 48.966737009, 46.126207040),
]


@pytest.mark.parametrize(("dim", "v", "rho_iid", "rho_orf", "rho_sim"), REFERENCE_TABLE)
def test_reference_table(dim, v, rho_iid, rho_orf, rho_sim):
    np.testing.assert_allclose(theory.iid_conformity(v), rho_iid, rtol=1e-8)
    np.testing.assert_allclose(theory.orthogonal_conformity(dim, v), rho_orf, rtol=1e-8)
    np.testing.assert_allclose(theory.simplex_conformity(dim, v), rho_sim, rtol=1e-8)
    for name, expected in (("gaussian", rho_iid), ("orthogonal", rho_orf), ("simplex", rho_sim)):
        np.testing.assert_allclose(theory.conformity(name, dim, v), expected, rtol=1e-8)


def test_parallel_pairs_have_the_largest_conformity():
    # For fixed norms the pair term increases with cos(theta), so theta = 0 beats random angles.
    for dim in (2, 6, 64):
        v = np.array([0.5, 1.0, 2.0])
        assert np.all(theory.conformity_at_angle(dim, v, 0.0) > theory.iid_conformity(v))


@pytest.mark.parametrize("dim", [512, 1024])
def test_no_overflow_for_large_dim(dim):
    v = np.linspace(0.0, 3.0, 7)
    rho_iid = theory.iid_conformity(v)
    rho_orf = theory.orthogonal_conformity(dim, v)
    rho_sim = theory.simplex_conformity(dim, v)
    series_sim = np.exp(mpmath_reference.log_simplex_series(dim, v))
    for rho in (rho_orf, rho_sim):
        assert np.all(np.isfinite(rho))
    np.testing.assert_allclose(rho_sim, series_sim, rtol=1e-12)
    np.testing.assert_allclose(rho_orf[0], 1.0, rtol=1e-12)
    assert np.all(rho_sim[1:] < rho_orf[1:]) and np.all(rho_orf[1:] < rho_iid[1:])
    x, y = pair(dim, 1.5, 1.5, 0.0)  # v^2 = 4.5
    for coupling in ("gaussian", "orthogonal", "simplex"):
        assert np.isfinite(theory.prf_mse(x, y, dim, coupling=coupling))
        assert np.isfinite(theory.rff_mse(x, y, dim + 3, coupling=coupling))
    gap = theory.prf_orthogonality_gap(x, y, dim)
    assert np.isfinite(gap) and gap > 0


def test_block_sizes_match_projection_layout():
    for num_features in (1, 5, 6, 9, 12, 15):
        layout = projections.DenseProjection(jnp.zeros((num_features, DIM)), block_size=DIM)
        assert theory.block_sizes(DIM, num_features) == layout.block_sizes()


def test_effective_conformity():
    v = np.array([0.5, 1.0])
    rho_block = theory.simplex_conformity(DIM, v)
    np.testing.assert_allclose(theory.effective_conformity(rho_block, v, (DIM,)), rho_block)
    np.testing.assert_allclose(theory.effective_conformity(rho_block, v, (1, 1, 1)), np.exp(v * v))
    # m = 9 in blocks (6, 3): 30 + 6 of 72 ordered pairs share a block.
    expected = (36 * rho_block + 36 * np.exp(v * v)) / 72
    np.testing.assert_allclose(theory.effective_conformity(rho_block, v, (6, 3)), expected)
    # m = 2 in one block: its only pair shares the block; m = 1: no pairs, e^{v^2} by convention.
    np.testing.assert_allclose(theory.effective_conformity(rho_block, v, (2,)), rho_block)
    np.testing.assert_allclose(theory.effective_conformity(rho_block, v, (1,)), np.exp(v * v))


def test_conformity_depends_on_v_through_v_squared_and_on_theta_through_its_cosine():
    v = np.array([0.5, 2.0])
    for coupling in ("gaussian", "orthogonal", "simplex"):
        np.testing.assert_allclose(
            theory.conformity(coupling, DIM, -v), theory.conformity(coupling, DIM, v), rtol=1e-14
        )
    np.testing.assert_allclose(theory.iid_conformity(-v), np.exp(v * v), rtol=1e-14)
    theta = np.array([0.3, 2.0])
    np.testing.assert_allclose(
        theory.conformity_at_angle(DIM, 1.0, 2 * np.pi - theta),
        theory.conformity_at_angle(DIM, 1.0, theta),
        rtol=1e-12,
    )


@functools.cache
def _mpmath_grid() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The stored mpmath quadrature of Eq. 21 (``mpmath_reference.main``): d -> (v, log rho)."""
    rows = json.loads(mpmath_reference.GRID_PATH.read_text())["rows"]
    table = np.array(rows, dtype=np.float64)
    return {
        int(dim): (table[table[:, 0] == dim, 1], table[table[:, 0] == dim, 2])
        for dim in np.unique(table[:, 0])
    }


# The grid's smallest d, the d of the old series' failures (8) and the largest in the default
# suite (each d compiles its own program); the other d in the full suite.
GRID_DIMS = representatives(mpmath_reference.GRID_DIMS, (2, 8, 1024))


@pytest.mark.parametrize("dim", GRID_DIMS)
def test_simplex_conformity_matches_mpmath_up_to_v40(dim):
    # d in [2, 1024], v in [0, 40] (values up to e^1213: compared in log space). The old Eq. 24
    # series was 1.5e-5 off at d = 8, v = 14, had the wrong sign at v = 18 and was 56% off at
    # d = 4, v = 12. Relative error 1e-12: the log's own float64 rounding at log rho ~ 1000 is
    # 1.1e-13.
    v, log_reference = _mpmath_grid()[dim]
    log_rho = theory.log_conformity("simplex", dim, v)
    assert np.max(relative_error(log_rho, log_reference)) <= 1e-12
    finite = log_reference < 700  # where rho itself is a finite float64
    np.testing.assert_allclose(
        theory.simplex_conformity(dim, v[finite]), np.exp(log_reference[finite]), rtol=1e-12
    )


@pytest.mark.parametrize(("dim", "v"), [(8, 14.0), (8, 18.0), (3, 12.0), (4, 12.0)])
def test_simplex_conformity_issue_cases_against_live_mpmath(dim, v):
    # The issue's failing cases, with the reference recomputed here (not read from the file).
    reference = mpmath_reference.log_conformity_quadrature(dim, v, -1.0 / (dim - 1))
    assert relative_error(theory.log_conformity("simplex", dim, v), reference) <= 1e-12


@pytest.mark.slow
def test_stored_mpmath_grid_is_reproduced():
    for dim, (v, stored) in _mpmath_grid().items():
        fresh = [mpmath_reference.log_conformity_quadrature(dim, x, -1.0 / (dim - 1)) for x in v]
        # Absolute 1e-12 below |log rho| = 1, relative above. Checked by hand: NumPy 2.5's
        # assert_allclose raises TypeError for an array atol (it formats atol with :g).
        error = np.abs(np.asarray(fresh) - stored) / np.maximum(1, np.abs(stored))
        worst = int(np.argmax(error))
        assert error[worst] <= 1e-12, (dim, v[worst], fresh[worst], stored[worst])


@pytest.mark.parametrize("dim", GRID_DIMS)
def test_simplex_below_orthogonal_below_iid_up_to_v40(dim):
    v = _mpmath_grid()[dim][0][1:]  # v > 0
    log_sim = np.asarray(theory.log_conformity("simplex", dim, v))
    log_orf = np.asarray(theory.log_conformity("orthogonal", dim, v))
    log_iid = np.asarray(theory.log_conformity("gaussian", dim, v))
    assert np.all(log_sim < log_orf) and np.all(log_orf < log_iid)


def test_simplex_conformity_memory_is_bounded_and_large_v_is_rejected():
    # The old series allocated O(v^4) (1.6 GB at v = 20, 108 TiB attempted at v = 1000). Now a
    # compiled evaluation of 1000 values uses a bounded workspace whatever the values.
    values = jnp.linspace(0.0, 20.0, 1000)
    compiled = jax.jit(lambda v: theory.simplex_conformity(8, v)).lower(values).compile()
    workspace = compiled.memory_analysis().temp_size_in_bytes
    assert workspace <= 1000 * 16384, workspace  # < 16 KiB per value (6.4 KiB measured)
    with pytest.raises(ValueError, match="v = 1000 is beyond the range v <= 100"):
        theory.simplex_conformity(8, 1000.0)
    # Traced, an out-of-range value is NaN in its own element only.
    traced = np.asarray(compiled(values.at[-1].set(1000.0)))
    assert np.all(np.isfinite(traced[:-1])) and math.isnan(traced[-1])
    np.testing.assert_allclose(traced[-2], theory.simplex_conformity(8, values[-2]), rtol=1e-14)
