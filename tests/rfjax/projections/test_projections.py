"""Couplings: marginal law of rows, within-block geometry, block independence, determinism."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rfjax import projections
from tests.support.representatives import representatives

ALL = projections.marginally_exact()  # approximate ones: test_structured_projections
COUPLED = ("orthogonal", "simplex", "simplex_plus")
# The default suite's couplings for the per-coupling checks (CI's runs every one): i.i.d., the
# two coupled ones of the SimRF paper and a structured one.
REPRESENTATIVE = representatives(ALL, ("gaussian", "orthogonal", "simplex", "circulant"))
NUM_DRAWS = 4000


def draw_many(name, dim, num_features, num_draws=NUM_DRAWS, seed=0, **kwargs):
    """Weights of ``num_draws`` independent projections, shape (num_draws, m, d), float64."""
    sampler = projections.get(name)
    keys = jax.random.split(jax.random.key(seed), num_draws)
    batch = jax.vmap(lambda k: sampler(k, dim, num_features, **kwargs).matrix())(keys)
    return np.asarray(batch, dtype=np.float64)


def within_se(samples, truth, num_se=4.0):
    """|mean - truth| <= num_se standard errors, elementwise over the trailing axes."""
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / math.sqrt(samples.shape[0])
    return np.abs(mean - truth) <= num_se * se, mean, se


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_row_norms_follow_chi_d(name):
    dim, m = 5, 7
    weights = draw_many(name, dim, m, num_draws=1500)
    for row in (0, m - 1):  # one sample per independent draw: a clean i.i.d. sample per row
        norms = np.linalg.norm(weights[:, row], axis=-1)
        result = stats.kstest(norms, stats.chi(dim).cdf)
        assert result.pvalue > 1e-3, (name, row, result)


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_rows_are_isotropic(name):
    """Mean 0 and second moments E[w w^T] = I, for the first and last row of a block."""
    dim = 4
    weights = draw_many(name, dim, dim)
    for row in (0, dim - 1):
        w = weights[:, row]
        ok, mean, se = within_se(w, np.zeros(dim))
        assert ok.all(), (name, row, mean, se)
        second = w[:, :, None] * w[:, None, :]
        ok, mean, se = within_se(second, np.eye(dim))
        assert ok.all(), (name, row, mean, se)


@pytest.mark.parametrize("name", ALL)
def test_rows_have_gaussian_moment_generating_function(name):
    """E[exp(w.v)] = exp(|v|^2/2): the check that catches QR without the sign fix (15% bias)."""
    dim = 4
    v = np.zeros(dim)
    v[0] = 0.8
    weights = draw_many(name, dim, dim)
    for row in range(dim):
        ok, mean, se = within_se(np.exp(weights[:, row] @ v), math.exp(0.32))
        assert ok, (name, row, mean, se)


def unit_rows(weights):
    return weights / np.linalg.norm(weights, axis=-1, keepdims=True)


def test_orthogonal_blocks_are_orthogonal():
    weights = np.asarray(projections.orthogonal(jax.random.key(3), 6, 15).matrix(), np.float64)
    for start in (0, 6, 12):
        block = unit_rows(weights[start : start + 6])
        np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=2e-6)


@pytest.mark.parametrize("dim", [2, 3, 6, 17])
def test_simplex_block_angles(dim):
    weights = np.asarray(projections.simplex(jax.random.key(4), dim, 2 * dim).matrix(), np.float64)
    expected = np.full((dim, dim), -1.0 / (dim - 1))
    np.fill_diagonal(expected, 1.0)
    for start in (0, dim):
        block = unit_rows(weights[start : start + dim])
        np.testing.assert_allclose(block @ block.T, expected, atol=2e-6)


def test_simplex_directions_match_equation_9():
    dim = 6
    directions = np.asarray(projections.simplex_directions(dim), np.float64)
    ones = np.ones(dim)
    ones[-1] = 0.0
    for i in range(dim - 1):
        expected = math.sqrt(dim / (dim - 1)) * np.eye(dim)[i]
        expected -= (math.sqrt(dim) + 1) / (dim - 1) ** 1.5 * ones
        np.testing.assert_allclose(directions[i], expected, atol=1e-6)
    np.testing.assert_allclose(directions[-1], ones / math.sqrt(dim - 1), atol=1e-6)
    np.testing.assert_allclose(directions.sum(axis=0), 0.0, atol=1e-6)


def test_apply_simplex_is_the_dense_product():
    dim = 9
    z = jax.random.normal(jax.random.key(5), (3, dim))
    dense = np.asarray(projections.simplex_directions(dim)) @ np.asarray(z).T
    np.testing.assert_allclose(np.asarray(projections.apply_simplex(z)).T, dense, atol=1e-5)


def test_partial_simplex_block_is_an_r_vertex_simplex():
    dim, m = 6, 10
    weights = projections.simplex(jax.random.key(6), dim, m, partial_block="simplex").matrix()
    block = unit_rows(np.asarray(weights, np.float64)[6:])
    expected = np.full((4, 4), -1.0 / 3.0)
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(block @ block.T, expected, atol=2e-6)


def _cosines(weights):
    unit = unit_rows(weights)
    return np.einsum("nid,njd->nij", unit, unit)


FEW_ROWS = representatives(
    [
        ("orthogonal", {}),
        ("simplex", {}),
        ("simplex", {"partial_block": "simplex"}),
        ("norm_coupled", {}),
    ],
    ("orthogonal", "simplex"),
    key=lambda case: case[0] if not case[1] else f"{case[0]} {case[1]}",
    unpack=True,
)


@pytest.mark.parametrize(("name", "kwargs"), FEW_ROWS)
def test_fewer_rows_than_dim_have_the_law_of_a_partial_block(name, kwargs):
    """m < d draws only the m rows (a d x m QR, not a d x d rotation); they keep the block's
    geometry exactly and the law of the first m rows of a full block (the m = d draw, unchanged),
    compared on the chi_d norms, the Gaussian MGF and a joint moment of two rows."""
    dim, m, draws = 6, 3, 6000
    few = draw_many(name, dim, m, num_draws=draws, seed=1, **kwargs)
    # Within a block: orthogonal rows, a d-simplex's first m vertices, or an m-vertex simplex.
    cosine = {"orthogonal": 0.0, "norm_coupled": 0.0, "simplex": -1.0 / (dim - 1)}[name]
    cosine = -1.0 / (m - 1) if kwargs else cosine
    expected = np.full((m, m), cosine)
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(_cosines(few), np.broadcast_to(expected, (draws, m, m)), atol=2e-5)
    norms = np.linalg.norm(few[:, 0], axis=-1)
    assert stats.kstest(norms, stats.chi(dim).cdf).pvalue > 1e-3
    v = np.full(dim, 0.3)
    ok, mean, se = within_se(np.exp(few[:, 0] @ v), math.exp(v @ v / 2))
    assert ok, (mean, se)
    if kwargs:  # the r-vertex simplex has no full-block counterpart
        return
    full = draw_many(name, dim, dim, num_draws=draws, seed=2)[:, :m]
    joint = [(w[:, 0] @ v) ** 2 * (w[:, 1] @ v) ** 2 for w in (few, full)]
    difference = joint[0].mean() - joint[1].mean()
    se = math.sqrt(sum(j.var(ddof=1) / draws for j in joint))
    assert abs(difference) <= 4 * se, (difference, se)


def test_many_dimensions_and_few_rows_need_no_d_by_d_rotation():
    """d = 10^5, m = 10: the d x d rotation was 40 GB in float32 (280 GB asked for with its
    QR); the m rows alone are 4 MB."""
    for sampler in (projections.orthogonal, projections.simplex):
        weights = np.asarray(sampler(jax.random.key(9), 100_000, 10).matrix(), np.float64)
        norms = np.linalg.norm(weights, axis=-1)
        assert weights.shape == (10, 100_000) and np.all(np.abs(norms / 316.2 - 1) < 0.02)


def test_simplex_plus_closes_the_loop_when_the_norms_allow_it():
    """Eq. 16 fixed point when max_i |w_i| <= sum of the others: sum_i w_i = 0 per block."""
    dim = 6
    weights = draw_many("simplex_plus", dim, dim, num_draws=200, seed=7)
    norms = np.linalg.norm(weights, axis=-1)
    closed = norms.max(axis=1) <= norms.sum(axis=1) - norms.max(axis=1)
    resultant = np.linalg.norm(weights.sum(axis=1), axis=-1) / norms.sum(axis=1)
    assert closed.sum() >= 190
    assert np.all(resultant[closed] < 1e-5)


def test_simplex_plus_opposes_a_dominant_norm_to_all_others():
    """Eq. 16 when one norm exceeds the sum of the others: it is anti-aligned with the rest."""
    from rfjax.projections._dense import _gauss_seidel_sweeps

    norms = jnp.array([10.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    directions = _gauss_seidel_sweeps(norms, projections.simplex_directions(6), 5)
    cosines = np.asarray(directions[1:] @ directions[0])
    np.testing.assert_allclose(cosines, -1.0, atol=1e-5)


def test_simplex_plus_with_no_sweeps_is_simplex():
    key = jax.random.key(8)
    a = projections.simplex_plus(key, 5, 10, num_sweeps=0).matrix()
    b = projections.simplex(key, 5, 10).matrix()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("name", COUPLED)
def test_blocks_are_independent(name):
    """Rows of different blocks: E[cos^2] = 1/d as for independent rows; norms uncorrelated."""
    dim = 4
    weights = draw_many(name, dim, 2 * dim, seed=9)
    first, second = weights[:, 0], weights[:, dim]
    cos_sq = np.sum(unit_rows(first) * unit_rows(second), axis=-1) ** 2
    ok, mean, se = within_se(cos_sq, 1.0 / dim)
    assert ok, (name, mean, se)
    norm_a, norm_b = np.linalg.norm(first, axis=-1), np.linalg.norm(second, axis=-1)
    product = (norm_a - norm_a.mean()) * (norm_b - norm_b.mean())
    ok, mean, se = within_se(product, 0.0)
    assert ok, (name, mean, se)


@pytest.mark.parametrize("name", COUPLED)
def test_within_block_rows_are_coupled(name):
    """The same statistic inside a block is far from 1/d, so the independence test can fail."""
    dim = 4
    weights = draw_many(name, dim, dim, seed=10)
    cos_sq = np.sum(unit_rows(weights[:, 0]) * unit_rows(weights[:, 1]), axis=-1) ** 2
    ok, _, _ = within_se(cos_sq, 1.0 / dim)
    assert not ok


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_shapes_block_sizes_and_application(name):
    projection = projections.get(name)(jax.random.key(11), 6, 15)
    assert (projection.dim, projection.num_features) == (6, 15)
    assert sum(projection.block_sizes()) == 15
    x = jax.random.normal(jax.random.key(12), (2, 3, 6))
    np.testing.assert_allclose(projection(x), x @ projection.matrix().T, rtol=1e-5, atol=1e-5)


# Rows per independent block, which polynomial features and the conformity theory read: one
# for i.i.d. rows, d for rotations, p = 8 for the HD products (d = 6), all m for Halton's shared
# shift (``gaussian`` with d and ``halton`` with 1 passed every other test).
BLOCK_SIZES = {
    "gaussian": 1,
    "orthogonal": 6,
    "simplex": 6,
    "simplex_plus": 6,
    "norm_coupled": 6,
    "givens": 6,
    "hd_orthogonal": 8,
    "fast_simplex": 8,
    "halton": 15,
}


@pytest.mark.parametrize(("name", "block_size"), BLOCK_SIZES.items())
def test_block_size_is_the_coupled_unit(name, block_size):
    sampler = projections.get(name)
    shapes = jax.eval_shape(lambda k: sampler(k, 6, 15), jax.random.key(0))  # nothing compiled
    assert shapes.block_size == block_size


@pytest.mark.parametrize("name", ALL)
def test_same_key_same_draw_other_key_other_draw(name):
    sampler = projections.get(name)
    a = sampler(jax.random.key(13), 5, 9).matrix()
    b = sampler(jax.random.key(13), 5, 9).matrix()
    c = sampler(jax.random.key(14), 5, 9).matrix()
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))


@pytest.mark.parametrize("name", ALL)
def test_no_key_reuse_inside_samplers(name):
    with jax.debug_key_reuse(True):
        projections.get(name)(jax.random.key(15), 5, 12)


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_jit_vmap_and_dtypes(name):
    sampler = projections.get(name)
    jitted = jax.jit(lambda k: sampler(k, 4, 6))(jax.random.key(16))
    eager = sampler(jax.random.key(16), 4, 6)
    np.testing.assert_allclose(jitted.matrix(), eager.matrix(), rtol=1e-6, atol=1e-6)
    assert sampler(jax.random.key(16), 4, 6, dtype=jnp.bfloat16).matrix().dtype == jnp.bfloat16
    with jax.enable_x64(True):
        assert sampler(jax.random.key(16), 4, 6, dtype=jnp.float64).matrix().dtype == jnp.float64


def test_halton_points_are_the_halton_sequence():
    from rfjax.projections._halton import halton_points

    points = halton_points(4, 2)
    np.testing.assert_allclose(points[:, 0], [1 / 2, 1 / 4, 3 / 4, 1 / 8])
    np.testing.assert_allclose(points[:, 1], [1 / 3, 2 / 3, 1 / 9, 4 / 9])


def test_halton_in_float32_has_symmetric_tails_over_ten_million_coordinates():
    """A shifted point that rounds to 0 was clipped to the smallest normal number, a point mass
    at Phi^{-1}(1.2e-38) = -12.95 (about once in 5 * 10^6 coordinates), while the top stopped at
    +5.29: the clustered hybrid's mean over 10^6 Halton draws was 3,054 times the kernel."""
    from rfjax.projections._halton import uniform_resolution

    draw = jax.jit(jax.vmap(lambda key: projections.halton(key, 10, 10).matrix()))
    weights = draw(jax.random.split(jax.random.key(44), 100_000))  # 10^7 coordinates
    assert weights.dtype == jnp.float32 and weights.size == 10**7
    bound = -float(jax.scipy.special.ndtri(jnp.float32(uniform_resolution(jnp.float32))))
    assert bound == pytest.approx(5.2947, abs=1e-4)
    assert float(jnp.max(weights)) <= bound and float(jnp.min(weights)) >= -bound
    # Both tails reach the cut in these draws (clipped zeros below, the top grid point above).
    assert float(jnp.min(weights)) == -bound and float(jnp.max(weights)) == bound


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dim": 0}, ValueError, "dim"),
        ({"dim": 2.5}, TypeError, "dim"),
        ({"num_features": 0}, ValueError, "num_features"),
        ({"dtype": jnp.int32}, TypeError, "dtype"),
        ({"key": 3}, TypeError, "key"),
    ],
)
@pytest.mark.parametrize("name", projections.available())
def test_bad_sampler_arguments(name, kwargs, error, match):
    arguments = {"key": jax.random.key(0), "dim": 4, "num_features": 4, **kwargs}
    with pytest.raises(error, match=match):
        projections.get(name)(
            arguments.pop("key"), arguments.pop("dim"), arguments.pop("num_features"), **arguments
        )


@pytest.mark.parametrize("name", ["simplex", "simplex_plus"])
def test_simplex_needs_dim_two(name):
    with pytest.raises(ValueError, match="dim must be an integer >= 2"):
        projections.get(name)(jax.random.key(0), 1, 4)


def test_bad_options_and_inputs():
    with pytest.raises(ValueError, match="partial_block"):
        projections.simplex(jax.random.key(0), 4, 6, partial_block="pad")
    with pytest.raises(ValueError, match="num_sweeps"):
        projections.simplex_plus(jax.random.key(0), 4, 6, num_sweeps=-1)
    with pytest.raises(ValueError, match="unknown coupling 'sobol'"):
        projections.get("sobol")
    projection = projections.gaussian(jax.random.key(0), 4, 6)
    with pytest.raises(ValueError, match="x must have last axis of size dim=4"):
        projection(jnp.ones((2, 5)))
    with pytest.raises(TypeError, match="x must be a floating array"):
        projection(jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="x must contain only finite values"):
        projection(jnp.array([[0.0, jnp.nan, 1.0, 2.0]]))
    jax.jit(lambda p, x: p(x))(projection, jnp.ones((2, 4)))  # traced values: not inspected


def test_registry_separates_exact_and_approximate_couplings():
    approximate = set(projections.available()) - set(projections.marginally_exact())
    assert approximate == {"hd_orthogonal", "fast_simplex", "givens"}
    assert {"gaussian", "orthogonal", "simplex", "simplex_plus", "halton"} <= set(ALL)


def test_registry_metadata_min_dim_and_labels(monkeypatch):
    # min_dim is what each sampler enforces: the registry's value is the sampler's own bound.
    for name in projections.available():
        entry = projections.info(name)
        assert entry.sampler is projections.get(name) and entry.label
        if entry.min_dim > 1:
            with pytest.raises(ValueError, match="dim"):
                entry.sampler(jax.random.key(0), entry.min_dim - 1, 4)
        entry.sampler(jax.random.key(0), entry.min_dim, 4)
    assert {n for n in projections.available() if projections.info(n).min_dim == 2} == {
        "simplex",
        "simplex_plus",
        "fast_simplex",
    }
    registry = projections._REGISTRY
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    projections.register("iid_again", projections.gaussian, exact_marginals=False, label="IID'")
    assert "iid_again" not in projections.marginally_exact()
    assert projections.info("iid_again").label == "IID'"
    with pytest.raises(ValueError, match="already registered"):
        projections.register("iid_again", projections.gaussian, label="x")
    with pytest.raises(ValueError, match="min_dim"):
        projections.register("other", projections.gaussian, min_dim=0, label="x")
    with pytest.raises(TypeError, match="label"):
        projections.register("other", projections.gaussian, label="")
    with pytest.raises(ValueError, match="unknown coupling 'nope'; available: gaussian"):
        projections.info("nope")
