"""Theory of structured features: the paper's Figures 1-2, chromatic numbers, bounds."""

import math

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest
from scipy import optimize

from rfjax import features, projections, theory


def circulant_edges(n, shift):
    return {tuple(sorted((j, (j + shift) % n))) for j in range(n)}


def test_figure_1_circulant_coherence_graphs_are_five_cycles():
    """Fig. 1: a 4 x 5 circulant from g_1..g_5; every G_{i1,i2} is a 5-cycle, 3 colours."""
    projection = projections.circulant(jax.random.key(0), 5, 4)
    matrices = projection.block_matrices()[:4]
    expected = np.stack([np.roll(np.eye(5), i, axis=1) for i in range(4)])  # Eq. 8
    np.testing.assert_allclose(matrices, expected, atol=1e-6)
    graphs = theory.coherence_graphs(projection)
    assert sorted(graphs) == [(i1, i2) for i1 in range(4) for i2 in range(i1 + 1, 4)]
    for (i1, i2), graph in graphs.items():
        assert set(graph.edges) == circulant_edges(5, i2 - i1)
        for j in range(5):  # the 2-element subset of budget indices of column j
            assert graph.nodes[j]["budget_indices"] == {(j - i1) % 5, (j - i2) % 5}
        assert nx.is_isomorphic(graph, nx.cycle_graph(5))
        assert theory.chromatic_number(graph) == 3
    assert theory.p_model_chromatic_number(projection) == 3


def test_figure_2_toeplitz_coherence_graphs_are_four_path_forests():
    """Fig. 2: a 5 x 5 Toeplitz matrix (budget 9); four graphs up to isomorphism, 2 colours."""
    projection = projections.toeplitz(jax.random.key(0), 5, 5)
    assert projection.budget.shape == (1, 9)
    graphs = theory.coherence_graphs(projection)
    classes = []
    for (i1, i2), graph in graphs.items():
        shift = i2 - i1
        assert set(graph.edges) == {(j, j + shift) for j in range(5 - shift)}
        assert theory.chromatic_number(graph) == 2
        if not any(nx.is_isomorphic(graph, seen) for seen in classes):
            classes.append(graph)
    components = sorted(
        sorted((len(c) for c in nx.connected_components(g)), reverse=True) for g in classes
    )
    assert components == [[2, 1, 1, 1], [2, 2, 1], [3, 2], [5]]
    assert theory.p_model_chromatic_number(projection) == 2


@pytest.mark.parametrize("n", [2, 6, 8, 9, 16])
def test_chromatic_numbers_of_the_families_match_the_paper(n):
    """Circulant: cycles, chi <= 3 (Eq. 8), = 3 iff n has an odd factor > 1 (an odd cycle);
    Toeplitz, Hankel: paths, chi = 2 (Eq. 10); skew-circulant: the circulant's supports."""
    key = jax.random.key(n)
    odd_factor = n & (n - 1) != 0
    expected_circulant = 3 if odd_factor else 2
    for name, expected in (
        ("circulant", expected_circulant),
        ("skew_circulant", expected_circulant),
        ("toeplitz", 2),
        ("hankel", 2),
    ):
        projection = projections.get(name)(key, n, n)
        assert theory.p_model_chromatic_number(projection) == expected, name
        for graph in theory.coherence_graphs(projection).values():
            assert max(dict(graph.degree).values()) <= 2  # unions of cycles / paths


def test_chromatic_numbers_at_the_two_ends_of_the_budget():
    """Independent rows: edgeless graphs (chi = 1); low displacement rank: dense P_i, complete
    graphs (chi = n), so the chromatic number says nothing about that family."""
    independent = projections.p_model(
        jax.random.key(1), 6, 6, generator=projections.IndependentRows()
    )
    assert theory.p_model_chromatic_number(independent) == 1
    dense = projections.low_displacement_rank(jax.random.key(1), 6, 6, rank=2)
    assert all(
        nx.is_isomorphic(g, nx.complete_graph(6)) for g in theory.coherence_graphs(dense).values()
    )
    assert theory.p_model_chromatic_number(dense) == 6


def test_chromatic_number_exact_and_greedy():
    grotzsch = nx.mycielski_graph(4)  # 11 vertices, triangle-free, chi = 4
    assert theory.chromatic_number(grotzsch) == 4
    assert theory.chromatic_number(grotzsch, method="greedy") >= 4
    assert theory.chromatic_number(nx.petersen_graph(), method="exact") == 3
    assert theory.chromatic_number(nx.complete_graph(7)) == 7
    assert theory.chromatic_number(nx.cycle_graph(101)) == 3  # above the exhaustive size
    assert theory.chromatic_number(nx.grid_2d_graph(6, 6)) == 2
    assert theory.chromatic_number(nx.empty_graph(4)) == 1
    assert theory.chromatic_number(nx.Graph()) == 0
    crown = nx.Graph([(f"a{i}", f"b{j}") for i in range(8) for j in range(8) if i != j])
    assert theory.chromatic_number(crown, method="greedy") == 2  # bipartite: DSatur exact
    with pytest.raises(TypeError, match=r"undirected networkx\.Graph"):
        theory.chromatic_number(nx.DiGraph([(0, 1)]))
    with pytest.raises(ValueError, match="self-loops"):
        theory.chromatic_number(nx.Graph([(0, 0)]))
    with pytest.raises(ValueError, match="method must be one of"):
        theory.chromatic_number(nx.path_graph(3), method="fast")


@pytest.mark.parametrize(
    ("name", "options"),
    [("circulant", {"preprocess": True}), ("low_displacement_rank", {"rank": 2})],
)
def test_row_covariance_is_the_covariance_over_the_budget(name, options):
    """Cov(W delta) over budgets with the HD signs / h fixed: MC over 4000 budgets, 4 SE."""
    dim, m = 6, 6
    base = projections.get(name)(jax.random.key(2), dim, m, **options)
    delta = np.array([0.5, -0.3, 0.8, 0.1, 0.0, -0.6])
    covariance = theory.row_covariance(base, delta)
    np.testing.assert_allclose(np.diag(covariance), np.full(m, delta @ delta), rtol=1e-5)
    budgets = jax.random.normal(jax.random.key(3), (4000, *base.budget.shape))
    samples = jax.vmap(
        lambda g: projections.p_model(
            jax.random.key(2),
            dim,
            m,
            generator=base.model,
            budget=g,
            preprocess=base.signs is not None,
        )(jnp.asarray(delta, jnp.float32))
    )(budgets)
    samples = np.asarray(samples, np.float64)
    products = samples[:, :, None] * samples[:, None, :]
    se = products.std(axis=0, ddof=1) / math.sqrt(len(samples))
    assert np.all(np.abs(products.mean(axis=0) - covariance) <= 4 * se + 1e-6)
    assert not np.allclose(covariance, np.diag(np.diag(covariance)), atol=0.05)  # rows correlate


def test_row_covariance_of_a_circulant_is_the_autocorrelation():
    delta = np.array([1.0, 2.0, -1.0, 0.5, 0.0])
    covariance = theory.row_covariance(projections.circulant(jax.random.key(0), 5, 5), delta)
    lags = np.array([[np.dot(delta, np.roll(delta, i - j)) for j in range(5)] for i in range(5)])
    np.testing.assert_allclose(covariance, lags, atol=1e-5)
    largest = np.linalg.eigvalsh(covariance)[-1]  # the largest |FFT(delta)|^2
    np.testing.assert_allclose(largest, np.max(np.abs(np.fft.fft(delta)) ** 2), rtol=1e-6)


def test_row_covariance_is_float64_with_x64():
    """With x64 and a float64 circulant the autocorrelation holds to float64's rounding (delta
    was cast to float32: 6e-9 relative on the diagonal)."""
    delta = np.array([1.0, 1e-9, 0.3, 0.7])
    with jax.enable_x64(True):
        w = projections.circulant(jax.random.key(0), 4, 4, dtype=jnp.float64)
        covariance = theory.row_covariance(w, delta)
    np.testing.assert_allclose(np.diag(covariance), delta @ delta, rtol=1e-14)


def test_bounds_reduce_to_hoeffding_and_order_as_stated():
    eps = np.array([0.1, 0.3, 0.6])
    hoeffding = 2 * np.exp(-64 * eps**2 / 2)
    np.testing.assert_allclose(theory.rff_pointwise_bound(eps, 64), np.minimum(1, hoeffding))
    np.testing.assert_allclose(
        theory.chromatic_deviation_bound(eps, 64, 1), np.minimum(1, hoeffding)
    )
    np.testing.assert_allclose(
        theory.structured_fourier_bound(eps, 64, 1.0), np.minimum(1, hoeffding)
    )
    np.testing.assert_allclose(
        theory.chromatic_deviation_bound(eps, 64, 3), np.minimum(1, 2 * np.exp(-64 * eps**2 / 6))
    )
    assert theory.rff_pointwise_bound(0.01, 4) == 1.0  # capped
    for name, call in (
        ("epsilon", lambda: theory.rff_pointwise_bound(0.0, 4)),
        ("chromatic_number", lambda: theory.chromatic_deviation_bound(0.1, 4, 0)),
        ("covariance_norm", lambda: theory.structured_fourier_bound(0.1, 4, -1.0)),
        (
            "sigma_w_squared",
            lambda: theory.rff_uniform_bound(
                0.1, 4, 2, diameter=1.0, sigma_p=1.0, sigma_w_squared=2.0
            ),
        ),
        (
            "embedding",
            lambda: theory.rff_uniform_bound(0.1, 4, 2, diameter=1.0, sigma_p=1.0, embedding="cos"),
        ),
    ):
        with pytest.raises(ValueError, match=name):
            call()


def test_hoeffding_and_structured_bounds_hold_by_monte_carlo():
    """Empirical tails of i.i.d. and circulant RFF at m = 8 sit below their bounds (+4 SE)."""
    x = jnp.array([0.4, -0.2, 0.3, 0.1, 0.0, 0.2, -0.5, 0.3])
    y = jnp.zeros(8)
    truth = math.exp(-float(x @ x) / 2)
    eps = np.array([0.1, 0.2, 0.3])
    for name in ("gaussian", "circulant"):
        sampler = projections.get(name)

        def estimate(key, sampler=sampler):
            w = sampler(key, 8, 8)
            return features.estimate(
                features.fourier_features(x, w), features.fourier_features(y, w)
            )

        values = np.asarray(jax.vmap(estimate)(jax.random.split(jax.random.key(4), 20000)))
        tails = (np.abs(values - truth)[:, None] > eps).astype(np.float64)
        se = tails.std(axis=0, ddof=1) / math.sqrt(len(tails))
        norm = 1.0
        if name == "circulant":
            w = projections.circulant(jax.random.key(0), 8, 8)
            norm = np.linalg.eigvalsh(theory.row_covariance(w, np.asarray(x)))[-1]
        bound = theory.structured_fourier_bound(eps, 8, norm)
        assert np.all(tails.mean(axis=0) <= bound + 4 * se), (name, tails.mean(axis=0), bound)
        if name == "gaussian":
            assert np.all(tails.mean(axis=0) <= theory.rff_pointwise_bound(eps, 8) + 4 * se)


@pytest.mark.parametrize("dim", [1, 3, 20])
def test_sutherland_schneider_constants_are_the_optimum_of_the_covering_bound(dim):
    """beta_d / beta'_d: min over the net radius r of a r^-D + b r^2 with the covering constants
    (sigma_p l / eps = 1, the pointwise exponential factor left out)."""
    for embedding, dims, a, b in (
        ("sincos", dim, 2 * 4.0**dim, 4.0),
        ("cosine_bias", 2 * dim, 2 * (2 * math.sqrt(2)) ** (2 * dim), 12.0),
    ):

        def covering(log_r, a=a, b=b, dims=dims):
            return a * math.exp(-dims * log_r) + b * math.exp(2 * log_r)

        best = optimize.minimize_scalar(covering, bounds=(-20, 20), method="bounded").fun
        beta = theory.sutherland_schneider_beta(dim, embedding=embedding)
        assert best == pytest.approx(beta, rel=1e-6), embedding
    assert theory.sutherland_schneider_beta(10**6) == pytest.approx(64, rel=1e-3)
    assert theory.sutherland_schneider_beta(10**6, embedding="cosine_bias") == pytest.approx(
        96, rel=1e-3
    )


def test_uniform_bound_formula_and_monotonicity():
    """At m = 4000 the bound is 0.011 (at m = 10^5 it was 3e-125, and pytest.approx's default
    absolute tolerance of 1e-12 accepted any value there)."""
    eps, m, d, diameter, sigma_p = 0.2, 4000, 4, 2.0, 1.5
    alpha = min(1.0, 0.5 + eps / 3)
    expected = (
        theory.sutherland_schneider_beta(d)
        * (sigma_p * diameter / eps) ** (2 / (1 + 2 / d))
        * math.exp(-2 * m * eps**2 / (8 * (d + 2) * alpha))
    )
    value = theory.rff_uniform_bound(eps, m, d, diameter=diameter, sigma_p=sigma_p)
    assert 1e-3 < expected < 1
    assert value == pytest.approx(expected, rel=1e-12, abs=0)
    more = theory.rff_uniform_bound(eps, 2 * m, d, diameter=diameter, sigma_p=sigma_p)
    bias = theory.rff_uniform_bound(
        eps, m, d, diameter=diameter, sigma_p=sigma_p, embedding="cosine_bias"
    )
    assert more < value < bias  # more features help; the sin/cos bound is the tighter one


def test_exact_search_beats_dsatur_where_dsatur_is_not_optimal():
    """A 9-vertex graph DSatur colours with 4 colours, 3-colourable: "auto" (<= 16 vertices)
    and "exact" lower the count by backtracking (a symmetry limit of one colour too few made the
    search fail at once and return DSatur's 4)."""
    graph = nx.Graph()
    graph.add_nodes_from(range(9))  # insertion order fixes DSatur's ties
    edges = "02 03 04 06 12 14 15 25 26 27 35 38 48 58 68"
    graph.add_edges_from((int(u), int(v)) for u, v in edges.split())
    assert theory.chromatic_number(graph, method="greedy") == 4
    assert theory.chromatic_number(graph) == 3
    assert theory.chromatic_number(graph, method="exact") == 3
    graph.add_nodes_from(range(9, 16))  # isolated: still searched at 16 vertices ...
    assert theory.chromatic_number(graph) == 3
    graph.add_node(16)  # ... and at 17 "auto" gives DSatur's count, an upper bound
    assert theory.chromatic_number(graph) == 4
    assert theory.chromatic_number(graph, method="exact") == 3


def test_a_disconnected_graph_of_degree_three_can_need_four_colours():
    """K_4 beside an edge: not complete, not bipartite, maximum degree 3 and chi = 4 (Brooks'
    theorem excludes K_4 only for connected graphs; "degree <= 3 means 3" passed every test)."""
    graph = nx.disjoint_union(nx.complete_graph(4), nx.path_graph(2))
    assert theory.chromatic_number(graph) == 4


def test_chromatic_number_of_one_row_and_of_small_entries():
    """chi[P] = 1 for a single row (Eq. 4 has no pair; 0 was returned by a mutant), and the
    support threshold is relative: the circulant's P_i scaled by 1e-9 still give 5-cycles."""
    assert theory.p_model_chromatic_number(np.eye(3)[None]) == 1
    cyclic = np.stack([np.roll(np.eye(5), i, axis=1) for i in range(3)])
    assert theory.p_model_chromatic_number(1e-9 * cyclic) == 3


ROW_COVARIANCE_CASES = [  # several blocks (m > n), the last truncated; HD rotation; random h_b
    ("circulant", 5, 13, {"preprocess": True}),
    ("low_displacement_rank", 4, 10, {"rank": 2}),
]


@pytest.mark.parametrize(("name", "dim", "m", "options"), ROW_COVARIANCE_CASES)
def test_row_covariance_of_several_blocks_is_the_gram_of_the_budget_jacobian(name, dim, m, options):
    """W delta is linear in the stacked budgets, so Cov(W delta) = J J^T with J its Jacobian,
    here by autodiff through the fast product (not through block_matrices): blocks on the
    diagonal, zero across blocks, each block with its own h (a covariance that reused block 0's
    matrices, or did not move past block 0, passed the one-block tests)."""
    base = projections.get(name)(jax.random.key(7), dim, m, **options)
    deltas = np.asarray(jax.random.normal(jax.random.key(8), (2, dim)), np.float64)

    def project(budget, delta):
        return projections.p_model(
            jax.random.key(7),
            dim,
            m,
            generator=base.model,
            budget=budget,
            preprocess=base.signs is not None,
        )(delta)

    covariance = theory.row_covariance(base, deltas)
    assert covariance.shape == (2, m, m)
    for delta, got in zip(deltas, covariance, strict=True):
        jacobian = jax.jacfwd(project)(base.budget, jnp.asarray(delta, jnp.float32))
        jacobian = np.asarray(jacobian, np.float64).reshape(m, -1)
        np.testing.assert_allclose(got, jacobian @ jacobian.T, atol=1e-5)
        np.testing.assert_allclose(np.diag(got), np.full(m, delta @ delta), rtol=1e-5)
    assert np.abs(covariance[:, : base.block_size, base.block_size :]).max() == 0.0


def test_row_covariance_refuses_other_projections_and_inputs_of_another_size():
    w = projections.circulant(jax.random.key(0), 4, 4)
    with pytest.raises(TypeError, match="projection must be a PModelProjection, got Dense"):
        theory.row_covariance(projections.gaussian(jax.random.key(0), 4, 4), np.ones(4))
    for delta in (np.ones(5), np.ones((2, 3)), np.float64(1.0)):
        with pytest.raises(ValueError, match="delta must have last axis of size dim=4"):
            theory.row_covariance(w, delta)


def test_bounds_take_alpha_and_refuse_a_zero_covariance_norm():
    """alpha = K(0) sets the summands' range [-alpha, alpha]: 2 exp(-m eps^2 / (2 alpha^2));
    a zero covariance norm (a bound of 0 by 1/0) is refused like a negative one."""
    eps = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(
        theory.rff_pointwise_bound(eps, 64, alpha=2.0),
        np.minimum(1.0, 2 * np.exp(-64 * eps**2 / 8)),
        rtol=1e-12,
    )
    with pytest.raises(ValueError, match="covariance_norm must be > 0"):
        theory.structured_fourier_bound(0.1, 4, 0.0)


@pytest.mark.parametrize(("embedding", "m"), [("sincos", 6000), ("cosine_bias", 40000)])
def test_uniform_bound_formula_for_each_embedding_and_sigma_w(embedding, m):
    """Both embeddings' formulas with sigma_w^2 = 0.4 (alpha < 1), written out from the
    docstring (only the sin/cos one at sigma_w^2 = 1 was checked), at bounds of 0.005, 0.02."""
    eps, d, diameter, sigma_p, sigma_w2 = 0.1, 3, 2.0, 1.5, 0.4
    scale = sigma_p * diameter / eps
    if embedding == "sincos":
        alpha = sigma_w2 / 2 + eps / 3
        rest = scale ** (2 / (1 + 2 / d)) * math.exp(-2 * m * eps**2 / (8 * (d + 2) * alpha))
    else:
        alpha = (1 + sigma_w2) / 8 + eps / 6
        rest = scale ** (2 / (1 + 1 / d)) * math.exp(-m * eps**2 / (32 * (d + 2) * alpha))
    assert alpha < 1
    expected = theory.sutherland_schneider_beta(d, embedding=embedding) * rest
    value = theory.rff_uniform_bound(
        eps,
        m,
        d,
        diameter=diameter,
        sigma_p=sigma_p,
        embedding=embedding,
        sigma_w_squared=sigma_w2,
    )
    assert 1e-3 < expected < 1
    assert value == pytest.approx(expected, rel=1e-12, abs=0)


def test_coherence_graphs_refuse_matrices_that_are_not_k_t_n():
    for matrices in (np.eye(3), np.zeros((2, 0, 3))):
        with pytest.raises(ValueError, match=r"p_model must be a PModelProjection or P matrices"):
            theory.coherence_graphs(matrices)
    with pytest.raises(ValueError, match=r"of shape \(k, t, n\), got shape \(3, 3\)"):
        theory.p_model_chromatic_number(np.eye(3))
