"""Tests for rfjax.theory: reference values, series vs quadrature, identities, Monte Carlo.

Statistical checks use fixed keys and pass when |measured - predicted| <= 4 standard errors.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import projections, theory

NSIG = 4.0
NUM_DRAWS = 40_000
DIM = 6


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
# Reference values (EQUATIONS.md Part 5) and the small-v prefactor (Sec. 5.1)
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
    v = np.array([0.0, 0.3, 0.5, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(
        theory.simplex_conformity(dim, v),
        theory.conformity_at_angle(dim, v, math.acos(-1 / (dim - 1))),
        rtol=1e-9,
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
    quad_sim = theory.conformity_at_angle(dim, v, math.acos(-1 / (dim - 1)))
    for rho in (rho_orf, rho_sim, quad_sim):
        assert np.all(np.isfinite(rho))
    np.testing.assert_allclose(rho_sim, quad_sim, rtol=1e-9)
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
    # EQUATIONS.md (not in paper): MSE/MSE_IID at z = 1, m = d: ORF 0.300 vs SimRF 0.465 (d = 6).
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
@pytest.mark.parametrize("num_features", [6, 9])
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
    # psi is worse than phi for the Gaussian kernel (EQUATIONS.md Eq. 3 note)
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
    # conformity at theta = arccos(-1/2) (EQUATIONS.md: 1.689 at d = 6, v = 1).
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
