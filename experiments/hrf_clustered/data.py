"""The clustered data of the cluster-HRF study: generators of the cluster means, the points, their
normalisation (App. H.3) and the facts of each configuration.

Two query clusters and two key clusters, N(mean, sigma^2 I) in d = 16 dimensions. With the real
diagonal A_ij of Eq. 88, the centre loss L = |A r + A^{-1} r'|^2 (Eq. 21) of a query mean r and
key mean r' is sum_k 4 |r_k r'_k| over the coordinates where they agree in sign, i.e.
L = 2 (T + r.r') with T = sum_k |r_k r'_k|, while FAVOR+ has L_F = |r + r'|^2. Three generators
of the means (``GENERATORS``):

- ``paper`` (App. H.3, as commit b8822e7 implemented it): u, v ~ N(0, I_d), Haar-random Q_1..Q_4,
  query means Q_1 u, Q_2 u, key means Q_3 v, Q_4 v, every mean rescaled to the generator's
  length; both query means take the signs s of Q_1 u, both key means -s, flipped back to s on a
  random fraction of the coordinates ("To control the value of L, we manually adjust the sign
  of each element"). All signs opposite gives L = 0 at every pair of centres, but then
  r.r' = -T < 0, where positive features are nearly exact and trigonometric ones poor: L moves
  with the angle.
- ``orthogonal``: every query-key pair of means is orthogonal (r.r' = 0) and L is set through
  the magnitudes alone (``sign_pattern_means`` with half the signs agreeing):
  L / L_F = T / |r|^2 = 2 rho / (1 + rho^2).
- ``fixed_loss``: the angle sweep at a fixed L = ``fixed_loss`` |r|^2 (``sign_pattern_means``
  with a fraction f of agreeing signs and T / |r|^2 = L / (4 f |r|^2), so cos(r, r') =
  T (2 f - 1) / |r|^2).

Then, as App. H.3 does "after this step", every point is rescaled to one length, the point
norm c (``normalised``: "we normalize the data points by controlling their norms to make the
true softmax value be within a reasonable range"; the paper gives no value), so that
SM(x, y) = exp(x.y) lies in [e^{-c^2}, e^{c^2}]. The means' length before it sets the noise
relative to the centres (sigma / length).

The price of a small L at a given angle: the real diagonal rescales coordinate k by
alpha_k = sqrt(|r'_k / r_k|), so the noise of points around the centres enters
|A x + A^{-1} y|^2 amplified by sum_k (alpha_k^2 + alpha_k^-2) / (2 d) relative to FAVOR+
(``geometry``'s noise gain; 1 / (T / |r|^2) for the sign-pattern generators).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rfjax import features

GENERATORS = ("paper", "orthogonal", "fixed_loss")
# The two cluster-HRF estimators: A of Eq. 88 as the paper defines it (App. H.2: a "large
# positive number" only where a centre coordinate is 0; config.unclipped_scale), and rfjax's
# default clip of every alpha to [1 / max_scale, max_scale] (config.max_scale).
CLUSTER_ESTIMATORS = ("cluster_hrf", "cluster_hrf_clipped")
BASELINES = ("favor_plus", "trigonometric")
ESTIMATORS = (*CLUSTER_ESTIMATORS, *BASELINES)  # measured on every configuration, in this order


def magnitude_ratio(loss_ratio: float) -> float:
    """rho with 2 rho / (1 + rho^2) = ``loss_ratio`` (in (0, 1]), rho in (0, 1]."""
    if not 0.0 < loss_ratio <= 1.0:
        raise ValueError(f"loss_ratio must be in (0, 1], got {loss_ratio}")
    return (1.0 - math.sqrt(1.0 - loss_ratio**2)) / loss_ratio


def sign_pattern_means(
    key: jax.Array, dim: int, agreeing: int, product: float, norm: float
) -> tuple[np.ndarray, np.ndarray]:
    """Query means (2, d) and key means (2, d) of length ``norm`` whose every query-key pair
    agrees in sign on exactly ``agreeing`` coordinates, with |r_k r'_k| the same in every
    coordinate: T = sum_k |r_k r'_k| = ``product`` norm^2, L = 4 (agreeing / d) T and
    r.r' = (2 agreeing / d - 1) T for every pair.

    Signs: s at random; the second query mean flips s on a random half F of the coordinates, the
    key means on d - ``agreeing`` coordinates each, half of F (complementary halves for the two
    keys) and the same others outside F. Magnitudes: queries 1 on a random half H of the
    coordinates and rho = ``magnitude_ratio(product)`` elsewhere, keys rho on H and 1 elsewhere.

    Raises:
      ValueError: unless d is a multiple of 4, d / 4 <= ``agreeing`` <= 3 d / 4 and
        ``product`` is in (0, 1].
    """
    if dim % 4 or not dim // 4 <= agreeing <= 3 * dim // 4:
        raise ValueError(
            f"agreeing must be in [d / 4, 3 d / 4] = [{dim // 4}, {3 * dim // 4}] with d a "
            f"multiple of 4, got agreeing = {agreeing}, d = {dim}"
        )
    rho = magnitude_ratio(product)
    sign_key, flip_key, heavy_key = jax.random.split(key, 3)
    signs = np.where(np.asarray(jax.random.bernoulli(sign_key, 0.5, (dim,))), 1.0, -1.0)
    order = np.asarray(jax.random.permutation(flip_key, dim))
    half, quarter, outside = dim // 2, dim // 4, dim - agreeing - dim // 4
    flips = [
        order[:half],
        np.concatenate([order[:quarter], order[half : half + outside]]),
        np.concatenate([order[quarter:half], order[half : half + outside]]),
    ]
    patterns = [signs.copy() for _ in range(4)]
    for pattern, flipped in zip(patterns[1:], flips, strict=True):
        pattern[flipped] *= -1
    heavy = np.zeros(dim, bool)
    heavy[np.asarray(jax.random.permutation(heavy_key, dim))[:half]] = True
    query_magnitude = np.where(heavy, 1.0, rho)
    key_magnitude = np.where(heavy, rho, 1.0)
    scale = norm / np.linalg.norm(query_magnitude)
    query = np.stack(patterns[:2]) * query_magnitude * scale
    keys = np.stack(patterns[2:]) * key_magnitude * scale
    return query, keys


def paper_means(
    key: jax.Array, dim: int, agreeing_fraction: float, norm: float
) -> tuple[np.ndarray, np.ndarray]:
    """Query means (Q_1 u, Q_2 u) and key means (Q_3 v, Q_4 v), sign-adjusted (App. H.3; the
    construction of commit b8822e7).

    Both query means take the signs s of Q_1 u; both key means take -s, flipped back to s on a
    random ``agreeing_fraction`` of the coordinates. Each mean is rescaled to length ``norm``.
    Returns arrays of shape (2, d) and (2, d).
    """
    if not 0.0 <= agreeing_fraction <= 1.0:
        raise ValueError(f"agreeing_fraction must be in [0, 1], got {agreeing_fraction}")
    keys = jax.random.split(key, 7)
    u, v = (np.asarray(jax.random.normal(k, (dim,)), np.float64) for k in keys[:2])
    rotations = [np.asarray(jax.random.orthogonal(k, dim), np.float64) for k in keys[2:6]]
    query = np.stack([rotations[0] @ u, rotations[1] @ u])
    key_means = np.stack([rotations[2] @ v, rotations[3] @ v])
    signs = np.sign(query[0])
    agree = np.zeros(dim, bool)
    agree[np.asarray(jax.random.permutation(keys[6], dim))[: round(agreeing_fraction * dim)]] = True
    query = signs * np.abs(query)
    key_means = np.where(agree, signs, -signs) * np.abs(key_means)
    query *= norm / np.linalg.norm(query, axis=1, keepdims=True)
    key_means *= norm / np.linalg.norm(key_means, axis=1, keepdims=True)
    return query, key_means


def means(
    key: jax.Array, generator: str, parameter: float, config: ml_collections.ConfigDict
) -> tuple[np.ndarray, np.ndarray]:
    """The query and key means of one configuration (see the module docstring).

    ``parameter``: the agreeing sign fraction (``paper``, ``fixed_loss``) or L / L_F
    (``orthogonal``).

    Raises:
      ValueError: for an unknown generator or a parameter it cannot realise.
    """
    dim, norm = config.dim, config.centre_norms[generator]
    if generator == "paper":
        return paper_means(key, dim, parameter, norm)
    if generator == "orthogonal":
        return sign_pattern_means(key, dim, dim // 2, parameter, norm)
    if generator == "fixed_loss":
        agreeing = round(parameter * dim)
        if abs(agreeing - parameter * dim) > 1e-9 or agreeing == 0:
            raise ValueError(
                f"a fixed_loss parameter must be a fraction k / d of the d = {dim} coordinates "
                f"with k >= 1, got {parameter}"
            )
        product = config.fixed_loss * dim / (4 * agreeing)  # T / |r|^2 = L / (4 f |r|^2)
        if product > 1:
            raise ValueError(
                f"fixed_loss = {config.fixed_loss} needs an agreeing fraction >= "
                f"{config.fixed_loss / 4:g} (T <= |r|^2), got {parameter}"
            )
        return sign_pattern_means(key, dim, agreeing, product, norm)
    raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")


def clustered_points(key: jax.Array, means: np.ndarray, count: int, sigma: float) -> np.ndarray:
    """``count`` points N(mean, sigma^2 I) per mean, stacked: shape (len(means) count, d)."""
    noise = np.asarray(jax.random.normal(key, (means.shape[0], count, means.shape[1])))
    return (means[:, None, :] + sigma * noise).reshape(-1, means.shape[1])


def normalised(points: np.ndarray, norm: float) -> np.ndarray:
    """Every point (row) rescaled to length ``norm`` (App. H.3's normalisation).

    Raises:
      ValueError: unless ``norm`` > 0 and every point is non-zero.
    """
    lengths = np.linalg.norm(points, axis=-1, keepdims=True)
    if not norm > 0 or not np.all(lengths > 0):
        raise ValueError(f"norm must be > 0 and every point non-zero, got norm = {norm}")
    return norm * points / lengths


def make_configuration(
    key: jax.Array,
    generator: str,
    parameter: float,
    sigma: float,
    config: ml_collections.ConfigDict,
) -> dict:
    """Means, points and random pairs (indices) of one configuration, before normalisation; the
    key of its k-means fits."""
    means_key, query_key, key_key, pair_key, fit_key = jax.random.split(key, 5)
    query_means, key_means = means(means_key, generator, parameter, config)
    queries = clustered_points(query_key, query_means, config.points_per_cluster, sigma)
    keys = clustered_points(key_key, key_means, config.points_per_cluster, sigma)
    first, second = jax.random.split(pair_key)
    return {
        "queries": queries,
        "keys": keys,
        "query_index": np.asarray(jax.random.randint(first, (config.num_pairs,), 0, len(queries))),
        "key_index": np.asarray(jax.random.randint(second, (config.num_pairs,), 0, len(keys))),
        "query_means": query_means,
        "key_means": key_means,
        "fit_key": fit_key,
    }


def at_point_norm(setup: dict, point_norm: float, config: ml_collections.ConfigDict) -> dict:
    """One configuration with every point rescaled to ``point_norm``: the pairs ``x``, ``y``
    and, per cluster-HRF estimator (``CLUSTER_ESTIMATORS``), its parameters fitted to the
    rescaled points (one k-means fit, the same centres for both)."""
    queries = normalised(setup["queries"], point_norm)
    keys = normalised(setup["keys"], point_norm)
    fitted = features.fit_cluster_hybrid(
        setup["fit_key"],
        jnp.asarray(queries, jnp.float32),
        jnp.asarray(keys, jnp.float32),
        config.num_clusters,
        config.num_clusters,
        matrix="real",
        num_iterations=config.kmeans_iterations,
        max_scale=config.unclipped_scale,
    )
    clipped = features.cluster_hybrid_parameters(
        fitted.query_centres, fitted.key_centres, matrix="real", max_scale=config.max_scale
    )
    return {
        "x": queries[setup["query_index"]],
        "y": keys[setup["key_index"]],
        "parameters": dict(zip(CLUSTER_ESTIMATORS, (fitted, clipped), strict=True)),
    }


def centre_losses(parameters: features.ClusterHybridParameters) -> np.ndarray:
    """L(A_ij) = |A_ij r_i + A_ij^{-1} r'_j|^2 (Eq. 21) for every pair of fitted centres."""
    alpha = np.asarray(parameters.diagonals, np.float64)
    r = np.asarray(parameters.query_centres, np.float64)[:, None, :]
    r_prime = np.asarray(parameters.key_centres, np.float64)[None, :, :]
    return np.sum((alpha * r + r_prime / alpha) ** 2, axis=-1)


def geometry(setup: dict, normalised_setup: dict) -> dict[str, float]:
    """Facts of one configuration at one point norm: L and L_F at the fitted centres (the
    paper's A), the cosines of the query-key means (mean, min and max over the 4 pairs), the
    range of SM(x, y) over the pairs, and per cluster-HRF estimator the largest alpha (or
    1 / alpha) and the noise gain sum (alpha^2 + alpha^-2) / (2 d)."""
    parameters = normalised_setup["parameters"]
    losses = centre_losses(parameters["cluster_hrf"])
    r = np.asarray(parameters["cluster_hrf"].query_centres, np.float64)[:, None, :]
    r_prime = np.asarray(parameters["cluster_hrf"].key_centres, np.float64)[None, :, :]
    favor_losses = np.sum((r + r_prime) ** 2, axis=-1)
    q, k = setup["query_means"], setup["key_means"]
    cosines = (q @ k.T) / np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(k, axis=1))
    softmax = np.exp(np.sum(normalised_setup["x"] * normalised_setup["y"], axis=-1))
    facts = {
        "L_mean": float(losses.mean()),
        "L_favor_mean": float(favor_losses.mean()),
        "L_ratio": float(losses.mean() / favor_losses.mean()),
        "cosine_mean": float(cosines.mean()),
        "cosine_min": float(cosines.min()),
        "cosine_max": float(cosines.max()),
        "softmax_min": float(softmax.min()),
        "softmax_max": float(softmax.max()),
    }
    for estimator in CLUSTER_ESTIMATORS:
        alpha = np.abs(np.asarray(parameters[estimator].diagonals, np.float64))
        facts[f"max_alpha_{estimator}"] = float(np.maximum(alpha, 1 / alpha).max())
        facts[f"noise_gain_{estimator}"] = float(np.mean(alpha**2 + alpha**-2) / 2)
    return facts
