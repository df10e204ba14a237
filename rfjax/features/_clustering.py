"""Cluster-adapted hybrid features: k-means, per-cluster-pair CE matrices, mixture coefficients.

Queries are modelled by clusters with centres r_1..r_{k_q}, keys by clusters with centres
r'_1..r'_{k_k} (k-means, in JAX). For each pair (i, j) a complex-exponential estimator with a
diagonal A_ij = diag(alpha_ij) is chosen so that A_ij r_i + A_ij^{-T} r'_j is (as close as the
constraint allows to) 0, which makes it exact at the centres (Eq. 17, 21) and accurate near them.
The pair estimators are mixed by zero-one coefficients (Def. H.2: only the estimator of the
pair of the nearest centres fires) or Gaussian-mixture coefficients (Def. H.1).

References:
  Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367, Sec. 2.4,
  App. H (Eq. 21, 81-88, Def. H.1, H.2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from rfjax._validation import (
    check_array_size,
    check_choice,
    check_finite,
    check_inputs,
    check_int,
    check_iterations,
    check_key,
    check_real,
    is_concrete,
)
from rfjax.features._common import check_projection, merge_trailing_axes
from rfjax.features._complex_exponential import (
    check_side,
    features_from_transformed,
    transform,
)
from rfjax.features._hybrid import concatenate_blocks
from rfjax.features._positive import positive_features
from rfjax.features._protocol import ExponentialFeatureMap, FeatureMap, Side
from rfjax.projections import Projection

Initialisation = Literal["kmeans++", "random"]
MatrixKind = Literal["real", "complex"]
Mixture = Literal["zero_one", "gaussian"]
INITIALISATIONS: tuple[Initialisation, ...] = ("kmeans++", "random")
MATRIX_KINDS: tuple[MatrixKind, ...] = ("real", "complex")
MIXTURES: tuple[Mixture, ...] = ("zero_one", "gaussian")


def _check_points(name: str, points: object) -> jax.Array:
    points = check_inputs(name, points)
    if points.ndim != 2:
        raise ValueError(f"{name} must have shape (num_points, d), got {points.shape}")
    return check_finite(name, points)


def assign_clusters(points: jax.Array, centres: jax.Array) -> jax.Array:
    """Index of the nearest centre (Euclidean) for each point.

    Args:
      points: shape ``(..., d)``, floating.
      centres: shape ``(k, d)``.

    Returns:
      int32 indices in [0, k), shape ``points.shape[:-1]`` (ties go to the lowest index).

    Raises:
      TypeError: if an input is not floating.
      ValueError: if ``centres`` is not ``(k, d)`` with k >= 1 and the d of ``points``.
    """
    points = check_inputs("points", points)
    centres = check_inputs("centres", centres, dim=points.shape[-1])
    if centres.ndim != 2 or centres.shape[0] < 1:
        raise ValueError(f"centres must have shape (k, d) with k >= 1, got {centres.shape}")
    return _nearest(points, centres)


def _nearest(points: jax.Array, centres: jax.Array) -> jax.Array:
    # |p - c|^2 = |p|^2 - 2 p.c + |c|^2; |p|^2 does not change the argmin.
    scores = jnp.sum(centres * centres, axis=-1) - 2.0 * points @ centres.T
    return jnp.argmin(scores, axis=-1).astype(jnp.int32)


def _squared_distances(points: jax.Array, centre: jax.Array) -> jax.Array:
    return jnp.sum((points - centre) ** 2, axis=-1)


def _kmeans_plus_plus(key: jax.Array, points: jax.Array, num_clusters: int) -> jax.Array:
    """k-means++ seeding: each next centre drawn with probability proportional to D(x)^2."""
    first = points[jax.random.randint(jax.random.fold_in(key, 0), (), 0, points.shape[0])]
    centres = jnp.zeros((num_clusters, points.shape[1]), points.dtype).at[0].set(first)

    def body(i: jax.Array, state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        centres, d2 = state
        logits = jnp.where(d2 > 0, jnp.log(jnp.where(d2 > 0, d2, 1.0)), -jnp.inf)
        logits = jnp.where(jnp.any(d2 > 0), logits, 0.0)  # all points coincide: uniform
        centre = points[jax.random.categorical(jax.random.fold_in(key, i), logits)]
        return centres.at[i].set(centre), jnp.minimum(d2, _squared_distances(points, centre))

    centres, _ = jax.lax.fori_loop(
        1, num_clusters, body, (centres, _squared_distances(points, first))
    )
    return centres


def _lloyd(points: jax.Array, centres: jax.Array, num_iterations: int) -> jax.Array:
    num_clusters = centres.shape[0]

    def step(_: jax.Array, centres: jax.Array) -> jax.Array:
        onehot = jax.nn.one_hot(_nearest(points, centres), num_clusters, dtype=points.dtype)
        counts = jnp.sum(onehot, axis=0)[:, None]
        means = (onehot.T @ points) / jnp.maximum(counts, 1.0)
        return jnp.where(counts > 0, means, centres)  # an empty cluster keeps its centre

    return jax.lax.fori_loop(0, num_iterations, step, centres)


def kmeans(
    key: jax.Array,
    points: jax.Array,
    num_clusters: int,
    *,
    num_iterations: int = 25,
    init: Initialisation = "kmeans++",
) -> jax.Array:
    """k-means clustering (Lloyd's algorithm) with k-means++ or random initialisation.

    A fixed number of Lloyd iterations runs in a ``lax.fori_loop``, so the function is pure,
    jittable and vmappable (e.g. over keys or over attention heads). An empty cluster keeps its
    previous centre.

    Args:
      key: PRNG key for the initialisation.
      points: shape ``(num_points, d)``, floating, finite.
      num_clusters: k, 1 <= k <= num_points (static).
      num_iterations: number of Lloyd steps >= 0 (static).
      init: ``"kmeans++"`` (Arthur & Vassilvitskii 2007) or ``"random"`` (k distinct points).

    Returns:
      Centres, shape ``(k, d)``, in the dtype of ``points``.

    Raises:
      TypeError: if ``key`` is not a key, ``points`` not floating, or a count not an int.
      ValueError: for a bad shape, non-finite points (outside ``jit``), k outside
        [1, num_points], num_iterations < 0 or an unknown ``init``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> pts = jnp.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
      >>> c = kmeans(jax.random.key(0), pts, 2)
      >>> sorted(round(float(v), 2) for v in c[:, 0])
      [0.05, 5.05]

    References:
      Lloyd 1982; Arthur & Vassilvitskii, "k-means++", SODA 2007; HRF App. H.
    """
    check_key("key", key)
    points = _check_points("points", points)
    num_clusters = check_int("num_clusters", num_clusters, minimum=1)
    if num_clusters > points.shape[0]:
        raise ValueError(
            f"num_clusters must be <= the number of points {points.shape[0]}, got {num_clusters}"
        )
    num_iterations = check_iterations(
        "num_iterations", check_int("num_iterations", num_iterations, minimum=0)
    )
    init = check_choice("init", init, INITIALISATIONS)
    check_array_size(
        "the point-to-centre distances",
        (points.shape[0], num_clusters),
        points.dtype,
        {"num_clusters": num_clusters, "points.shape": points.shape},
    )
    return _kmeans(key, points, num_clusters, num_iterations, init)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _kmeans(
    key: jax.Array, points: jax.Array, num_clusters: int, num_iterations: int, init: Initialisation
) -> jax.Array:
    if init == "kmeans++":
        centres = _kmeans_plus_plus(key, points, num_clusters)
    else:
        index = jax.random.choice(key, points.shape[0], (num_clusters,), replace=False)
        centres = points[index]
    return _lloyd(points, centres, num_iterations)


def cluster_adapted_diagonals(
    query_centres: jax.Array,
    key_centres: jax.Array,
    *,
    matrix: MatrixKind = "real",
    max_scale: float = 10.0,
) -> jax.Array:
    """Diagonals alpha_ij of the cluster-adapted CE matrices A_ij = diag(alpha_ij) (HRF Eq. 21).

    A_ij minimises L(A) = |A r_i + A^{-T} r'_j|^2 over diagonal A; coordinatewise, with
    x = r_i[k] and y = r'_j[k], the condition alpha x + y / alpha = 0 reads alpha^2 x + y = 0:

      complex (Eq. 85-87): x y > 0: alpha = i sqrt(y/x);  x y < 0: alpha = sqrt(-y/x)  (L = 0);
      real (Eq. 88):       alpha = sqrt(|y/x|)  (L = 0 where x y < 0, 4 x y where x y > 0).

    Degenerate cases (App. H.2) and the choice made for them: x = y = 0: alpha = 1;
    x = 0 != y: alpha = ``max_scale`` ("large"); y = 0 != x: alpha = 1/``max_scale`` ("small").
    All magnitudes are clipped to [1/max_scale, max_scale]: an extreme alpha rescales one
    coordinate of x by alpha and of y by 1/alpha, and the variance exp(|A x + A^{-T} y|^2) - 1
    away from the centres grows with it. Inside the clip range the closed forms are exact.

    Args:
      query_centres: r_i, shape ``(k_q, d)``.
      key_centres: r'_j, shape ``(k_k, d)``.
      matrix: ``"real"`` (Eq. 88) or ``"complex"`` (Eq. 85-87).
      max_scale: bound > 1 on |alpha| and 1/|alpha|.

    Returns:
      alpha, shape ``(k_q, k_k, d)``; complex for ``matrix="complex"``, else real.

    Raises:
      TypeError: if the centres are not floating.
      ValueError: for bad shapes or options.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 21, 85-88.
    """
    query_centres = check_inputs("query_centres", query_centres)
    key_centres = check_inputs("key_centres", key_centres, dim=query_centres.shape[-1])
    for name, centres in (("query_centres", query_centres), ("key_centres", key_centres)):
        if centres.ndim != 2 or centres.shape[0] < 1:
            raise ValueError(f"{name} must have shape (k, d) with k >= 1, got {centres.shape}")
    matrix = check_choice("matrix", matrix, MATRIX_KINDS)
    max_scale = check_real("max_scale", max_scale, positive=True)
    if max_scale <= 1.0:
        raise ValueError(f"max_scale must be > 1, got {max_scale}")
    x = query_centres[:, None, :]
    y = key_centres[None, :, :]
    ax, ay = jnp.abs(x), jnp.abs(y)
    safe_x = jnp.where(ax > 0, ax, 1.0)
    magnitude = jnp.sqrt(ay / safe_x)
    magnitude = jnp.where(ax > 0, magnitude, jnp.where(ay > 0, max_scale, 1.0))
    magnitude = jnp.clip(magnitude, 1.0 / max_scale, max_scale)
    if matrix == "real":
        return magnitude
    return jnp.where(x * y > 0, 1j * magnitude, magnitude + 0j)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterHybridParameters:
    """Fitted state of the cluster-adapted hybrid estimator (a frozen pytree of arrays).

    Attributes:
      query_centres: r_i, shape ``(k_q, d)``.
      key_centres: r'_j, shape ``(k_k, d)``.
      diagonals: alpha_ij with A_ij = diag(alpha_ij), shape ``(k_q, k_k, d)``, real or complex.
    """

    query_centres: jax.Array
    key_centres: jax.Array
    diagonals: jax.Array

    @property
    def num_query_clusters(self) -> int:
        return self.query_centres.shape[-2]

    @property
    def num_key_clusters(self) -> int:
        return self.key_centres.shape[-2]


def cluster_hybrid_parameters(
    query_centres: jax.Array,
    key_centres: jax.Array,
    *,
    matrix: MatrixKind = "real",
    max_scale: float = 10.0,
) -> ClusterHybridParameters:
    """Cluster-hybrid parameters from given centres (``cluster_adapted_diagonals``)."""
    diagonals = cluster_adapted_diagonals(
        query_centres, key_centres, matrix=matrix, max_scale=max_scale
    )
    return ClusterHybridParameters(jnp.asarray(query_centres), jnp.asarray(key_centres), diagonals)


def fit_cluster_hybrid(
    key: jax.Array,
    query_points: jax.Array,
    key_points: jax.Array,
    num_query_clusters: int,
    num_key_clusters: int,
    *,
    matrix: MatrixKind = "real",
    num_iterations: int = 25,
    max_scale: float = 10.0,
) -> ClusterHybridParameters:
    """Fits the cluster-adapted hybrid: k-means on queries and on keys, then A_ij per pair.

    Args:
      key: PRNG key (split for the two k-means initialisations).
      query_points: sample of queries, shape ``(n_q, d)``.
      key_points: sample of keys, shape ``(n_k, d)``.
      num_query_clusters: k_q in [1, n_q].
      num_key_clusters: k_k in [1, n_k].
      matrix: ``"real"`` (Eq. 88, the paper's experiments) or ``"complex"`` (Eq. 85-87).
      num_iterations: Lloyd steps of each k-means.
      max_scale: see ``cluster_adapted_diagonals``.

    Returns:
      ``ClusterHybridParameters``.

    Raises:
      As ``kmeans`` and ``cluster_adapted_diagonals``; ValueError if the two samples have
      different d.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Sec. 2.4, App. H.2-H.3.
    """
    check_key("key", key)
    query_points = _check_points("query_points", query_points)
    key_points = _check_points("key_points", key_points)
    if key_points.shape[-1] != query_points.shape[-1]:
        raise ValueError(
            f"query_points and key_points must have the same d, got shapes "
            f"{query_points.shape} and {key_points.shape}"
        )
    query_key, key_key = jax.random.split(key)
    query_centres = kmeans(
        query_key, query_points, num_query_clusters, num_iterations=num_iterations
    )
    key_centres = kmeans(key_key, key_points, num_key_clusters, num_iterations=num_iterations)
    return cluster_hybrid_parameters(query_centres, key_centres, matrix=matrix, max_scale=max_scale)


def _check_parameters(parameters: object, dim: int) -> ClusterHybridParameters:
    if not isinstance(parameters, ClusterHybridParameters):
        raise TypeError(
            f"parameters must be ClusterHybridParameters (from fit_cluster_hybrid), got "
            f"{type(parameters).__name__}"
        )
    q, k, diag = parameters.query_centres, parameters.key_centres, parameters.diagonals
    if q.ndim != 2 or k.ndim != 2 or q.shape[-1] != dim or k.shape[-1] != dim:
        raise ValueError(
            f"parameters centres must have shapes (k_q, d) and (k_k, d) with d = {dim}, got "
            f"{q.shape} and {k.shape}"
        )
    if diag.shape != (q.shape[0], k.shape[0], dim):
        raise ValueError(
            f"parameters.diagonals must have shape (k_q, k_k, d) = ({q.shape[0]}, {k.shape[0]}, "
            f"{dim}) to match the numbers of query and key clusters, got {diag.shape}"
        )
    if is_concrete(diag) and not np.all(np.abs(np.asarray(diag)) > 0):
        raise ValueError("parameters.diagonals must be non-zero (every A_ij invertible)")
    return parameters


def _mixture_weights(x: jax.Array, centres: jax.Array, bandwidth: float) -> jax.Array:
    """g_i(x) = exp(-|x - r_i|^2 / (2 tau^2)), divided by max(1, sum_i g_i(x))."""
    log_g = -jnp.sum((x[..., None, :] - centres) ** 2, axis=-1) / (2.0 * bandwidth**2)
    g = jnp.exp(log_g)
    return g / jnp.maximum(1.0, jnp.sum(g, axis=-1, keepdims=True))


def _zero_one_blocks(
    x: jax.Array, parameters: ClusterHybridParameters, side: Side
) -> tuple[jax.Array, jax.Array]:
    """The zero-one coefficients' blocks: (alphas of the input's cluster pairs (..., k_other,
    d), active (..., k_q, k_k, 1) bool: the pair of the nearest centres)."""
    diagonals = parameters.diagonals
    if side == "query":
        cluster = _nearest(x, parameters.query_centres)
        alphas = diagonals[cluster]  # (..., k_k, d)
        active = jax.nn.one_hot(cluster, parameters.num_query_clusters, dtype=bool)
        return alphas, active[..., :, None, None]
    cluster = _nearest(x, parameters.key_centres)
    alphas = jnp.moveaxis(diagonals[:, cluster], 0, -2)  # (..., k_q, d)
    active = jax.nn.one_hot(cluster, parameters.num_key_clusters, dtype=bool)
    return alphas, active[..., None, :, None]


def _zero_one_log_features(
    x: jax.Array, projection: Projection, parameters: ClusterHybridParameters, side: Side
) -> jax.Array:
    """Log of the zero-one features for real diagonals: the CE log-features of the input's
    cluster pairs, a large negative number (exp = 0) in the other blocks."""
    alphas, active = _zero_one_blocks(x, parameters, side)
    u, _ = transform(x[..., None, :], alphas, side, diagonal=True)
    logs = projection(u) - 0.5 * jnp.sum(u * u, axis=-1, keepdims=True)
    logs = logs - 0.5 * math.log(projection.num_features)
    logs = logs[..., None, :, :] if side == "query" else logs[..., :, None, :]
    blocks = jnp.where(active, logs, 0.25 * float(jnp.finfo(logs.dtype).min))
    return merge_trailing_axes(blocks, 3)


def cluster_hybrid_log_features(
    x: jax.Array,
    projection: Projection,
    parameters: ClusterHybridParameters,
    *,
    side: Side,
) -> jax.Array:
    """The log of the zero-one ``cluster_hybrid_features`` with real diagonals (HRF Def. H.2).

    In the block of the input's cluster pair (i, j) the CE features are positive,
    exp(w.u - |u|^2/2) / sqrt(m) with u = A_ij x (query) or A_ij^{-1} y (key), so their log is
    w.u - |u|^2/2 - log(m)/2; the other blocks are 0, whose log is stood in for by a large
    negative finite number (a quarter of the dtype's lowest, so shifts never overflow).
    ``cluster_hybrid_features(..., mixture="zero_one")`` is exp of it; stabilised attention shifts
    it first (``ClusterHybridFeatureMap``). Computed in at least float32.

    Args:
      x: inputs, shape ``(..., d)``.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      parameters: cluster-hybrid parameters with real diagonals.
      side: ``"query"`` or ``"key"``.

    Returns:
      Log-features of shape ``(..., k_q k_k m)``.

    Raises:
      TypeError: for a bad ``x``, ``projection`` or ``parameters``.
      ValueError: for a bad ``side``, mismatched shapes or complex diagonals (signed features
        have no log).

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Sec. 2.4, Def. H.2, Eq. 88.
    """
    side = check_side(side)
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    parameters = _check_parameters(parameters, projection.dim)
    if jnp.issubdtype(parameters.diagonals.dtype, jnp.complexfloating):
        raise ValueError(
            "cluster_hybrid_log_features needs real diagonals (matrix='real'); complex CE "
            "features are signed and have no log"
        )
    return _zero_one_log_features(x, projection, parameters, side)


def cluster_hybrid_features(
    x: jax.Array,
    projection: Projection,
    parameters: ClusterHybridParameters,
    *,
    side: Side,
    mixture: Mixture = "zero_one",
    bandwidth: float | None = None,
) -> jax.Array:
    """Cluster-adapted hybrid features for the softmax kernel (HRF Def. H.1/H.2, Eq. 21).

    For each cluster pair (i, j) the CE features (``complex_exponential_features``) with
    A_ij = diag(alpha_ij) on the query side and A_ij^{-T} on the key side give an unbiased
    estimator SM-hat_ij, exact at (r_i, r'_j) when A_ij r_i + A_ij^{-T} r'_j = 0. All pairs share
    ``projection`` (unbiasedness only needs each SM-hat_ij unbiased, since the coefficients are
    deterministic). Coefficients:

    * ``"zero_one"`` (Def. H.2, the paper's experiments): lambda_ij(x, y) = 1[x nearest r_i]
      1[y nearest r'_j], so only the pair of the nearest centres fires:
      Psi(x) = [1[x in C_i] Phi_ij(x)]_{i,j}, Psi'(y) = [1[y in C'_j] Phi'_ij(y)]_{i,j}.
    * ``"gaussian"`` (Def. H.1, Gaussian mixture; reconstructed, the choice made):
      lambda_ij(x, y) = g_i(x) g'_j(y) with g_i(x) = e^{-|x - r_i|^2/(2 tau^2)} / max(1,
      sum_i e^{-|x - r_i|^2/(2 tau^2)}), so sum_ij lambda_ij <= 1, and a default antithetic
      positive estimator SM-hat^{++} (same projection) takes the rest:
      SM-hat = sum_ij lambda_ij SM-hat_ij + (1 - sum_ij lambda_ij) SM-hat^{++}. The paper
      estimates the Gaussian coefficients with random features; since they factorise into a
      function of x times a function of y for fixed centres, they are evaluated exactly here (a
      linearisation with one feature and no extra variance), which keeps the estimator unbiased.

    Args:
      x: inputs (queries for ``side="query"``, keys for ``"key"``), shape ``(..., d)``.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      parameters: from ``fit_cluster_hybrid`` or ``cluster_hybrid_parameters``.
      side: ``"query"`` or ``"key"``.
      mixture: ``"zero_one"`` or ``"gaussian"``.
      bandwidth: tau > 0, required for ``mixture="gaussian"`` and not allowed otherwise.

    Returns:
      Features of shape ``(..., k_q k_k w)`` (zero-one) or ``(..., k_q k_k w + 4m)`` (Gaussian),
      with w = 2m for complex diagonals and w = m for real ones.

    Raises:
      TypeError: for a bad ``x``, ``projection`` or ``parameters``.
      ValueError: for a bad ``side`` or ``mixture``, a missing or superfluous ``bandwidth``,
        mismatched shapes (diagonals not ``(k_q, k_k, d)``, centres of another d) or a zero
        diagonal entry (singular A_ij).

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Sec. 2.4, Def. H.1, H.2, Eq. 90-104.
    """
    side = check_side(side)
    mixture = check_choice("mixture", mixture, MIXTURES)
    projection = check_projection(projection)
    x = check_inputs("x", x, dim=projection.dim)
    parameters = _check_parameters(parameters, projection.dim)
    if mixture == "gaussian":
        if bandwidth is None:
            raise ValueError("bandwidth is required for mixture='gaussian'")
        bandwidth = check_real("bandwidth", bandwidth, positive=True)
    elif bandwidth is not None:
        raise ValueError(f"bandwidth is only used with mixture='gaussian', got {bandwidth!r}")
    diagonals = parameters.diagonals
    if mixture == "zero_one":
        if not jnp.issubdtype(diagonals.dtype, jnp.complexfloating):
            return jnp.exp(_zero_one_log_features(x, projection, parameters, side)).astype(x.dtype)
        alphas, active = _zero_one_blocks(x, parameters, side)
        real, imag = transform(x[..., None, :], alphas, side, diagonal=True)
        phi = features_from_transformed(real, imag, projection, side, x.dtype)
        phi = phi[..., None, :, :] if side == "query" else phi[..., :, None, :]
        blocks = jnp.where(active, phi, 0)  # (..., k_q, k_k, w)
        return merge_trailing_axes(blocks, 3)
    real, imag = transform(x[..., None, None, :], diagonals, side, diagonal=True)
    phi = features_from_transformed(real, imag, projection, side, x.dtype)  # (..., kq, kk, w)
    bandwidth = cast(float, bandwidth)  # mixture == "gaussian": validated above
    if side == "query":
        weights = _mixture_weights(x, parameters.query_centres, bandwidth)[..., :, None, None]
    else:
        weights = _mixture_weights(x, parameters.key_centres, bandwidth)[..., None, :, None]
    blocks = weights * phi
    default = positive_features(x, projection, antithetic=True)
    total = jnp.sum(weights, axis=(-3, -2))  # sum_i g_i(x) (or sum_j g'_j(y)), shape (..., 1)
    sign = 1.0 if side == "query" else -1.0
    return concatenate_blocks([merge_trailing_axes(blocks, 3), default, sign * total * default])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClusterHybridFeatureMap(ExponentialFeatureMap):
    """The zero-one cluster-adapted hybrid with real diagonal CE matrices (HRF Def. H.2, Eq. 88)
    as a ``FeatureMap``: log_features = ``cluster_hybrid_log_features`` with the diagonals of
    its centres (``cluster_hybrid_parameters``), width k^2 m. Registered as
    ``"cluster_hybrid"``.

    ``init`` sets each centre set that is not set to zeros (every input in cluster 0, A = I:
    the plain positive estimator when both are); ``fit`` runs k-means on the queries and on the keys
    (``fit_cluster_hybrid``). The features span a wide range (|A x| is up to ``max_scale`` |x|),
    so a row's stabilised normaliser can underflow in attention.

    Attributes:
      num_clusters: k query and k key clusters.
      num_iterations: Lloyd steps of each k-means in ``fit``.
      max_scale: the bound on |alpha| and 1/|alpha| (``cluster_adapted_diagonals``).
      query_centres: r_i, shape ``(k, d)``; ``None`` until ``init`` or ``fit``.
      key_centres: r'_j, shape ``(k, d)``.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Sec. 2.4, App. H.2-H.3.
    """

    num_clusters: int = dataclasses.field(default=2, metadata={"static": True})
    num_iterations: int = dataclasses.field(default=25, metadata={"static": True})
    max_scale: float = dataclasses.field(default=10.0, metadata={"static": True})
    query_centres: jax.Array | None = None
    key_centres: jax.Array | None = None

    symmetric = False
    needs_denominator_floor = True
    fitted_fields = ("query_centres", "key_centres")

    def __post_init__(self):
        check_int("num_clusters", self.num_clusters, minimum=1)
        check_iterations(
            "num_iterations", check_int("num_iterations", self.num_iterations, minimum=0)
        )

    def init(self, key: jax.Array, dim: int, *, dtype: DTypeLike = jnp.float32) -> FeatureMap:
        del key  # nothing random
        if self.query_centres is not None and self.key_centres is not None:
            return self
        dim = check_int("dim", dim, minimum=1)
        shape = (self.num_clusters, dim)
        check_array_size(
            "the cluster centres", shape, dtype, {"num_clusters": self.num_clusters, "dim": dim}
        )
        zeros = jnp.zeros(shape, dtype)
        query_centres = zeros if self.query_centres is None else self.query_centres
        key_centres = zeros if self.key_centres is None else self.key_centres
        return self.replace(query_centres=query_centres, key_centres=key_centres)

    def fit(self, key: jax.Array, queries: jax.Array, keys: jax.Array) -> FeatureMap:
        parameters = fit_cluster_hybrid(
            key,
            queries,
            keys,
            self.num_clusters,
            self.num_clusters,
            num_iterations=self.num_iterations,
            max_scale=self.max_scale,
        )
        return self.replace(
            query_centres=parameters.query_centres, key_centres=parameters.key_centres
        )

    def log_features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        if self.query_centres is None or self.key_centres is None:
            raise ValueError(
                "ClusterHybridFeatureMap has no centres: call .init(key, dim) or .fit(...) first"
            )
        parameters = cluster_hybrid_parameters(
            self.query_centres, self.key_centres, max_scale=self.max_scale
        )
        return cluster_hybrid_log_features(x, projection, parameters, side=side)
