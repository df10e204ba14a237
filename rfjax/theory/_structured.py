"""Structured (P-model) random features: coherence graphs, chromatic numbers, deviation bounds.

Choromanski & Fagan (arXiv:1604.07356, Sec. 2.2-3) measure how far a structured matrix is from
an unstructured one by the coherence graphs of its P-model and their chromatic number; random
Fourier features (RFF) have pointwise (Kakade's lecture notes, Lemma 1.2) and uniform
(Sutherland & Schneider, UAI 2015) concentration bounds. All bounds here are probabilities of
|K_hat - K| >= epsilon (or of the sup over a domain), capped at 1, as NumPy float64.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from rfjax._validation import check_choice, check_int, check_real
from rfjax.projections import PModelProjection
from rfjax.theory._inputs import feature_count, host_real_array

if TYPE_CHECKING:  # networkx is imported where a graph is built or coloured (0.15 s to import)
    import networkx as nx

EXACT_SEARCH_VERTICES = 16
"""``chromatic_number(method="auto")`` searches exhaustively up to this many vertices."""

SUPPORT_TOLERANCE = 1e-6
"""An entry of P_i with |value| <= this (relative to the largest) is outside its support."""

EMBEDDINGS = ("sincos", "cosine_bias")


# ---------------------------------------------------------------------------------------------
# Coherence graphs and chromatic numbers (Sec. 2.2, Definitions of G_{i1,i2} and chi[P], Eq. 4)
# ---------------------------------------------------------------------------------------------


def _block_matrices(p_model: PModelProjection | ArrayLike) -> np.ndarray:
    """The P_i ``(k, t, n)`` of a projection's first block (its used rows) or of an array."""
    if isinstance(p_model, PModelProjection):
        matrices = p_model.block_matrices(0)
        return matrices[: p_model.block_sizes()[0]]
    matrices = host_real_array("p_model", p_model)
    if matrices.ndim != 3 or 0 in matrices.shape:
        raise ValueError(
            f"p_model must be a PModelProjection or P matrices of shape (k, t, n), got shape "
            f"{matrices.shape}"
        )
    return matrices


def coherence_graphs(p_model: PModelProjection | ArrayLike) -> dict[tuple[int, int], nx.Graph]:
    """The coherence graphs G_{i1,i2} of a P-model, one per pair of rows i1 < i2 (Sec. 2.2).

    Vertex j (a column, 0 <= j < n) stands for the entries A_{i1,j} and A_{i2,j} of the two rows
    and carries the set of budget indices they read, supp(p^{i1}_j) | supp(p^{i2}_j) (for the
    0/+-1 families of the paper a 2-element subset). Two vertices are adjacent when their sets
    intersect, i.e. when the pairs (A_{i1,j}, A_{i2,j}) and (A_{i1,j'}, A_{i2,j'}) share
    randomness. Entries of P_i below ``SUPPORT_TOLERANCE`` times the largest are treated as 0.

    For the paper's Fig. 1 (circulant, n = 5) every G_{i1,i2} is the 5-cycle; for Toeplitz
    matrices they are disjoint paths (Fig. 2). Here the vertex set is the columns and the
    graphs are indexed by pairs of rows, as in the figures (coloured entries of two highlighted
    rows); docs/maths/structured.md also gives the transposed reading (rows indexed by a pair of
    columns), which gives isomorphic graphs for circulant, Toeplitz and Hankel matrices.

    Args:
      p_model: a ``rfjax.projections.PModelProjection`` (its first block, the rows it uses) or
        the matrices P_0..P_{k-1} themselves, shape ``(k, t, n)``.

    Returns:
      ``{(i1, i2): graph}`` for 0 <= i1 < i2 < k; nodes 0..n-1 with attribute
      ``"budget_indices"`` (a frozenset).

    Examples:
      >>> import numpy as np
      >>> cyclic = np.stack([np.roll(np.eye(5), i, axis=1) for i in range(4)])  # Fig. 1
      >>> graph = coherence_graphs(cyclic)[(0, 1)]
      >>> sorted(graph.edges) == sorted(tuple(sorted((j, (j + 1) % 5))) for j in range(5))
      True

    References:
      Choromanski & Fagan, arXiv:1604.07356, Sec. 2.2 (Definition of coherence graphs, Fig. 1-2).
    """
    import networkx as nx

    graphs = {}
    for pair, reads, shared in _coherence_adjacency(_block_matrices(p_model)):
        graph = nx.Graph()
        sets: dict[bytes, frozenset] = {}  # columns reading the same indices share one set
        for j, column in enumerate(reads.T):
            key = column.tobytes()
            if key not in sets:
                sets[key] = frozenset(np.flatnonzero(column).tolist())
            graph.add_node(j, budget_indices=sets[key])
        graph.add_edges_from(np.argwhere(np.triu(shared, k=1)).tolist())
        graphs[pair] = graph
    return graphs


def _coherence_adjacency(matrices: np.ndarray):
    """Per pair of rows (i1, i2): the budget indices read by each column ``(t, n)`` and the
    adjacency ``(n, n)`` of G_{i1,i2} (diagonal included)."""
    scale = np.abs(matrices).max()
    support = (np.abs(matrices) > SUPPORT_TOLERANCE * scale).astype(np.int64)  # (k, t, n)
    for i1, i2 in itertools.combinations(range(matrices.shape[0]), 2):
        reads = support[i1] | support[i2]  # (t, n): budget indices read by column j
        yield (i1, i2), reads.astype(bool), (reads.T @ reads) > 0


def _colourable(graph: nx.Graph, order: list, colours: int) -> bool:
    """Whether ``graph`` has a proper colouring with ``colours`` colours (backtracking)."""
    assignment: dict = {}

    def extend(index: int) -> bool:
        if index == len(order):
            return True
        vertex = order[index]
        used = {assignment[u] for u in graph[vertex] if u in assignment}
        # Symmetry: the first uncoloured vertex only ever needs a colour not used yet so far.
        limit = min(colours, max(assignment.values(), default=-1) + 2)
        for colour in range(limit):
            if colour not in used:
                assignment[vertex] = colour
                if extend(index + 1):
                    return True
                del assignment[vertex]
        return False

    return extend(0)


def _exact_chromatic_number(graph: nx.Graph, upper: int) -> int:
    order = sorted(graph, key=graph.degree, reverse=True)
    colours = upper
    while colours > 1 and _colourable(graph, order, colours - 1):
        colours -= 1
    return colours


def chromatic_number(
    graph: nx.Graph, *, method: Literal["auto", "exact", "greedy"] = "auto"
) -> int:
    """The chromatic number of ``graph``: exact when certified, else a greedy upper bound.

    ``"greedy"`` returns the number of colours of networkx's DSatur colouring, a proper colouring
    and hence an upper bound (exact on bipartite graphs and cycles). ``"exact"`` lowers that
    count by exhaustive backtracking until no proper colouring with fewer colours exists
    (exponential in the worst case). ``"auto"`` returns the exact value when it is certified
    cheaply: no edges (1), complete (the number of vertices), bipartite (2), maximum degree 2
    and not bipartite (an odd cycle: 3),
    or at most ``EXACT_SEARCH_VERTICES`` vertices (the paper's figures have 5; exhaustive
    search); otherwise the DSatur count, a proven upper bound.

    Args:
      graph: an undirected ``networkx.Graph`` (self-loops are not allowed).
      method: ``"auto"``, ``"exact"`` or ``"greedy"``.

    Returns:
      The number of colours (0 for the empty graph).

    Examples:
      >>> import networkx as nx
      >>> chromatic_number(nx.cycle_graph(5)), chromatic_number(nx.path_graph(5))
      (3, 2)
      >>> chromatic_number(nx.petersen_graph(), method="exact")
      3
    """
    import networkx as nx

    if not isinstance(graph, nx.Graph) or graph.is_directed():
        raise TypeError(f"graph must be an undirected networkx.Graph, got {type(graph).__name__}")
    check_choice("method", method, ("auto", "exact", "greedy"))
    if nx.number_of_selfloops(graph):
        raise ValueError("graph must not have self-loops (a vertex adjacent to itself)")
    if graph.number_of_nodes() == 0:
        return 0
    nodes, edges = graph.number_of_nodes(), graph.number_of_edges()
    if edges == 0:
        return 1
    if method != "greedy" and edges == nodes * (nodes - 1) // 2:
        return nodes  # complete
    if method != "greedy" and nx.is_bipartite(graph):
        return 2
    if method == "auto" and max(degree for _, degree in graph.degree) <= 2:
        return 3  # not bipartite, so it has an odd cycle; and 3 colours suffice (Brooks)
    greedy = 1 + max(nx.greedy_color(graph, strategy="DSATUR").values())
    if method == "greedy" or greedy <= 2:
        return greedy  # DSatur is exact for at most two colours
    if method == "exact" or nodes <= EXACT_SEARCH_VERTICES:
        return _exact_chromatic_number(graph, greedy)
    return greedy


def p_model_chromatic_number(
    p_model: PModelProjection | ArrayLike, *, method: Literal["auto", "exact", "greedy"] = "auto"
) -> int:
    """chi[P] = max over pairs of rows of chi(G_{i1,i2}), Eq. 4 (1 for a single row).

    Args:
      p_model: as for ``coherence_graphs``.
      method: as for ``chromatic_number``.

    Examples:
      >>> import numpy as np
      >>> p_model_chromatic_number(np.stack([np.roll(np.eye(5), i, 1) for i in range(4)]))
      3

    References:
      Choromanski & Fagan, arXiv:1604.07356, Eq. 4; circulant: chi <= 3 (Eq. 8, Fig. 1),
      Toeplitz: chi = 2 (Eq. 10, Fig. 2).
    """
    check_choice("method", method, ("auto", "exact", "greedy"))
    import networkx as nx

    largest = 1
    seen = set()  # pairs of rows with the same adjacency (shifts of a circulant) count once
    for _, _, shared in _coherence_adjacency(_block_matrices(p_model)):
        n = shared.shape[0]
        if method != "greedy" and shared.all():  # complete: no graph needed (dense P_i)
            largest = max(largest, n)
            continue
        key = np.packbits(shared).tobytes()
        if key in seen:
            continue
        seen.add(key)
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(np.argwhere(np.triu(shared, k=1)).tolist())
        largest = max(largest, chromatic_number(graph, method=method))
    return largest


# ---------------------------------------------------------------------------------------------
# Deviation bounds
# ---------------------------------------------------------------------------------------------


def _probability(value: np.ndarray) -> np.ndarray:
    return np.minimum(1.0, value)


def _epsilon(epsilon: ArrayLike) -> np.ndarray:
    epsilon = host_real_array("epsilon", epsilon)
    if np.any(epsilon <= 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    return epsilon


def chromatic_deviation_bound(
    epsilon: ArrayLike,
    num_features: int,
    chromatic_number: int,
    *,
    value_range: float = 2.0,
) -> np.ndarray:
    """P(|K_hat - K| >= eps) <= 2 exp(-2 m eps^2 / (chi (b - a)^2)): k/chi effective samples.

    K_hat = (1/m) sum_i Z_i with Z_i in [a, b] and E K_hat = K. If the dependency graph of the
    Z_i (i ~ i' when Z_i and Z_{i'} share randomness) has a proper colouring with chi colours,
    each colour class is a set of independent summands and Janson's inequality (Random Struct.
    Algorithms 24, 2004, Theorem 2.1; with the fractional chromatic number chi* <= chi) gives
    this bound: Hoeffding's inequality with m replaced by m / chi. chi = 1 is Hoeffding for
    i.i.d. rows (``rff_pointwise_bound``).

    This is the mechanism by which Choromanski & Fagan (Sec. 3, the main theorem; its exact
    statement, with coherence and HD terms, is lost in the seed's extraction;
    docs/maths/structured.md, "Concentration") tie concentration to the chromatic number: "a
    larger budget of randomness ... decreases the chromatic numbers ... and that implies better
    concentration".
    It is a theorem when chi colours the dependency graph of the summands. For a structured
    matrix on dense (e.g. HD-preprocessed) inputs every two rows share randomness, so with
    chi = chi[P] (which colours the coherence graphs, not that dependency graph) it is the
    paper's heuristic, not a proven bound; ``structured_fourier_bound`` is a proven one.

    Args:
      epsilon: deviation(s) eps > 0, any shape.
      num_features: m >= 1, the number of summands.
      chromatic_number: chi >= 1.
      value_range: b - a > 0 (2 for cos(w.delta) in [-1, 1]).

    Returns:
      float64 array of the shape of ``epsilon``, capped at 1.

    Examples:
      >>> float(chromatic_deviation_bound(0.5, 64, 1)) == float(rff_pointwise_bound(0.5, 64))
      True
    """
    epsilon = _epsilon(epsilon)
    m = feature_count(num_features)
    chi = check_int("chromatic_number", chromatic_number, minimum=1)
    width = check_real("value_range", value_range, positive=True)
    return _probability(2.0 * np.exp(-2.0 * m * epsilon**2 / (chi * width**2)))


def rff_pointwise_bound(epsilon: ArrayLike, num_features: int, *, alpha: float = 1.0) -> np.ndarray:
    """Kakade's inner-product preservation (Lemma 1.2) with Hoeffding's constants.

    For a shift-invariant kernel with alpha = K(0) and m i.i.d. frequencies, the sin/cos
    estimate (alpha/m) sum_i cos(w_i.(x - y)) averages m independent terms in [-alpha, alpha],
    so P(|K_hat - K| >= eps) <= 2 exp(-m eps^2 / (2 alpha^2)). The notes state
    m = (alpha^2 / eps^2) log(1/delta) without constants; this is the bound their Hoeffding
    argument proves (one sum of cosines, rather than their separate cos.cos and sin.sin sums,
    which would give a union of two looser bounds).

    Args:
      epsilon: deviation(s) eps > 0, any shape.
      num_features: m >= 1 frequencies (the sin/cos embedding has 2m outputs).
      alpha: K(0) > 0 (1 for the Gaussian kernel).

    Returns:
      float64 array of the shape of ``epsilon``, capped at 1.

    References:
      S. Kakade, Stat 991 lecture 8 (seed 001), Lemma 1.2; Rahimi & Recht, NeurIPS 2007.
    """
    alpha = check_real("alpha", alpha, positive=True)
    return chromatic_deviation_bound(epsilon, num_features, 1, value_range=2.0 * alpha)


def structured_fourier_bound(
    epsilon: ArrayLike, num_features: int, covariance_norm: ArrayLike
) -> np.ndarray:
    """P(|K_hat - K| >= eps) <= 2 exp(-m eps^2 / (2 lambda)) for any P-model (derived here).

    K_hat = (1/m) sum_i cos(a^i . delta) with rows a^i = g^T P_i meeting the orthogonality
    condition (so E K_hat = K exactly) is a function of the budget g ~ N(0, I_t) with gradient
    -(1/m) J^T sin(J g), J = [P_i delta]_i (m x t), hence Lipschitz with constant
    sqrt(lambda / m), lambda = ||J J^T||_op = the largest eigenvalue of Cov(W delta) over g
    (``row_covariance``). The Gaussian concentration inequality for Lipschitz functions
    (Tsirelson-Ibragimov-Sudakov; Boucheron, Lugosi & Massart 2013, Theorem 5.6) gives the
    bound. For i.i.d. rows lambda = |delta|^2; structure enters through the correlations of
    the rows' projections (the paper's coherence): for a circulant block lambda is the largest
    value of |FFT(delta)|^2. Given the HD signs or random P parameters, the bound holds
    conditionally; averaged over them it bounds the unconditional probability.

    Args:
      epsilon: deviation(s) eps > 0; broadcasts against ``covariance_norm``.
      num_features: m >= 1 rows.
      covariance_norm: lambda > 0 (``row_covariance`` eigenvalue, in units of the lengthscale).

    Returns:
      float64 array of the broadcast shape, capped at 1.

    Examples:
      >>> float(structured_fourier_bound(0.5, 64, 1.0)) == float(rff_pointwise_bound(0.5, 64))
      True
    """
    epsilon = _epsilon(epsilon)
    m = feature_count(num_features)
    norm = host_real_array("covariance_norm", covariance_norm)
    if np.any(norm <= 0):
        raise ValueError(f"covariance_norm must be > 0, got {norm}")
    return _probability(2.0 * np.exp(-m * epsilon**2 / (2.0 * norm)))


@jax.jit
def _preprocess(projection: PModelProjection, x: jax.Array) -> jax.Array:
    return projection.preprocess(x)


def row_covariance(projection: PModelProjection, delta: ArrayLike) -> np.ndarray:
    """Cov(W delta) over the budgets g, given the HD signs and P parameters: ``(..., m, m)``.

    (W delta)_i = g_b^T P_i delta' with delta' the (padded, HD-rotated) input of row i's block
    b, so the covariance is J_b J_b^T within a block (J_b = [P_i delta']_i) and 0 across blocks.

    Args:
      projection: a ``PModelProjection``.
      delta: input(s) ``(..., d)``.

    Returns:
      float64 array ``(..., m, m)``; the diagonal is |delta|^2 when the P-model conditions hold.

    Examples:
      >>> import jax, numpy as np
      >>> from rfjax import projections
      >>> w = projections.circulant(jax.random.key(0), 4, 4)
      >>> cov = row_covariance(w, np.array([1.0, 0.0, 0.0, 0.0]))
      >>> bool(np.allclose(cov, np.eye(4), atol=1e-6))  # e_1 is orthogonal to its shifts
      True
    """
    if not isinstance(projection, PModelProjection):
        raise TypeError(f"projection must be a PModelProjection, got {type(projection).__name__}")
    delta = host_real_array("delta", delta)
    if delta.ndim == 0 or delta.shape[-1] != projection.dim:
        raise ValueError(
            f"delta must have last axis of size dim={projection.dim}, got {delta.shape}"
        )
    # In JAX's widest dtype (float64 with x64: the projection's float64 factors were applied to
    # a float32 delta before; host_real_array refuses a delta past float32 without it).
    dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
    rotated = np.asarray(_preprocess(projection, jnp.asarray(delta, dtype)), np.float64)
    m = projection.num_features
    covariance = np.zeros((*delta.shape[:-1], m, m))
    start = 0
    for block, rows in enumerate(projection.block_sizes()):
        matrices = projection.block_matrices(block)[:rows]  # (k, t, n)
        jacobian = np.einsum("isj,...j->...is", matrices, rotated)
        covariance[..., start : start + rows, start : start + rows] = jacobian @ np.swapaxes(
            jacobian, -1, -2
        )
        start += rows
    return covariance


def sutherland_schneider_beta(dim: int, *, embedding: str = "sincos") -> float:
    """The constants beta_d (sin/cos) and beta'_d (cosine + bias) of the uniform RFF bounds.

    The covering argument (Rahimi & Recht 2007, Claim 1, as tightened by Sutherland & Schneider)
    bounds P(sup |f| >= eps) by a r^{-D} + b r^2 for any net radius r. The first term is the
    union bound over the centres of T = (2 diam / r)^D balls covering the D-dimensional domain
    of the error f (D = d for sin/cos, whose error depends on x - y only, diam = 2 l; D = 2d for
    cosine + bias, whose error depends on (x, y), diam = sqrt(2) l), each failing with
    probability <= 2 exp(-(pointwise exponent)): a = 2 (2 diam)^D exp(-...). The second is
    Markov's bound on the Lipschitz constant, (2 r / eps)^2 E L^2 with E L^2 <= sigma_p^2
    (sin/cos), resp. 3 sigma_p^2. The minimum over r is
    a^{2/(D+2)} b^{D/(D+2)} ((D/2)^{-D/(D+2)} + (D/2)^{2/(D+2)}), which gives

      beta_d  = ((d/2)^{-d/(d+2)} + (d/2)^{2/(d+2)}) 2^{(6d+2)/(d+2)},
      beta'_d = (d^{-d/(d+1)} + d^{1/(d+1)}) 2^{(5d+1)/(d+1)} 3^{d/(d+1)}.

    The poster (seed 004) plots these constants (its Fig. 2) without their formulas; they are
    re-derived here (the powers of 2 and 3 and of sigma_p l / eps match the poster's bounds).

    Args:
      dim: d >= 1.
      embedding: ``"sincos"`` (beta_d) or ``"cosine_bias"`` (beta'_d).

    Returns:
      The constant (beta_d -> 64 and beta'_d -> 96 as d grows).
    """
    d = check_int("dim", dim, minimum=1)
    check_choice("embedding", embedding, EMBEDDINGS)
    if embedding == "sincos":
        half = d / 2
        return (half ** (-d / (d + 2)) + half ** (2 / (d + 2))) * 2 ** ((6 * d + 2) / (d + 2))
    return (
        (d ** (-d / (d + 1)) + d ** (1 / (d + 1)))
        * 2 ** ((5 * d + 1) / (d + 1))
        * 3 ** (d / (d + 1))
    )


def rff_uniform_bound(
    epsilon: ArrayLike,
    num_features: int,
    dim: int,
    *,
    diameter: float,
    sigma_p: float,
    embedding: str = "sincos",
    sigma_w_squared: float = 1.0,
) -> np.ndarray:
    """Sutherland & Schneider's bound on P(sup_{x,y in X} |K_hat(x, y) - K(x, y)| >= eps).

    For a continuous shift-invariant kernel with k(0) = 1 on a domain X in R^d of diameter l,
    with sigma_p^2 = E|w|^2 and sigma_w^2 = sup_delta 2 Var cos(w.delta) <= 1:

    * sin/cos (D = 2m outputs, m frequencies), alpha = min(1, sigma_w^2/2 + eps/3):
      beta_d (sigma_p l / eps)^{2/(1 + 2/d)} exp(-D eps^2 / (8 (d + 2) alpha));
    * cosine + bias (D = m outputs), alpha' = min(1, (1 + sigma_w^2)/8 + eps/6):
      beta'_d (sigma_p l / eps)^{2/(1 + 1/d)} exp(-D eps^2 / (32 (d + 2) alpha')).

    The bounds hold for every eps > 0 (the union bound holds for any net radius, and the
    constants use its optimum). Assumptions: i.i.d. frequencies w ~ P (Bochner), a compact
    domain, a kernel twice differentiable at 0 (sigma_p finite). For the Gaussian kernel
    exp(-|delta|^2 / (2 s^2)) in R^d, sigma_p^2 = d / s^2 and sigma_w^2 <= 1.

    Args:
      epsilon: eps > 0, any shape.
      num_features: m >= 1 frequencies (sin/cos has 2m outputs).
      dim: d >= 1.
      diameter: l > 0, the diameter of X.
      sigma_p: sqrt(E|w|^2) > 0.
      embedding: ``"sincos"`` or ``"cosine_bias"`` (as in ``rff_mse``).
      sigma_w_squared: sigma_w^2 in (0, 1] (1, the default, is always valid).

    Returns:
      float64 array of the shape of ``epsilon``, capped at 1.

    References:
      Sutherland & Schneider, "On the Error of Random Fourier Features", UAI 2015,
      arXiv:1506.02785 (seed 004, "Improved uniform convergence"); Rahimi & Recht 2007.
    """
    epsilon = _epsilon(epsilon)
    m = feature_count(num_features)
    d = check_int("dim", dim, minimum=1)
    check_choice("embedding", embedding, EMBEDDINGS)
    diameter = check_real("diameter", diameter, positive=True)
    sigma_p = check_real("sigma_p", sigma_p, positive=True)
    sigma_w_squared = check_real("sigma_w_squared", sigma_w_squared, positive=True)
    if sigma_w_squared > 1:
        raise ValueError(f"sigma_w_squared must be in (0, 1], got {sigma_w_squared}")
    beta = sutherland_schneider_beta(d, embedding=embedding)
    scale = sigma_p * diameter / epsilon
    if embedding == "sincos":
        alpha = np.minimum(1.0, sigma_w_squared / 2 + epsilon / 3)
        value = (
            beta * scale ** (2 / (1 + 2 / d)) * np.exp(-2 * m * epsilon**2 / (8 * (d + 2) * alpha))
        )
    else:
        alpha = np.minimum(1.0, (1 + sigma_w_squared) / 8 + epsilon / 6)
        value = beta * scale ** (2 / (1 + 1 / d)) * np.exp(-m * epsilon**2 / (32 * (d + 2) * alpha))
    return _probability(value)


__all__ = [
    "chromatic_deviation_bound",
    "chromatic_number",
    "coherence_graphs",
    "p_model_chromatic_number",
    "rff_pointwise_bound",
    "rff_uniform_bound",
    "row_covariance",
    "structured_fourier_bound",
    "sutherland_schneider_beta",
]
