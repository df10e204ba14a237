"""Tests for rfjax.theory: reference values, series vs quadrature, identities, Monte Carlo, the
simplex conformity at large |x + y| against mpmath, and composition with jit / vmap / grad.

The closed forms are checked in float64 (every test here runs with ``jax_enable_x64``; the
Monte Carlo draws are float32, as the samplers' default). Statistical checks use fixed keys and
pass when |measured - predicted| <= 4 standard errors.
"""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from rfjax import projections, theory
from tests.support import mpmath_reference
from tests.support.representatives import representatives

NSIG = 4.0
NUM_DRAWS = 40_000
DIM = 6


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


def _pair(dim: int, norm_x: float, norm_y: float, cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Two vectors in R^dim with the given norms and mutual cosine."""
    x = np.zeros(dim)
    y = np.zeros(dim)
    x[0] = norm_x
    y[0] = norm_y * cosine
    y[1] = norm_y * math.sqrt(1.0 - cosine**2)
    return x, y


# PRF pair: |x| = |y| = 0.5, v = |x + y| = 0.8. RFF pair: z = |x - y| ~ 1.25.
PRF_X, PRF_Y = _pair(DIM, 0.5, 0.5, 0.28)
RFF_X, RFF_Y = _pair(DIM, 0.9, 0.7, -0.2)


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def _assert_within(measured: float, se: float, predicted: float) -> None:
    z = (measured - predicted) / se
    assert abs(measured - predicted) <= NSIG * se, (
        f"measured {measured:.6g} +- {se:.2g}, predicted {predicted:.6g}, z = {z:+.2f}"
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _project(sampler, dim, num_features, keys, points):
    return jax.vmap(lambda key: sampler(key, dim, num_features)(points))(keys)


@functools.cache
def _draws(coupling: str) -> np.ndarray:
    """Projections w_i^T p of the four test points for NUM_DRAWS independent draws of m = 9.

    Shape (NUM_DRAWS, 4, 9), float64 (drawn in float32, analysed in float64). With d = 6 the
    blocks are (6, 3), the last one truncated by the sampler; the first 6 rows are one full
    block, i.e. a draw with m = 6 (one compilation per coupling serves both cases).
    """
    seed = {"gaussian": 1, "orthogonal": 2, "simplex": 3}[coupling]
    keys = jax.random.split(jax.random.key(seed), NUM_DRAWS)
    points = jnp.asarray(np.stack([PRF_X, PRF_Y, RFF_X, RFF_Y]), jnp.float32)
    sampler = projections.get(coupling)
    return np.asarray(_project(sampler, DIM, 9, keys, points), dtype=np.float64)


def _projections(coupling: str, num_features: int) -> np.ndarray:
    """(NUM_DRAWS, 4, num_features) projections, num_features in {6, 9} (see ``_draws``)."""
    return _draws(coupling)[..., :num_features]


def _prf_estimates(coupling: str, num_features: int, kernel: str) -> np.ndarray:
    proj = _projections(coupling, num_features)
    shift = 1.0 if kernel == "gaussian" else 0.5
    fx = np.exp(proj[:, 0] - shift * PRF_X @ PRF_X)
    fy = np.exp(proj[:, 1] - shift * PRF_Y @ PRF_Y)
    return np.mean(fx * fy, axis=-1)


def _prf_kernel(kernel: str) -> float:
    if kernel == "gaussian":
        return math.exp(-np.sum((PRF_X - PRF_Y) ** 2) / 2)
    return math.exp(PRF_X @ PRF_Y)


# --------------------------------------------------------------------------------------------
# Reference values (docs/maths/positive_features.md) and the small-v prefactor (Sec. 5.1)
# --------------------------------------------------------------------------------------------

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


@pytest.mark.parametrize(
    ("dim", "printed", "digits"), [(6, 0.07961, 5), (64, 0.007782, 6), (128, 0.003899, 6)]
)
def test_small_v_prefactor_reference(dim, printed, digits):
    assert round(theory.small_v_prefactor("simplex", dim, dim), digits) == printed
    assert theory.small_v_prefactor("gaussian", dim, dim) == 1.0
    assert theory.small_v_prefactor("orthogonal", dim, dim) == 1.0


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
@pytest.mark.parametrize("num_features", [2, 4, 6])
def test_small_v_prefactor_is_the_limit_of_prf_mse(coupling, num_features):
    v = 1e-3
    x = np.full(DIM, v / (2 * math.sqrt(DIM)))  # x = y, |x + y| = v
    scaled = (
        num_features
        * math.exp(4 * x @ x)
        * theory.prf_mse(x, x, num_features, coupling=coupling)
        / v**2
    )
    np.testing.assert_allclose(
        scaled, theory.small_v_prefactor(coupling, DIM, num_features), rtol=1e-5
    )


# --------------------------------------------------------------------------------------------
# Series vs quadrature, stability, vectorisation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 3, 6, 16, 64, 256])
def test_series_agree_with_quadrature_of_eq21(dim):
    # simplex_conformity is the quadrature of Eq. 21; Eq. 24 (the paper's series) is summed in
    # exact arithmetic by mpmath. ORF: the 1F1 series (Eq. 23) against the quadrature.
    v = np.array([0.0, 0.3, 0.5, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(
        theory.simplex_conformity(dim, v),
        np.exp(mpmath_reference.log_simplex_series(dim, v)),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        theory.orthogonal_conformity(dim, v),
        theory.conformity_at_angle(dim, v, math.pi / 2),
        rtol=1e-9,
    )


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
    x, y = _pair(dim, 1.5, 1.5, 0.0)  # v^2 = 4.5
    for coupling in ("gaussian", "orthogonal", "simplex"):
        assert np.isfinite(theory.prf_mse(x, y, dim, coupling=coupling))
        assert np.isfinite(theory.rff_mse(x, y, dim + 3, coupling=coupling))
    gap = theory.prf_orthogonality_gap(x, y, dim)
    assert np.isfinite(gap) and gap > 0


def test_vectorised_over_batches():
    rng = np.random.default_rng(0)
    x = 0.4 * rng.standard_normal((4, 3, DIM))
    y = 0.4 * rng.standard_normal((DIM,))
    for coupling in ("gaussian", "orthogonal", "simplex"):
        batch = theory.prf_mse(x, y, 9, coupling=coupling, kernel="softmax")
        assert batch.shape == (4, 3)
        single = theory.prf_mse(x[2, 1], y, 9, coupling=coupling, kernel="softmax")
        np.testing.assert_allclose(batch[2, 1], single, rtol=1e-13)
        rff = theory.rff_mse(x, y, 9, coupling=coupling)
        assert rff.shape == (4, 3)
        np.testing.assert_allclose(
            rff[0, 2], theory.rff_mse(x[0, 2], y, 9, coupling=coupling), rtol=1e-13
        )
    v = np.array([0.5, 1.0, 2.0])
    theta = np.array([0.3, 1.0, 2.0, 3.0])
    grid = theory.conformity_at_angle(DIM, v[:, None], theta[None, :])
    assert grid.shape == (3, 4)
    np.testing.assert_allclose(grid[1, 2], theory.conformity_at_angle(DIM, 1.0, 2.0), rtol=1e-13)
    np.testing.assert_allclose(
        theory.simplex_conformity(DIM, v)[2], theory.simplex_conformity(DIM, 2.0), rtol=1e-13
    )


# --------------------------------------------------------------------------------------------
# Multi-block conformity
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Identities between the closed forms (Eq. 25-27)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dim", "num_features"), [(6, 1), (6, 3), (6, 6), (64, 40)])
def test_prf_gap_eq25_equals_mse_difference(dim, num_features):
    rng = np.random.default_rng(dim + num_features)
    x = 0.3 * rng.standard_normal((5, dim))
    y = 0.3 * rng.standard_normal((5, dim))
    difference = theory.prf_mse(x, y, num_features) - theory.prf_mse(
        x, y, num_features, coupling="orthogonal"
    )
    gap = theory.prf_orthogonality_gap(x, y, num_features)
    np.testing.assert_allclose(gap, difference, rtol=1e-9, atol=1e-15)
    if num_features > 1:
        assert np.all(gap > 0)


@pytest.mark.parametrize(("dim", "num_features"), [(6, 6), (16, 9)])
def test_rff_gap_eq26_equals_mse_difference(dim, num_features):
    z = np.array([0.3, 1.0, 1.7, 3.0])
    x = np.zeros((z.size, dim))
    x[:, 0] = z
    difference = theory.rff_mse(x, np.zeros(dim), num_features) - theory.rff_mse(
        x, np.zeros(dim), num_features, coupling="orthogonal"
    )
    np.testing.assert_allclose(
        theory.rff_orthogonality_gap(z, dim, num_features), difference, rtol=1e-9, atol=1e-15
    )


def test_rff_asymptotic_ratio_eq27_converges_like_one_over_d():
    z = 1.2
    errors = []
    for dim in (64, 256, 1024):
        x = np.zeros(dim)
        x[0] = z
        y = np.zeros(dim)
        exact = theory.rff_mse(x, y, dim, coupling="orthogonal") / theory.rff_mse(x, y, dim)
        errors.append(abs(exact - theory.rff_orthogonal_mse_ratio_asymptotic(z, dim, dim)))
    assert errors[0] > errors[1] > errors[2]
    assert 3.0 < errors[0] / errors[1] < 5.0 and 3.0 < errors[1] / errors[2] < 5.0
    np.testing.assert_allclose(theory.rff_orthogonal_mse_ratio_asymptotic(0.0, 8, 5), 0.5)


def test_rff_simplex_is_worse_than_orthogonal():
    # docs/maths/fourier_features.md: MSE/MSE_IID at z = 1, m = d: ORF 0.300 vs SimRF 0.465 (d = 6).
    for dim, orf, sim in ((6, 0.300, 0.465), (64, 0.098, 0.112)):
        x = np.zeros(dim)
        x[0] = 1.0
        y = np.zeros(dim)
        iid = theory.rff_mse(x, y, dim)
        assert round(float(theory.rff_mse(x, y, dim, coupling="orthogonal") / iid), 3) == orf
        assert round(float(theory.rff_mse(x, y, dim, coupling="simplex") / iid), 3) == sim


# --------------------------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
@pytest.mark.parametrize("num_features", [6, pytest.param(9, marks=pytest.mark.statistical)])
def test_prf_mse_matches_monte_carlo(coupling, num_features):
    for kernel in ("gaussian", "softmax"):
        estimates = _prf_estimates(coupling, num_features, kernel)
        truth = _prf_kernel(kernel)
        _assert_within(*_mean_se(estimates), truth)  # unbiased
        mse, se = _mean_se((estimates - truth) ** 2)
        predicted = theory.prf_mse(PRF_X, PRF_Y, num_features, coupling=coupling, kernel=kernel)
        _assert_within(mse, se, float(predicted))


def test_prf_monte_carlo_discriminates_simplex_from_orthogonal():
    estimates = _prf_estimates("simplex", DIM, "gaussian")
    mse, se = _mean_se((estimates - _prf_kernel("gaussian")) ** 2)
    orthogonal_prediction = float(theory.prf_mse(PRF_X, PRF_Y, DIM, coupling="orthogonal"))
    assert abs(mse - orthogonal_prediction) > 20 * se


@pytest.mark.parametrize(
    ("coupling", "num_features"),
    [("gaussian", 6), ("orthogonal", 6), ("orthogonal", 9), ("simplex", 6), ("simplex", 9)],
)
def test_rff_sincos_mse_matches_monte_carlo(coupling, num_features):
    proj = _projections(coupling, num_features)
    estimates = np.mean(np.cos(proj[:, 2] - proj[:, 3]), axis=-1)
    truth = math.exp(-np.sum((RFF_X - RFF_Y) ** 2) / 2)
    mse, se = _mean_se((estimates - truth) ** 2)
    _assert_within(mse, se, float(theory.rff_mse(RFF_X, RFF_Y, num_features, coupling=coupling)))


def test_rff_cosine_bias_mse_matches_monte_carlo():
    num_features = 6
    proj = _projections("gaussian", num_features)
    bias = (
        2
        * math.pi
        * np.asarray(
            jax.random.uniform(jax.random.key(7), (NUM_DRAWS, num_features)), dtype=np.float64
        )
    )
    estimates = np.mean(2 * np.cos(proj[:, 2] + bias) * np.cos(proj[:, 3] + bias), axis=-1)
    truth = math.exp(-np.sum((RFF_X - RFF_Y) ** 2) / 2)
    mse, se = _mean_se((estimates - truth) ** 2)
    predicted = theory.rff_mse(RFF_X, RFF_Y, num_features, embedding="cosine_bias")
    _assert_within(mse, se, float(predicted))
    # psi is worse than phi for the Gaussian kernel (docs/maths/fourier_features.md, Eq. 3)
    assert predicted > theory.rff_mse(RFF_X, RFF_Y, num_features)


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
def test_monte_carlo_conformity_matches_closed_forms(coupling):
    num_features = 9  # blocks (6, 3): 36 of the 72 ordered pairs share a block
    mean, se = theory.monte_carlo_conformity(
        jax.random.key(11),
        coupling,
        PRF_X,
        PRF_Y,
        num_features,
        num_samples=20_000,
        batch_size=20_000,
    )
    v = float(np.linalg.norm(PRF_X + PRF_Y))
    predicted = theory.effective_conformity(
        theory.conformity(coupling, DIM, v), v, theory.block_sizes(DIM, num_features)
    )
    _assert_within(mean, se, float(predicted))


def test_monte_carlo_conformity_with_a_sampler_callable_and_general_angle():
    # Partial block as an r-vertex simplex (r = 3, cos = -1/2): pairs in it have the Eq. 21
    # conformity at theta = arccos(-1/2) (docs/maths/couplings.md: 1.689 at d = 6, v = 1).
    np.testing.assert_allclose(
        theory.conformity_at_angle(DIM, 1.0, math.acos(-0.5)), 1.689, atol=5e-4
    )

    def sampler(key, dim, num_features):
        return projections.simplex(key, dim, num_features, partial_block="simplex")

    mean, se = theory.monte_carlo_conformity(
        jax.random.key(3), sampler, PRF_X, PRF_Y, 9, num_samples=20_000, batch_size=20_000
    )
    v = float(np.linalg.norm(PRF_X + PRF_Y))
    pair_sum = (
        30 * theory.simplex_conformity(DIM, v)
        + 6 * theory.conformity_at_angle(DIM, v, math.acos(-0.5))
        + 36 * theory.iid_conformity(v)
    )
    _assert_within(mean, se, float(pair_sum / 72))
    assert isinstance(mean, float) and isinstance(se, float) and se > 0


# --------------------------------------------------------------------------------------------
# The simplex conformity at large |x + y| (issue 19, item 2) against mpmath
# --------------------------------------------------------------------------------------------


@functools.cache
def _mpmath_grid() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The stored mpmath quadrature of Eq. 21 (``mpmath_reference.main``): d -> (v, log rho)."""
    rows = json.loads(mpmath_reference.GRID_PATH.read_text())["rows"]
    table = np.array(rows, dtype=np.float64)
    return {
        int(dim): (table[table[:, 0] == dim, 1], table[table[:, 0] == dim, 2])
        for dim in np.unique(table[:, 0])
    }


def _relative_error(log_value: np.ndarray, log_reference: np.ndarray) -> np.ndarray:
    return np.abs(np.expm1(np.asarray(log_value) - log_reference))


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
    assert np.max(_relative_error(log_rho, log_reference)) <= 1e-12
    finite = log_reference < 700  # where rho itself is a finite float64
    np.testing.assert_allclose(
        theory.simplex_conformity(dim, v[finite]), np.exp(log_reference[finite]), rtol=1e-12
    )


@pytest.mark.parametrize(("dim", "v"), [(8, 14.0), (8, 18.0), (3, 12.0), (4, 12.0)])
def test_simplex_conformity_issue_cases_against_live_mpmath(dim, v):
    # The issue's failing cases, with the reference recomputed here (not read from the file).
    reference = mpmath_reference.log_conformity_quadrature(dim, v, -1.0 / (dim - 1))
    assert _relative_error(theory.log_conformity("simplex", dim, v), reference) <= 1e-12


@pytest.mark.slow
def test_stored_mpmath_grid_is_reproduced():
    for dim, (v, stored) in _mpmath_grid().items():
        fresh = [mpmath_reference.log_conformity_quadrature(dim, x, -1.0 / (dim - 1)) for x in v]
        np.testing.assert_allclose(fresh, stored, rtol=0, atol=1e-12 * np.maximum(1, stored))


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


def test_conformity_at_any_angle_matches_mpmath():
    # Both signs of cos(theta), the peak at the boundary (theta = 0), d = 1, large v.
    for dim, v, theta in [(1, 5.0, 2.0), (6, 20.0, 0.0), (6, 12.0, 2.5), (64, 20.0, math.pi)]:
        reference = mpmath_reference.log_conformity_quadrature(dim, v, math.cos(theta))
        log_rho = np.log(theory.conformity_at_angle(dim, v, theta))
        assert _relative_error(log_rho, reference) <= 1e-12, (dim, v, theta)


# --------------------------------------------------------------------------------------------
# Composition with jit, vmap and grad (issue 20, point 1)
# --------------------------------------------------------------------------------------------


def test_prf_mse_under_jit_and_vmap_matches_eager():
    # The issue's call, then a user's vmap over inputs (PRF and RFF in one function).
    jitted = jax.jit(lambda a, b: theory.prf_mse(a, b, 8, coupling="simplex"))(PRF_X, PRF_Y)
    np.testing.assert_allclose(
        jitted, theory.prf_mse(PRF_X, PRF_Y, 8, coupling="simplex"), rtol=1e-14
    )
    assert jitted.dtype == jnp.float64
    rng = np.random.default_rng(5)
    xs = 0.4 * rng.standard_normal((7, DIM))

    def both(a):
        return jnp.stack(
            [
                theory.prf_mse(a, PRF_Y, 9, coupling="orthogonal"),
                theory.rff_mse(a, RFF_Y, 9, coupling="simplex"),
            ]
        )

    eager = np.stack(
        [
            theory.prf_mse(xs, PRF_Y, 9, coupling="orthogonal"),
            theory.rff_mse(xs, RFF_Y, 9, coupling="simplex"),
        ],
        axis=-1,
    )
    np.testing.assert_allclose(jax.jit(jax.vmap(both))(xs), eager, rtol=1e-13)


def _central_difference(f, t: float, step: float = 1e-5) -> float:
    return (float(f(t + step)) - float(f(t - step))) / (2 * step)


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
def test_prf_mse_gradient_in_temperature_matches_finite_differences(coupling):
    # MSE of the softmax-kernel estimate of exp(x.y / tau) (inputs scaled by 1/sqrt(tau)), the
    # quantity one tunes a temperature on; blocks (6, 3).
    def mse(tau):
        scale = 1.0 / jnp.sqrt(tau)
        return theory.prf_mse(scale * PRF_X, scale * PRF_Y, 9, coupling=coupling, kernel="softmax")

    slope = jax.jit(jax.grad(mse))
    for tau in (0.5, 1.0, 2.0):
        np.testing.assert_allclose(slope(tau), _central_difference(mse, tau), rtol=1e-7)


def test_rff_mse_gap_and_angle_are_differentiable():
    def rff(scale):
        return theory.rff_mse(scale * RFF_X, scale * RFF_Y, 9, coupling="orthogonal") + (
            theory.rff_mse(scale * RFF_X, scale * RFF_Y, 9, coupling="simplex")
        )

    def gap(scale):
        return theory.prf_orthogonality_gap(scale * PRF_X, scale * PRF_Y, DIM)

    def angle(theta):
        return theory.conformity_at_angle(DIM, 2.0, theta)

    for f, t in ((rff, 1.3), (gap, 0.7), (angle, 1.9)):
        np.testing.assert_allclose(jax.jit(jax.grad(f))(t), _central_difference(f, t), rtol=1e-7)
    # At v = 0 (x = -y) the derivatives are finite (no sqrt of v^2 inside).
    grads = jax.grad(lambda a: theory.prf_mse(a, -a, 6, coupling="simplex"))(jnp.asarray(PRF_X))
    assert np.all(np.isfinite(grads))


def test_hybrid_theory_composes_with_jit_and_grad():
    def total(scale):
        x, y = scale * PRF_X, scale * RFF_Y
        return (
            theory.angular_hybrid_mse(x, y, 8, 4, variant="shared")
            + theory.complex_exponential_mse(x, y, jnp.full(DIM, 1.2), 8)
            + theory.angular_hybrid_relative_error(1.0, scale, 8, 4)
        )

    np.testing.assert_allclose(jax.jit(total)(0.9), total(0.9), rtol=1e-14)
    slope = jax.jit(jax.grad(total))(0.9)
    np.testing.assert_allclose(slope, _central_difference(total, 0.9), rtol=1e-7)


def test_float32_without_x64():
    with jax.enable_x64(False):
        value = theory.prf_mse(PRF_X, PRF_Y, 9, coupling="simplex")
        rho = theory.simplex_conformity(DIM, 2.0)
    assert value.dtype == jnp.float32 and rho.dtype == jnp.float32
    np.testing.assert_allclose(
        value, theory.prf_mse(PRF_X, PRF_Y, 9, coupling="simplex"), rtol=1e-5
    )
    np.testing.assert_allclose(rho, theory.simplex_conformity(DIM, 2.0), rtol=1e-5)


def test_simplex_plus_explains_why_it_has_no_closed_form():
    for call in (
        lambda: theory.prf_mse(PRF_X, PRF_Y, 6, coupling="simplex_plus"),
        lambda: theory.conformity("simplex_plus", DIM, 1.0),
    ):
        with pytest.raises(ValueError, match=r"no closed form.*re-optimised for every draw"):
            call()
    assert "re-optimised" in theory.no_closed_form_reason("simplex_plus")
    assert "no closed form" in theory.no_closed_form_reason("halton")
    assert theory.no_closed_form_reason("simplex") == ""
    assert "simplex_plus" not in theory.COUPLINGS


# --------------------------------------------------------------------------------------------
# log 0F1 (moved from experiments/conformity.py)
# --------------------------------------------------------------------------------------------


def test_log_hyp0f1_matches_mpmath_and_scipy_derivative():
    z = np.array([0.0, 1e-3, 0.7, 12.0, 300.0, 1e4])
    for b in (0.5, 3.0, 32.0):
        slope = jax.jit(jax.vmap(jax.grad(functools.partial(theory.log_hyp0f1, b))))
        exact = [float(mpmath_reference.mp.log(mpmath_reference.mp.hyp0f1(b, t))) for t in z]
        np.testing.assert_allclose(theory.log_hyp0f1(b, z), exact, rtol=1e-15, atol=1e-15)
        expected = special.hyp0f1(b + 1, z) / (b * special.hyp0f1(b, z))
        np.testing.assert_allclose(slope(jnp.asarray(z)), expected, rtol=1e-12)
    # Where 0F1 itself overflows (log 0F1 ~ 2 sqrt(z) = 2000): against the exponentially scaled
    # Bessel function, 0F1(; b; z) = Gamma(b) z^((1-b)/2) I_{b-1}(2 sqrt(z)).
    b, z = 2.5, 1e6
    expected = (
        math.lgamma(b) + 0.5 * (1 - b) * math.log(z) + math.log(special.ive(b - 1, 2e3)) + 2e3
    )
    np.testing.assert_allclose(theory.log_hyp0f1(b, z), expected, rtol=1e-14)
    with pytest.raises(ValueError, match="z must lie in"):
        theory.log_hyp0f1(1.0, -1.0)
    with pytest.raises(ValueError, match="b must be > 0"):
        theory.log_hyp0f1(0.0, 1.0)


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def test_bad_inputs_raise():
    x, y = PRF_X, PRF_Y
    with pytest.raises(ValueError, match="coupling"):
        theory.conformity("circulant", DIM, 1.0)
    with pytest.raises(ValueError, match="'gaussian', 'orthogonal', 'simplex'"):
        theory.prf_mse(x, y, 6, coupling="iid")
    with pytest.raises(ValueError, match="kernel"):
        theory.prf_mse(x, y, 6, kernel="laplace")
    with pytest.raises(ValueError, match="embedding"):
        theory.rff_mse(x, y, 6, embedding="complex")
    with pytest.raises(ValueError, match="only supports coupling='gaussian'"):
        theory.rff_mse(x, y, 6, coupling="orthogonal", embedding="cosine_bias")
    with pytest.raises(ValueError, match="dim"):
        theory.orthogonal_conformity(0, 1.0)
    with pytest.raises(ValueError, match="dim"):
        theory.simplex_conformity(1, 1.0)
    with pytest.raises(TypeError, match="dim"):
        theory.orthogonal_conformity(2.5, 1.0)
    with pytest.raises(ValueError, match="num_features"):
        theory.prf_mse(x, y, 0)
    with pytest.raises(ValueError, match="num_features"):
        theory.block_sizes(DIM, 0)
    with pytest.raises(ValueError, match="v must contain only finite"):
        theory.simplex_conformity(DIM, np.nan)
    with pytest.raises(ValueError, match="v must contain only finite"):
        theory.iid_conformity(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="theta"):
        theory.conformity_at_angle(DIM, 1.0, np.nan)
    with pytest.raises(ValueError, match="x must contain only finite"):
        theory.prf_mse(np.full(DIM, np.nan), y, 6)
    with pytest.raises(ValueError, match="same last axis"):
        theory.prf_mse(x, y[:4], 6)
    with pytest.raises(ValueError, match="same last axis"):
        theory.rff_mse(x[:5], y, 6)
    with pytest.raises(TypeError, match="x must be a floating array"):
        theory.prf_mse(np.ones(DIM, dtype=int), y, 6)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.prf_orthogonality_gap(x, y, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.rff_orthogonality_gap(1.0, DIM, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.rff_orthogonal_mse_ratio_asymptotic(1.0, DIM, DIM + 1)
    with pytest.raises(ValueError, match="num_features <= dim"):
        theory.small_v_prefactor("simplex", DIM, DIM + 1)
    with pytest.raises(ValueError, match="z must contain only finite"):
        theory.rff_orthogonality_gap(np.nan, DIM, DIM)
    with pytest.raises(TypeError, match="block_sizes"):
        theory.effective_conformity(1.0, 1.0, ())
    with pytest.raises(ValueError, match="block_sizes"):
        theory.effective_conformity(1.0, 1.0, (3, 0))


def test_monte_carlo_bad_inputs_raise():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="unknown coupling"):
        theory.monte_carlo_conformity(key, "nope", PRF_X, PRF_Y, 6, num_samples=10)
    with pytest.raises(ValueError, match="num_features"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X, PRF_Y, 1, num_samples=10)
    with pytest.raises(ValueError, match="num_samples"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X, PRF_Y, 6, num_samples=1)
    with pytest.raises(ValueError, match="shape"):
        theory.monte_carlo_conformity(key, "gaussian", PRF_X[None], PRF_Y, 6, num_samples=10)
    with pytest.raises(TypeError, match="key"):
        theory.monte_carlo_conformity(0, "gaussian", PRF_X, PRF_Y, 6, num_samples=10)
    with pytest.raises(TypeError, match="sampler"):
        theory.monte_carlo_conformity(key, 3, PRF_X, PRF_Y, 6, num_samples=10)
