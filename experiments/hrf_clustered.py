"""Cluster-adapted hybrid features vs FAVOR+ and trig features on clustered data (Table 3).

Per configuration the data, the random pairs and the fitted clusters are fixed; each
repetition (one key) draws fresh projections for every estimator and measures the MSE of
SM(x, y) = exp(x.y) averaged over the pairs. All repetitions of one m run in one vmapped call.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from configs.common import require_names, require_positive
from experiments import outputs
from rfjax import features, projections

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ESTIMATORS = ("cluster_hrf", "favor_plus", "trigonometric")
LABELS = {"cluster_hrf": "cluster-HRF", "favor_plus": "FAVOR+", "trigonometric": "trig"}


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
        "centre_norm",
        "num_clusters",
        "kmeans_iterations",
        "max_scale",
        "feature_counts",
        "repetitions",
        "num_pairs",
    )
    for entry in config.configurations:
        if not (
            len(entry) == 3 and isinstance(entry[0], str) and 0 <= entry[1] <= 1 and entry[2] > 0
        ):
            raise ValueError(
                "config.configurations entries must be (name, agreeing fraction in [0, 1], "
                f"sigma > 0), got {entry!r}"
            )


def cluster_means(
    key: jax.Array, dim: int, agreeing_fraction: float, norm: float
) -> tuple[np.ndarray, np.ndarray]:
    """Query means (Q_1 u, Q_2 u) and key means (Q_3 v, Q_4 v), sign-adjusted (App. H.3).

    Both query means take the signs s of Q_1 u; both key means take -s, flipped on a random
    ``agreeing_fraction`` of the coordinates. Each mean is rescaled to length ``norm``.
    Returns arrays of shape (2, d) and (2, d).
    """
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


def clustered_points(key: jax.Array, means: np.ndarray, count: int, sigma: float) -> np.ndarray:
    """``count`` points N(mean, sigma^2 I) per mean, stacked: shape (len(means) count, d)."""
    noise = np.asarray(jax.random.normal(key, (means.shape[0], count, means.shape[1])))
    return (means[:, None, :] + sigma * noise).reshape(-1, means.shape[1])


def make_configuration(
    key: jax.Array, agreeing_fraction: float, sigma: float, config: ml_collections.ConfigDict
) -> dict:
    """Data, random pairs and the fitted cluster-hybrid parameters of one configuration."""
    means_key, query_key, key_key, pair_key, fit_key = jax.random.split(key, 5)
    query_means, key_means = cluster_means(
        means_key, config.dim, agreeing_fraction, config.centre_norm
    )
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
    return {"x": x, "y": y, "parameters": parameters}


def centre_losses(parameters: features.ClusterHybridParameters) -> np.ndarray:
    """L(A_ij) = |A_ij r_i + A_ij^{-1} r'_j|^2 (Eq. 21) for every pair of fitted centres."""
    alpha = np.asarray(parameters.diagonals, np.float64)
    r = np.asarray(parameters.query_centres, np.float64)[:, None, :]
    r_prime = np.asarray(parameters.key_centres, np.float64)[None, :, :]
    return np.sum((alpha * r + r_prime / alpha) ** 2, axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _mean_squared_errors(
    coupling: str,
    num_features: int,
    keys: jax.Array,
    x: jax.Array,
    y: jax.Array,
    parameters: features.ClusterHybridParameters,
) -> jax.Array:
    """MSE over the pairs per repetition and estimator: shape (num_keys, 3)."""
    sampler = projections.get(coupling)
    dim = x.shape[-1]
    exact = jnp.exp(jnp.sum(x * y, axis=-1))

    def one_repetition(key):
        k = jax.random.split(key, 3)
        w = sampler(k[0], dim, num_features)
        cluster = features.estimate(
            features.cluster_hybrid_features(x, w, parameters, side="query"),
            features.cluster_hybrid_features(y, w, parameters, side="key"),
        )
        w = sampler(k[1], dim, num_features)
        favor = features.estimate(
            features.positive_features(x, w), features.positive_features(y, w)
        )
        w = sampler(k[2], dim, num_features)
        trig = features.estimate(
            features.trigonometric_features(x, w), features.trigonometric_features(y, w)
        )
        return jnp.stack([jnp.mean((e - exact) ** 2) for e in (cluster, favor, trig)])

    return jax.vmap(one_repetition)(keys)


def measure(config: ml_collections.ConfigDict) -> tuple[list[dict], dict[str, list[float]]]:
    """Rows per (configuration, m, estimator) with min/mean/max MSE; L of the centre pairs."""
    data_key, draw_key = jax.random.split(jax.random.key(config.seed))
    rows, losses = [], {}
    for c_index, (name, agreeing, sigma) in enumerate(config.configurations):
        setup = make_configuration(jax.random.fold_in(data_key, c_index), agreeing, sigma, config)
        losses[name] = [float(v) for v in centre_losses(setup["parameters"]).ravel()]
        x = jnp.asarray(setup["x"], jnp.float32)
        y = jnp.asarray(setup["y"], jnp.float32)
        for m in outputs.progress(config.feature_counts, f"{name:>22} m"):
            keys = jax.random.split(
                jax.random.fold_in(jax.random.fold_in(draw_key, c_index), m), config.repetitions
            )
            mse = np.asarray(
                _mean_squared_errors(config.coupling, m, keys, x, y, setup["parameters"]),
                np.float64,
            )
            for e, estimator in enumerate(ESTIMATORS):
                rows.append(
                    {
                        "configuration": name,
                        "agreeing_fraction": float(agreeing),
                        "sigma": float(sigma),
                        "num_features": int(m),
                        "estimator": estimator,
                        "mse_min": float(mse[:, e].min()),
                        "mse_mean": float(mse[:, e].mean()),
                        "mse_max": float(mse[:, e].max()),
                    }
                )
    return rows, losses


def table_rows(rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Table 3 layout: per (configuration, m) the [min, max] of each estimator, and verdicts."""
    out = []
    for name, _, _ in config.configurations:
        for m in config.feature_counts:
            mine = {
                r["estimator"]: r
                for r in rows
                if r["configuration"] == name and r["num_features"] == m
            }
            row = {"configuration": name, "m": m}
            for estimator in ESTIMATORS:
                r = mine[estimator]
                row[LABELS[estimator]] = f"[{r['mse_min']:.4f}, {r['mse_max']:.4f}]"
            others = [mine[e] for e in ESTIMATORS[1:]]
            cluster = mine["cluster_hrf"]
            row["lowest mean"] = LABELS[min(mine, key=lambda e: mine[e]["mse_mean"])]
            row["cluster max < others' min"] = cluster["mse_max"] < min(
                o["mse_min"] for o in others
            )
            out.append(row)
    return out


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Mean MSE vs m (min-max band) per configuration, log scale (Fig. 6)."""
    count = len(config.configurations)
    fig, axes = plt.subplots(1, count, figsize=(3.6 * count, 3.3), squeeze=False)
    for ax, (name, _, _) in zip(axes[0], config.configurations, strict=True):
        for index, estimator in enumerate(ESTIMATORS):
            mine = [r for r in rows if r["configuration"] == name and r["estimator"] == estimator]
            m = [r["num_features"] for r in mine]
            ax.plot(m, [r["mse_mean"] for r in mine], "o-", ms=3, color=f"C{index}")
            ax.fill_between(
                m,
                [r["mse_min"] for r in mine],
                [r["mse_max"] for r in mine],
                color=f"C{index}",
                alpha=0.2,
                label=LABELS[estimator],
            )
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("number of random features m")
    axes[0][0].set_ylabel("MSE of SM-hat")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"Clustered data, d = {config.dim}: mean and min-max over {config.repetitions} repetitions",
        fontsize=9,
    )
    outputs.save_figure(fig, path)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Measures, writes ``results.csv``, ``mse_vs_m.png``, ``summary.md`` and ``config.json``."""
    rows, losses = measure(config)
    summary_rows = table_rows(rows, config)
    table = outputs.markdown_table(summary_rows)
    lowest = sum(r["lowest mean"] == LABELS["cluster_hrf"] for r in summary_rows)
    separated = sum(r["cluster max < others' min"] for r in summary_rows)
    verdict = (
        f"cluster-HRF has the lowest mean MSE in {lowest} of {len(summary_rows)} "
        f"(configuration, m) cells; its max over repetitions is below both others' min in "
        f"{separated}."
    )
    loss_lines = "".join(
        f"- {name}: L = {', '.join(f'{v:.3g}' for v in values)}\n"
        for name, values in losses.items()
    )
    summary = (
        f"# Cluster-adapted HRF on clustered data (HRF Table 3, Fig. 6)\n\n"
        f"d = {config.dim}, {config.points_per_cluster} points per cluster, "
        f"{config.num_pairs} random (query, key) pairs, {config.repetitions} repetitions, "
        f"{config.coupling} projections. [min, max] MSE over repetitions:\n\n{table}\n\n"
        f"{verdict}\n\nL of Eq. 21 at the fitted centre pairs (i, j) in row-major order:\n\n"
        f"{loss_lines}\n![MSE vs m](mse_vs_m.png)\n"
    )
    outputs.save_run(workdir, rows=rows, summary=summary, config=config)
    plot(rows, config, os.path.join(workdir, "mse_vs_m.png"))
    print(table)
    print(f"\n{verdict}\n{loss_lines}wrote results.csv, mse_vs_m.png, summary.md in {workdir}")
    return {"rows": rows, "table": summary_rows, "losses": losses}
