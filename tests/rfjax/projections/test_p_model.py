"""The P-model abstraction: dense and structured P_i, the paper's conditions, new families.

The marginal laws of the registered families (KS of chi norms, isotropy, Gaussian MGF) are in
test_projections.py (default options) and test_structured_projections.py (preprocessing, ranks).
"""

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rfjax import projections
from rfjax.projections import PModel
from tests.support.representatives import representatives

FAMILIES = {
    "circulant": projections.Circulant(),
    "skew_circulant": projections.SkewCirculant(),
    "toeplitz": projections.Toeplitz(),
    "hankel": projections.Hankel(),
    "low_displacement_rank": projections.LowDisplacementRank(rank=3),
    "independent_rows": projections.IndependentRows(),
}


def cyclic_matrices(n, rows):
    """P_i of the circulant P-model (Eq. 8): (P_i)_sj = 1 iff s = (j - i) mod n."""
    return np.stack([np.roll(np.eye(n), i, axis=1) for i in range(rows)])


@pytest.mark.parametrize("name", FAMILIES)
def test_block_matrices_rebuild_the_block_and_meet_both_conditions(name):
    """A_ij = sum_s g_s (P_i)_sj for the P_i read off the fast product (any family)."""
    model = FAMILIES[name]
    projection = projections.p_model(jax.random.key(1), 6, 6, generator=model)
    matrices = projection.block_matrices()
    assert matrices.shape == (6, model.budget_size(6), 6)
    assert projections.p_model_violations(matrices) == ()
    budget = np.asarray(projection.budget[0], np.float64)
    rebuilt = np.einsum("s,isj->ij", budget, matrices)
    np.testing.assert_allclose(rebuilt, np.asarray(projection.matrix()), atol=2e-5)


def test_dense_matrices_and_the_fast_circulant_are_the_same_projection():
    n, rows = 7, 4
    dense = projections.p_model(jax.random.key(2), n, 10, matrices=cyclic_matrices(n, rows))
    assert dense.block_sizes() == (4, 4, 2)  # k = 4 rows per block, 3 independent budgets
    fast = projections.p_model(
        jax.random.key(2), n, 4, generator=projections.Circulant(), budget=dense.budget[:1]
    )
    np.testing.assert_allclose(fast.matrix(), dense.matrix()[:4], atol=1e-6)
    np.testing.assert_allclose(dense.block_matrices(2), cyclic_matrices(n, rows))
    x = jax.random.normal(jax.random.key(3), (3, n))
    np.testing.assert_allclose(dense(x), x @ dense.matrix().T, atol=1e-5)


def test_a_dense_p_model_with_orthonormal_columns_has_exactly_gaussian_rows():
    """P_i with orthonormal columns (t = 6 > n = 3, not 0/1): rows N(0, I_3), KS and moments."""
    rng = np.random.default_rng(0)
    matrices = np.stack([np.linalg.qr(rng.normal(size=(6, 3)))[0] for _ in range(2)])
    keys = jax.random.split(jax.random.key(4), 3000)
    weights = jax.vmap(lambda k: projections.p_model(k, 3, 2, matrices=matrices).matrix())(keys)
    weights = np.asarray(weights, np.float64)
    for row in (0, 1):
        w = weights[:, row]
        assert stats.kstest(np.linalg.norm(w, axis=-1), stats.chi(3).cdf).pvalue > 1e-3
        second = (w[:, :, None] * w[:, None, :]).reshape(len(w), -1)
        se = second.std(axis=0, ddof=1) / math.sqrt(len(w))
        assert np.all(np.abs(second.mean(axis=0) - np.eye(3).ravel()) <= 4 * se)


def test_violations_name_the_failed_condition():
    n = 4
    assert projections.p_model_violations(cyclic_matrices(n, 3)) == ()
    scaled = cyclic_matrices(n, 3)
    scaled[1] *= 2.0
    (message,) = projections.p_model_violations(scaled)
    assert message.startswith("normalisation (unit-norm columns) fails: column")
    assert "of P_1 has norm 2" in message
    mixed = cyclic_matrices(n, 2)
    mixed[0, :, 1] = (mixed[0, :, 0] + mixed[0, :, 1]) / math.sqrt(2)  # unit norm, not orthogonal
    (message,) = projections.p_model_violations(mixed)
    assert "orthogonality condition (Eq. 14) fails: columns 0 and 1 of P_0" in message
    both = mixed.copy()
    both[1] *= 3.0
    assert len(projections.p_model_violations(both)) == 2
    with pytest.raises(ValueError, match="matrices is not a valid P-model: normalisation"):
        projections.p_model(jax.random.key(0), n, 3, matrices=scaled)
    with pytest.raises(ValueError, match="orthogonality condition"):
        projections.p_model(jax.random.key(0), n, 2, matrices=mixed)


@pytest.mark.parametrize(
    ("inner", "stretch"), [(3e-4, 0.0), (0.0, 3e-4), (1.5e-4, 0.0), (0.0, 1.5e-4), (5e-5, 5e-5)]
)
def test_violations_hold_to_the_tolerance(inner, stretch):
    """The default tolerance (1e-4) is the bound: columns with inner product 3e-4 or 1.5e-4 (unit
    norms) or a norm 1 + 3e-4 or 1 + 1.5e-4 fail, both at 5e-5 pass (a bound of 10 tolerances
    passed every test, and a bound of 2 tolerances on the norms passed the 3e-4 cases)."""
    matrices = np.eye(3)[None].copy()
    matrices[0, :, 1] = [inner, math.sqrt(1 - inner**2), 0.0]
    matrices[0, :, 2] *= 1 + stretch
    failed = [v.split()[0] for v in projections.p_model_violations(matrices)]
    expected = ["normalisation"] * (stretch > 1e-4) + ["orthogonality"] * (inner > 1e-4)
    assert failed == expected


@pytest.mark.parametrize("tolerance", [math.nan, math.inf, 0.0, -1.0])
def test_violations_refuse_a_tolerance_that_is_not_finite_and_positive(tolerance):
    """A NaN tolerance passed every P-model (no comparison with NaN is true), -1 failed all."""
    with pytest.raises(ValueError, match="tolerance must be"):
        projections.p_model_violations(np.ones((1, 2, 2)), tolerance=tolerance)
    with pytest.raises(TypeError, match="tolerance must be a real number"):
        projections.p_model_violations(np.eye(2)[None], tolerance="1e-4")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_dense_matrices_of_any_floating_dtype_are_taken(dtype):
    """bfloat16 P_i were refused as "matrices must be a floating array, got dtype bfloat16"."""
    matrices = jnp.asarray(cyclic_matrices(4, 3), dtype)
    projection = projections.p_model(jax.random.key(0), 4, 3, matrices=matrices)
    reference = projections.p_model(jax.random.key(0), 4, 3, matrices=cyclic_matrices(4, 3))
    np.testing.assert_array_equal(projection.matrix(), reference.matrix())
    with pytest.raises(TypeError, match="matrices must be a floating array, got dtype int32"):
        projections.p_model(jax.random.key(0), 4, 3, matrices=np.ones((3, 4, 4), np.int32))


def test_block_matrices_past_the_size_cap_are_refused_before_compiling():
    """d = 4096: a circulant's P_i are 4096^3 float64 entries (512 GiB); reading them off
    ``apply`` aborted the interpreter (XLA's allocation, a failed check) instead of raising."""
    projection = projections.circulant(jax.random.key(0), 4096, 8)
    with pytest.raises(ValueError, match=r"n=4096 implies the P-model matrices .*\(512 GiB\)"):
        projection.block_matrices()
    """sum_r Z_{-1}(h_r)^T Z_{-1}(h_r) = I after the rescaling; unit-norm h alone fail Eq. 14."""
    n = 6
    with jax.enable_x64(True):
        h = jax.random.normal(jax.random.key(5), (3, n), jnp.float64)
        # Each compiled once, not op by op.
        rescaled = np.asarray(jax.jit(projections._p_model.orthonormalise_skew_circulants)(h))
        eye = np.eye(n)
        convolution = jax.jit(projections._p_model.negacyclic_convolution)
        z = [np.asarray(convolution(v, jnp.asarray(eye)).T) for v in rescaled]
        np.testing.assert_allclose(sum(m.T @ m for m in z), eye, atol=1e-12)
    naive = np.asarray(h) / np.linalg.norm(np.asarray(h))  # the paper's normalisation only
    model = projections.LowDisplacementRank(rank=3)
    (message,) = projections.p_model_violations(model.matrices(n, jnp.asarray(naive[None])))
    assert message.startswith("orthogonality condition (Eq. 14) fails")


@dataclasses.dataclass(frozen=True)
class SignFlippedCirculant(PModel):
    """A new family in four lines: the circulant with every other column negated."""

    name: ClassVar[str] = "sign_flipped_circulant"

    def budget_size(self, n):
        return n

    def apply(self, budget, x, parameters):
        signs = (-1.0) ** jnp.arange(x.shape[-1])
        return projections.Circulant().apply(budget, x * signs, parameters)


@dataclasses.dataclass(frozen=True)
class RepeatedColumn(PModel):
    """A broken family: every column reads g_0 (unit norm, not orthogonal)."""

    name: ClassVar[str] = "repeated_column"

    def budget_size(self, n):
        return n

    def apply(self, budget, x, parameters):
        total = jnp.sum(x, axis=-1)[..., None, None] * budget[:, :1]  # (..., B, 1)
        return jnp.broadcast_to(total, (*x.shape[:-1], budget.shape[0], x.shape[-1]))


def test_a_new_family_is_one_p_model_definition():
    projection = projections.p_model(jax.random.key(6), 5, 5, generator=SignFlippedCirculant())
    weights = np.asarray(projection.matrix())
    budget = np.asarray(projection.budget[0])
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    np.testing.assert_allclose(weights, budget[(j - i) % 5] * (-1.0) ** j, atol=1e-6)
    with pytest.raises(ValueError, match=r"RepeatedColumn\(\) \(checked at n = 5\) is not a valid"):
        projections.p_model(jax.random.key(6), 5, 5, generator=RepeatedColumn())


def test_bad_arguments():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="exactly one of matrices"):
        projections.p_model(key, 4, 4)
    with pytest.raises(ValueError, match="exactly one of matrices"):
        projections.p_model(
            key, 4, 4, matrices=cyclic_matrices(4, 4), generator=projections.Circulant()
        )
    with pytest.raises(TypeError, match=r"generator must be a rfjax\.projections\.PModel"):
        projections.p_model(key, 4, 4, generator="circulant")
    with pytest.raises(ValueError, match="block input size n = 8"):
        projections.p_model(key, 5, 4, matrices=cyclic_matrices(5, 4), preprocess=True)
    with pytest.raises(TypeError, match="matrices must be a floating array"):
        projections.p_model(key, 4, 4, matrices=np.eye(4, dtype=int)[None])
    with pytest.raises(ValueError, match=r"budget must have shape \(num_blocks, t\) = \(2, 4\)"):
        projections.p_model(key, 4, 8, generator=projections.Circulant(), budget=jnp.zeros((1, 4)))
    with pytest.raises(TypeError, match="budget must have dtype float32"):
        projections.p_model(key, 4, 4, generator=projections.Circulant(), budget=np.zeros((1, 4)))
    with pytest.raises(ValueError, match="budget must contain only finite values"):
        projections.p_model(
            key, 4, 4, generator=projections.Circulant(), budget=jnp.full((1, 4), jnp.nan)
        )
    with pytest.raises(ValueError, match="rank must be an integer >= 1, got 0"):
        projections.low_displacement_rank(key, 4, 4, rank=0)
    # rank = 1000 at dim 3 was accepted (rank = 10^6 asked for 19.6 PB in the family check).
    with pytest.raises(ValueError, match=r"rank=5 must be <= n = 4, the block input size"):
        projections.low_displacement_rank(key, 4, 4, rank=5)
    projections.low_displacement_rank(key, 3, 4, rank=4, preprocess=True)  # n = p = 4
    with pytest.raises(ValueError, match="block must be < 1"):
        projections.circulant(key, 4, 4).block_matrices(1)


FFT_FAMILIES = [name for name, model in FAMILIES.items() if model.row_workspace(8) > 0]


@pytest.mark.parametrize(  # one row-block path for every family: a circulant and a sum of ranks
    "name", representatives(FFT_FAMILIES, ["circulant", "low_displacement_rank"])
)
def test_a_large_batch_is_applied_in_row_blocks_on_cpu_and_at_once_elsewhere(name, monkeypatch):
    """Past ``ROW_BLOCK_ENTRIES`` the inputs go through the FFTs 16 rows at a time on CPU (a
    ``lax.map``; 111 rows leave a short last block) with the values and gradients of the whole
    batch at once (to a few roundings: the FFTs' batch sizes differ); a NaN stays in its row;
    compiled for a GPU (an abstract H100) the batch goes at once."""
    from rfjax.projections import _p_model

    projection = projections.p_model(jax.random.key(3), 12, 20, generator=FAMILIES[name])
    x = jax.random.normal(jax.random.key(4), (3, 37, 12))

    def loss(x, apply):
        return jnp.sum(jnp.sin(apply(x)))

    def values_and_gradients():  # traced afresh: ROW_BLOCK_ENTRIES is read when tracing
        apply = jax.jit(lambda v: projection._apply_unjitted(v))
        return apply, apply(x), jax.grad(loss)(x, apply)

    whole, at_once, grad_at_once = values_and_gradients()
    assert "while" not in whole.lower(x).as_text()
    per_row = projection.model.row_workspace(projection.block_dim) * projection.budget.shape[0]
    monkeypatch.setattr(_p_model, "ROW_BLOCK_ENTRIES", 16 * per_row)
    assert projection.rows_per_block == 16
    blocked, values, grad = values_and_gradients()
    assert "while" in blocked.lower(x).as_text()
    roundings = 16 * np.finfo(np.float32).eps
    for got, want in [(values, at_once), (grad, grad_at_once)]:
        np.testing.assert_allclose(got, want, rtol=0, atol=roundings * np.abs(want).max())
    out = np.asarray(blocked(x.at[1, 5, 0].set(jnp.nan)))
    assert np.isnan(out[1, 5]).all() and np.isfinite(np.delete(out.reshape(111, 20), 42, 0)).all()
    h100 = jax.sharding.AbstractDevice(
        device_kind="NVIDIA H100 80GB HBM3", platform="gpu", num_cores=132
    )
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=h100)):
        lowered = jax.jit(projection._apply_unjitted).trace(x).lower(lowering_platforms=("cuda",))
    assert "while" not in lowered.as_text()


def test_matrix_product_families_are_not_blocked():
    projection = projections.p_model(
        jax.random.key(5), 6, 6, generator=FAMILIES["independent_rows"]
    )
    assert projection.rows_per_block is None
    assert "while" not in jax.jit(projection._apply_unjitted).lower(jnp.ones((4096, 6))).as_text()


def unit_shift(f, n):
    """Z_f: ones below the diagonal and f in the top-right corner (Z_f(v) = sum_k v_k Z_f^k)."""
    shift = np.eye(n, k=-1)
    shift[0, -1] = f
    return shift


# (family, f of the left operator, f of the right operator, transposed right, displacement rank)
DISPLACEMENTS = [
    ("circulant", 1.0, 1.0, False, 0),  # commutes with the cyclic shift
    ("skew_circulant", -1.0, -1.0, False, 0),  # commutes with the negacyclic shift
    ("toeplitz", 1.0, -1.0, False, 2),
    ("hankel", 1.0, 1.0, True, 2),  # Z_1 H - H Z_1^T
    ("low_displacement_rank", 1.0, -1.0, False, 3),  # Eq. 11 with R = 3 terms
]


@pytest.mark.parametrize(("name", "left", "right", "transpose", "rank"), DISPLACEMENTS)
def test_every_block_meets_its_familys_displacement_equation(name, left, right, transpose, rank):
    """Z_a A - A Z_b (Z_b^T for Hankel) has the family's displacement rank on each of two
    stacked blocks of the materialised W (m = 2n), read off by singular values (float32)."""
    n = 7
    weights = np.asarray(
        projections.p_model(jax.random.key(9), n, 2 * n, generator=FAMILIES[name]).matrix(),
        np.float64,
    )
    right_shift = unit_shift(right, n).T if transpose else unit_shift(right, n)
    for block in (weights[:n], weights[n:]):
        displacement = unit_shift(left, n) @ block - block @ right_shift
        singular = np.linalg.svd(displacement, compute_uv=False) / np.abs(block).max()
        assert np.all(singular[:rank] > 1e-2) and np.all(singular[rank:] < 1e-5), singular


BUDGETS = {  # t(n) of each family
    "circulant": lambda n: n,
    "skew_circulant": lambda n: n,
    "toeplitz": lambda n: 2 * n - 1,
    "hankel": lambda n: 2 * n - 1,
    "low_displacement_rank": lambda n: 3 * n,
    "independent_rows": lambda n: n * n,
}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_draws_and_reads_exactly_its_budget(name):
    """t(n) is the paper's budget and every budget entry is read by some entry of the block
    (a Hankel budget of 2n drew one Gaussian no row ever read; the rows stayed N(0, I_n))."""
    n = 5
    projection = projections.p_model(jax.random.key(10), n, n, generator=FAMILIES[name])
    assert projection.budget.shape == (1, BUDGETS[name](n))
    read = np.abs(projection.block_matrices()).max(axis=(0, 2))  # per budget index
    assert read.shape == (BUDGETS[name](n),) and np.all(read > 1e-3)


def test_draws_are_standard_gaussian_budgets_and_rademacher_signs():
    """Budget entries N(0, 1) (mean and second moment within 4 SE) and preprocessing signs
    exactly +-1 with P(+1) = 1/2 (binomial SE), D_1, D_2, D_3 not equal; blocks' h differ.
    Signs all +1 left every row N(0, I_d) (a fixed rotation) and so passed the law tests."""
    projection = projections.toeplitz(jax.random.key(11), 200, 600, preprocess=True)
    budget = np.asarray(projection.budget, np.float64).ravel()  # 3 blocks x 511
    for moment, truth in ((budget, 0.0), (budget**2, 1.0)):
        se = moment.std(ddof=1) / math.sqrt(moment.size)
        assert abs(moment.mean() - truth) <= 4 * se
    signs = np.asarray(projection.signs)
    assert signs.shape == (3, 256) and set(np.unique(signs)) == {-1.0, 1.0}
    assert abs((signs > 0).mean() - 0.5) <= 4 * math.sqrt(0.25 / signs.size)
    assert not np.array_equal(signs[0], signs[1]) and not np.array_equal(signs[1], signs[2])
    ldr = projections.low_displacement_rank(jax.random.key(12), 4, 8, rank=2)
    assert not np.allclose(ldr.parameters[0], ldr.parameters[1])


@dataclasses.dataclass(frozen=True, eq=False)
class UnhashableCirculant(projections.Circulant):
    """A family whose instances cannot be hashed (a projection keeps it as static metadata)."""

    __hash__ = None


def test_violations_and_generators_refuse_bad_shapes_values_and_unhashable_families():
    """A NaN in P_i compares false with every tolerance, so both conditions "held"."""
    with pytest.raises(ValueError, match=r"matrices must have shape \(k, t, n\) .* got \(3, 3\)"):
        projections.p_model_violations(np.eye(3))
    with pytest.raises(ValueError, match=r"k, t, n >= 1, got \(0, 3, 3\)"):
        projections.p_model_violations(np.zeros((0, 3, 3)))
    broken = cyclic_matrices(4, 2)
    broken[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="matrices must contain only finite values"):
        projections.p_model_violations(broken)
    with pytest.raises(ValueError, match="matrices must contain only finite values"):
        projections.p_model(jax.random.key(0), 4, 2, matrices=broken)
    with pytest.raises(TypeError, match=r"generator must be hashable \(a frozen dataclass\)"):
        projections.p_model(jax.random.key(0), 4, 4, generator=UnhashableCirculant())


def test_the_budgets_are_checked_against_the_size_cap_before_drawing(monkeypatch):
    """The budgets (num_blocks, t) are capped like every drawn array: with the cap lowered to
    1000 bytes, the P_i checked (4 x 4 x 4 float64, 512 bytes) fit and the budgets (100 blocks
    x 4 float32, 1600 bytes) are refused."""
    from rfjax import _validation

    monkeypatch.setattr(_validation, "MAX_ARRAY_BYTES", 1000)
    with pytest.raises(ValueError, match="num_features=400 imply the budgets of randomness"):
        projections.circulant(jax.random.key(0), 4, 400)
