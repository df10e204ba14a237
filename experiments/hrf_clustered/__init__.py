"""Cluster-adapted hybrid features vs FAVOR+ and trig features on clustered data (HRF Table 3).

Data (HRF App. H.1/H.3). Two query clusters and two key clusters, N(mean, sigma^2 I) in d = 16
dimensions. With the real diagonal A_ij of Eq. 88, the centre loss L = |A r + A^{-1} r'|^2
(Eq. 21) of a query mean r and key mean r' is sum_k 4 |r_k r'_k| over the coordinates where
they agree in sign, i.e. L = 2 (T + r.r') with T = sum_k |r_k r'_k|, while FAVOR+ has
L_F = |r + r'|^2. Three generators of the means (``GENERATORS``):

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

The price of a small L at a given angle: the real diagonal rescales coordinate k by
alpha_k = sqrt(|r'_k / r_k|), so the noise of points around the centres enters
|A x + A^{-1} y|^2 amplified by sum_k (alpha_k^2 + alpha_k^-2) / (2 d) relative to FAVOR+
(``noise_gain``; 1 / (T / |r|^2) for the sign-pattern generators).

Per configuration the data, the random pairs and the fitted clusters are fixed; each repetition
(one key) draws one set of projections, used by all three estimators (common random numbers, so
the estimators are paired by repetition), and measures the MSE of SM(x, y) = exp(x.y) averaged
over the pairs. All repetitions of one m run in one vmapped call; repetitions of different m
use independent keys. ``measure`` computes, ``report`` writes the tables, the figure and the
summary (claims and verdicts from ``experiments/hrf_clustered/summary.md``).
"""

from __future__ import annotations

import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, stats, verdicts
from experiments.core.stats import Estimate
from experiments.core.validate import require_couplings_draw, require_names, require_positive
from rfjax import features, projections

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ESTIMATORS = ("cluster_hrf", "favor_plus", "trigonometric")
LABELS = {"cluster_hrf": "cluster-HRF", "favor_plus": "FAVOR+", "trigonometric": "trig"}

PAPER_FEATURE_COUNTS = (20, 50, 80, 100, 120, 150, 200)
# HRF paper Table 3: [min, max] MSE over 20 repetitions per m in PAPER_FEATURE_COUNTS, for its
# four configurations in the order of the table (its row labels were lost in the seed; the
# order small-L/small-sigma, small-L/large-sigma, large-L/small-sigma, large-L/large-sigma is
# inferred from the values).
PAPER_TABLE_3 = (
    {
        "cluster_hrf": ((16, 183), (11, 81), (5, 52), (6, 36), (4, 25), (3, 20), (2, 10)),
        "favor_plus": (
            (71, 1455),
            (26, 2541),
            (32, 282),
            (22, 528),
            (28, 534),
            (14, 582),
            (13, 205),
        ),
        "trigonometric": ((39, 808), (31, 510), (10, 281), (13, 170), (12, 135), (7, 134), (4, 87)),
    },
    {
        "cluster_hrf": ((32, 265), (12, 79), (7, 59), (7, 40), (5, 25), (4, 24), (3, 18)),
        "favor_plus": (
            (95, 2071),
            (36, 2123),
            (37, 570),
            (16, 280),
            (13, 262),
            (10, 407),
            (18, 236),
        ),
        "trigonometric": ((36, 989), (19, 565), (8, 208), (10, 164), (7, 246), (4, 190), (4, 134)),
    },
    {
        "cluster_hrf": ((83, 300), (46, 183), (29, 105), (24, 56), (20, 46), (15, 41), (11, 31)),
        "favor_plus": (
            (362, 1218),
            (125, 1262),
            (108, 281),
            (77, 421),
            (77, 402),
            (49, 395),
            (37, 150),
        ),
        "trigonometric": ((174, 490), (81, 249), (44, 143), (41, 95), (34, 77), (25, 73), (18, 50)),
    },
    {
        "cluster_hrf": ((97, 294), (49, 172), (31, 113), (28, 61), (22, 45), (16, 44), (12, 31)),
        "favor_plus": (
            (332, 1553),
            (176, 1345),
            (113, 415),
            (80, 292),
            (65, 185),
            (45, 235),
            (46, 166),
        ),
        "trigonometric": (
            (179, 485),
            (58, 260),
            (38, 110),
            (31, 100),
            (28, 128),
            (21, 94),
            (15, 67),
        ),
    },
)  # in units of 1e-4


def paper_interval(configuration: int, estimator: str, m: int) -> tuple[float, float] | None:
    """The paper's [min, max] MSE, or None where it has no such cell."""
    if configuration >= len(PAPER_TABLE_3) or m not in PAPER_FEATURE_COUNTS:
        return None
    low, high = PAPER_TABLE_3[configuration][estimator][PAPER_FEATURE_COUNTS.index(m)]
    return low * 1e-4, high * 1e-4


GENERATORS = ("paper", "orthogonal", "fixed_loss")
# The claim each generator's configurations are judged under (config.claims).
GENERATOR_CLAIMS = {
    "paper": "paper_generator",
    "orthogonal": "orthogonal_generator",
    "fixed_loss": "angle_sweep",
}


def magnitude_ratio(loss_ratio: float) -> float:
    """rho with 2 rho / (1 + rho^2) = ``loss_ratio`` (in (0, 1]), rho in (0, 1]."""
    if not 0.0 < loss_ratio <= 1.0:
        raise ValueError(f"loss_ratio must be in (0, 1], got {loss_ratio}")
    return (1.0 - math.sqrt(1.0 - loss_ratio**2)) / loss_ratio


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the coupling, the configurations and the sizes before anything runs.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_names(config, "coupling", projections.available())
    require_positive(
        config,
        "dim",
        "points_per_cluster",
        "fixed_loss",
        "num_clusters",
        "kmeans_iterations",
        "max_scale",
        "feature_counts",
        "repetitions",
        "num_pairs",
    )
    for rows in config.feature_counts:
        require_couplings_draw(config, "coupling", config.dim, rows)
    if set(config.centre_norms) != set(GENERATORS) or min(config.centre_norms.values()) <= 0:
        raise ValueError(
            f"config.centre_norms must give a length > 0 for each of {GENERATORS}, got "
            f"{dict(config.centre_norms)}"
        )
    for entry in config.configurations:
        if not (
            len(entry) == 4
            and isinstance(entry[0], str)
            and entry[1] in GENERATORS
            and entry[3] > 0
        ):
            raise ValueError(
                "config.configurations entries must be (name, generator in "
                f"{GENERATORS}, parameter, sigma > 0), got {entry!r}"
            )
        try:
            means(jax.random.key(0), entry[1], entry[2], config)
        except ValueError as error:
            raise ValueError(f"config.configurations entry {entry!r}: {error}") from None


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


def make_configuration(
    key: jax.Array,
    generator: str,
    parameter: float,
    sigma: float,
    config: ml_collections.ConfigDict,
) -> dict:
    """Means, data, random pairs and the fitted cluster-hybrid parameters of one configuration."""
    means_key, query_key, key_key, pair_key, fit_key = jax.random.split(key, 5)
    query_means, key_means = means(means_key, generator, parameter, config)
    queries = clustered_points(query_key, query_means, config.points_per_cluster, sigma)
    keys = clustered_points(key_key, key_means, config.points_per_cluster, sigma)
    first, second = jax.random.split(pair_key)
    x = queries[np.asarray(jax.random.randint(first, (config.num_pairs,), 0, len(queries)))]
    y = keys[np.asarray(jax.random.randint(second, (config.num_pairs,), 0, len(keys)))]
    parameters = features.fit_cluster_hybrid(
        fit_key,
        jnp.asarray(queries, jnp.float32),
        jnp.asarray(keys, jnp.float32),
        config.num_clusters,
        config.num_clusters,
        matrix="real",
        num_iterations=config.kmeans_iterations,
        max_scale=config.max_scale,
    )
    return {
        "x": x,
        "y": y,
        "parameters": parameters,
        "query_means": query_means,
        "key_means": key_means,
    }


def centre_losses(parameters: features.ClusterHybridParameters) -> np.ndarray:
    """L(A_ij) = |A_ij r_i + A_ij^{-1} r'_j|^2 (Eq. 21) for every pair of fitted centres."""
    alpha = np.asarray(parameters.diagonals, np.float64)
    r = np.asarray(parameters.query_centres, np.float64)[:, None, :]
    r_prime = np.asarray(parameters.key_centres, np.float64)[None, :, :]
    return np.sum((alpha * r + r_prime / alpha) ** 2, axis=-1)


def geometry(setup: dict) -> dict[str, float]:
    """Facts of one configuration: L and L_F at the fitted centres, the cosines of the
    query-key means (mean, min and max over the 4 pairs), the largest alpha and the noise gain
    sum (alpha^2 + alpha^-2) / (2 d)."""
    parameters = setup["parameters"]
    losses = centre_losses(parameters)
    r = np.asarray(parameters.query_centres, np.float64)[:, None, :]
    r_prime = np.asarray(parameters.key_centres, np.float64)[None, :, :]
    favor_losses = np.sum((r + r_prime) ** 2, axis=-1)
    q, k = setup["query_means"], setup["key_means"]
    cosines = (q @ k.T) / np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(k, axis=1))
    alpha = np.abs(np.asarray(parameters.diagonals, np.float64))
    return {
        "L_mean": float(losses.mean()),
        "L_favor_mean": float(favor_losses.mean()),
        "L_ratio": float(losses.mean() / favor_losses.mean()),
        "cosine_mean": float(cosines.mean()),
        "cosine_min": float(cosines.min()),
        "cosine_max": float(cosines.max()),
        "max_alpha": float(np.maximum(alpha, 1 / alpha).max()),
        "noise_gain": float(np.mean(alpha**2 + alpha**-2) / 2),
    }


@functools.partial(jax.jit, static_argnums=(0, 1))
def _mean_squared_errors(
    coupling: str,
    num_features: int,
    keys: jax.Array,
    x: jax.Array,
    y: jax.Array,
    parameters: features.ClusterHybridParameters,
) -> jax.Array:
    """MSE over the pairs per repetition and estimator, all three on the repetition's
    projections (common random numbers): shape (num_keys, 3)."""
    sampler = projections.get(coupling)
    exact = jnp.exp(jnp.sum(x * y, axis=-1))

    def one_repetition(key):
        w = sampler(key, x.shape[-1], num_features)
        cluster = features.estimate(
            features.cluster_hybrid_features(x, w, parameters, side="query"),
            features.cluster_hybrid_features(y, w, parameters, side="key"),
        )
        favor = features.estimate(
            features.positive_features(x, w), features.positive_features(y, w)
        )
        trig = features.estimate(
            features.trigonometric_features(x, w), features.trigonometric_features(y, w)
        )
        return jnp.stack([jnp.mean((e - exact) ** 2) for e in (cluster, favor, trig)])

    return jax.vmap(one_repetition)(keys)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Per (configuration, m) the MSE of every estimator in every repetition (``draws``), the
    geometry of every configuration (``facts``) and the run's wall time and load. Writes
    nothing."""
    del workdir  # nothing to resume
    start = time.time()
    data_key, draw_key = jax.random.split(jax.random.key(config.seed))
    draws, facts = [], []
    for c_index, (name, generator, parameter, sigma) in enumerate(config.configurations):
        setup = make_configuration(
            jax.random.fold_in(data_key, c_index), generator, parameter, sigma, config
        )
        facts.append(
            {
                "configuration": name,
                "generator": generator,
                "parameter": parameter,
                "sigma": sigma,
                **geometry(setup),
            }
        )
        x = jnp.asarray(setup["x"], jnp.float32)
        y = jnp.asarray(setup["y"], jnp.float32)
        for m in outputs.progress(config.feature_counts, f"{name:>40} m"):
            keys = jax.random.split(
                jax.random.fold_in(jax.random.fold_in(draw_key, c_index), m), config.repetitions
            )
            mse = np.asarray(
                _mean_squared_errors(config.coupling, m, keys, x, y, setup["parameters"]),
                np.float64,
            )
            draws.append(
                {
                    "configuration": name,
                    "num_features": int(m),
                    **{e: mse[:, i].tolist() for i, e in enumerate(ESTIMATORS)},
                }
            )
    run = {"seconds": time.time() - start, "load_average": os.getloadavg()[0]}
    return {"draws": draws, "facts": facts, "run": run}


# --------------------------------------------------------------------------- report


def summary_rows(draws: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Rows per (configuration, m, estimator): min / mean / SE / max of the MSE over
    repetitions (``results.csv``)."""
    entries = {entry[0]: entry for entry in config.configurations}
    rows = []
    for draw in draws:
        _, generator, parameter, sigma = entries[draw["configuration"]]
        for estimator in ESTIMATORS:
            mse = np.asarray(draw[estimator])
            rows.append(
                {
                    "configuration": draw["configuration"],
                    "generator": generator,
                    "parameter": float(parameter),
                    "sigma": float(sigma),
                    "num_features": draw["num_features"],
                    "estimator": estimator,
                    "mse_min": float(mse.min()),
                    "mse_mean": float(mse.mean()),
                    "mse_se": float(stats.mean_se(mse)[1]),
                    "mse_max": float(mse.max()),
                }
            )
    return rows


def log_ratio(draw: dict, baseline: str) -> Estimate:
    """The paired mean over repetitions of ln(MSE baseline / MSE cluster-HRF) at one m
    (positive: cluster-HRF more accurate)."""
    return stats.mean_log_ratio(draw[baseline], draw["cluster_hrf"])


def pooled_log_ratios(draws: list[dict], name: str) -> dict[str, Estimate]:
    """Per baseline, ``log_ratio`` of configuration ``name`` pooled over m (equal weights;
    the repetitions of different m are independent)."""
    mine = [d for d in draws if d["configuration"] == name]
    return {LABELS[b]: stats.pool([log_ratio(d, b) for d in mine]) for b in ESTIMATORS[1:]}


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares: per generator, one test per
    (configuration, baseline) of the paired log MSE ratio pooled over m, judged over the cells
    as a claim about every variant (``Verdicts.every``)."""
    judge = verdicts.Verdicts(config)
    for generator, claim_name in GENERATOR_CLAIMS.items():
        cells = {
            (name, baseline): estimate
            for name, g, _, _ in config.configurations
            if g == generator
            for baseline, estimate in pooled_log_ratios(results["draws"], name).items()
        }
        if not cells:
            judge.not_tested(claim_name, f"no configuration of the {generator!r} generator ran")
            continue
        judge.every(
            claim_name,
            cells,
            effect="mean over m of the paired mean ln(MSE baseline / MSE cluster-HRF)",
            cell_name="(configuration, baseline)",
            units="repetitions",
        )
    judge.not_tested(
        "separation",
        "cluster-HRF's max over repetitions below both baselines' min is a statement about "
        "sample extremes, which have no standard error; the counts are in the table below",
    )
    return judge


def _cells(rows: list[dict], name: str, m: int) -> dict[str, dict]:
    return {
        r["estimator"]: r for r in rows if r["configuration"] == name and r["num_features"] == m
    }


def table_rows(rows: list[dict], draws: list[dict], config: ml_collections.ConfigDict):
    """Table 3 layout: per (configuration, m) the [min, max] of each estimator, the paired log
    ratio to the better baseline in SE and whether cluster-HRF's max is below both baselines'
    min, with the paper's intervals beside (the paper's four configurations matched by order to
    the four of the ``paper`` and ``orthogonal`` generators)."""
    out = []
    for name, generator, _, _ in config.configurations:
        order = [e[0] for e in config.configurations if e[1] == generator].index(name)
        for m in config.feature_counts:
            cells = _cells(rows, name, m)
            draw = next(d for d in draws if d["configuration"] == name and d["num_features"] == m)
            row = {"configuration": name, "m": m}
            for estimator in ESTIMATORS:
                r = cells[estimator]
                row[LABELS[estimator]] = f"[{r['mse_min']:.4f}, {r['mse_max']:.4f}]"
            gap = min((log_ratio(draw, b) for b in ESTIMATORS[1:]), key=lambda e: e.mean)
            row["ln ratio to best baseline (z)"] = f"{gap.mean:+.2f} ({gap.t:+.1f})"
            row["max < both mins"] = cells["cluster_hrf"]["mse_max"] < min(
                cells[e]["mse_min"] for e in ESTIMATORS[1:]
            )
            paper = [paper_interval(order, e, m) for e in ESTIMATORS]
            row["paper cluster / FAVOR+ / trig"] = (
                " ".join(f"[{cell[0]:.4f}, {cell[1]:.4f}]" for cell in paper if cell)
                if generator != "fixed_loss" and all(paper)
                else "-"
            )
            out.append(row)
    return out


def paper_separated_rows() -> tuple[int, int]:
    """How many rows of the paper's Table 3 have cluster-HRF's max below both baselines' min."""
    count = total = 0
    for configuration in range(len(PAPER_TABLE_3)):
        for m in PAPER_FEATURE_COUNTS:
            cluster, *others = (paper_interval(configuration, e, m) for e in ESTIMATORS)
            if cluster is None or None in others:
                continue  # every cell of Table 3 is there: this does not happen
            count += cluster[1] < min(cell[0] for cell in others if cell)
            total += 1
    return count, total


def configuration_rows(draws: list[dict], facts: list[dict], config) -> list[dict]:
    """Per configuration: its geometry, FAVOR+'s mean MSE at the smallest m, the paired log
    ratio to each baseline pooled over m (± SE) and at how many m cluster-HRF's max is below
    both baselines' min."""
    first_m = min(config.feature_counts)
    result = []
    for fact in facts:
        name = fact["configuration"]
        mine = [d for d in draws if d["configuration"] == name]
        separated = sum(
            max(d["cluster_hrf"]) < min(min(d[e]) for e in ESTIMATORS[1:]) for d in mine
        )
        favor = next(d for d in mine if d["num_features"] == first_m)["favor_plus"]
        row = {
            "configuration": name,
            "L / L_F": f"{fact['L_ratio']:.2f}",
            "cos(r, r')": f"{fact['cosine_mean']:+.2f} [{fact['cosine_min']:+.2f}, "
            f"{fact['cosine_max']:+.2f}]",
            "max alpha": f"{fact['max_alpha']:.2f}",
            "noise gain": f"{fact['noise_gain']:.2f}",
            f"FAVOR+ mean MSE, m = {first_m}": f"{np.mean(favor):.3f}",
        }
        for baseline, estimate in pooled_log_ratios(draws, name).items():
            row[f"ln(MSE {baseline} / cluster-HRF)"] = f"{estimate.mean:+.2f} ± {estimate.se:.2f}"
        row["max < both mins (m)"] = f"{separated} of {len(mine)}"
        result.append(row)
    return result


def sweep_text(draws: list[dict], facts: list[dict]) -> str:
    """The angle sweep's effects at its two ends, per sigma ("(not run)" without a sweep)."""
    sweep = [f for f in facts if f["generator"] == "fixed_loss"]
    parts = []
    for sigma in sorted({f["sigma"] for f in sweep}):
        ends = sorted((f for f in sweep if f["sigma"] == sigma), key=lambda f: f["cosine_mean"])
        texts = []
        for fact in (ends[0], ends[-1]):
            effects = pooled_log_ratios(draws, fact["configuration"])
            texts.append(
                f"cos {fact['cosine_mean']:+.2f}: "
                + ", ".join(f"{b} {e.mean:+.2f} ± {e.se:.2f}" for b, e in effects.items())
            )
        parts.append(f"sigma = {sigma:g}: " + " -> ".join(texts))
    return "; ".join(parts) or "(not run)"


PANELS_PER_ROW = 6


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Mean MSE vs m (band: min to max over repetitions) per configuration, log MSE axis
    (Fig. 6), the rows of panels by generator (at most ``PANELS_PER_ROW`` to a row)."""
    by_generator = []
    for generator in GENERATORS:
        entries = [e for e in config.configurations if e[1] == generator]
        by_generator += [
            entries[start : start + PANELS_PER_ROW]
            for start in range(0, len(entries), PANELS_PER_ROW)
        ]
    width = max(len(entries) for entries in by_generator)
    fig, axes = plt.subplots(
        len(by_generator), width, figsize=(3.2 * width, 3.0 * len(by_generator)), squeeze=False
    )
    for panels, entries in zip(axes, by_generator, strict=True):
        for ax in panels[len(entries) :]:
            ax.axis("off")
        for ax, (name, _, _, _) in zip(panels, entries, strict=False):
            for index, estimator in enumerate(ESTIMATORS):
                mine = [
                    r for r in rows if r["configuration"] == name and r["estimator"] == estimator
                ]
                m = [r["num_features"] for r in mine]
                color = f"C{index}"
                ax.plot(m, [r["mse_mean"] for r in mine], "o-", ms=3, color=color)
                ax.fill_between(
                    m,
                    [r["mse_min"] for r in mine],
                    [r["mse_max"] for r in mine],
                    color=color,
                    alpha=0.2,
                    label=LABELS[estimator],
                )
            ax.set_yscale("log")
            ax.set_title(name, fontsize=7)
    axes[0][0].set_ylabel("MSE of SM-hat")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"Clustered data, d = {config.dim}: mean MSE (line) and min-max band over "
        f"{config.repetitions} repetitions vs m",
        fontsize=9,
    )
    outputs.save_figure(fig, path)


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``configurations.csv``, ``mse_vs_m.png``, ``summary.md``,
    ``verdicts.json`` and ``config.json``."""
    draws, facts, run = results["draws"], results["facts"], results["run"]
    rows = summary_rows(draws, config)
    per_configuration = configuration_rows(draws, facts, config)
    paper_count, paper_total = paper_separated_rows()
    spreads = [r["mse_max"] / r["mse_min"] for r in rows if r["mse_min"] > 0]
    verdicts.write_summary(
        workdir,
        "hrf_clustered",
        judge(results, config),
        config,
        spread_low=f"{min(spreads):.0f}",
        spread_high=f"{max(spreads):.0f}",
        paper_separated=paper_count,
        paper_rows=paper_total,
        run_time=f"{outputs.format_duration(run['seconds'])} (1-min load average "
        f"{run['load_average']:.1f} at its end)",
        sweep=sweep_text(draws, facts),
        configuration_table=outputs.markdown_table(per_configuration),
        table=outputs.markdown_table(table_rows(rows, draws, config)),
    )
    outputs.write_csvs(workdir, {"results.csv": rows, "configurations.csv": facts})
    plot(rows, config, os.path.join(workdir, "mse_vs_m.png"))
    print(outputs.markdown_table(per_configuration))
    return {"rows": rows, "facts": facts, "configurations": per_configuration}
