"""Cluster-adapted hybrid features vs FAVOR+ and trig features on clustered data (HRF Table 3).

The data (``experiments.hrf_clustered.data``): two query and two key Gaussian clusters in
d = 16 from one of three generators of the means, every point then rescaled to a point norm c
(App. H.3's normalisation), for each c of ``config.point_norms``; the same points, pairs and
projections at every c (common random numbers), so the sweep isolates the norm.

Per configuration and point norm, the random pairs and the fitted clusters are fixed; each
repetition (one key) draws one set of projections, used by all four estimators (common random
numbers: paired by repetition), and measures the MSE of SM(x, y) = exp(x.y) averaged over the
pairs: cluster-HRF with the paper's A (Eq. 88), cluster-HRF with A clipped to
[1 / max_scale, max_scale] (rfjax's default), FAVOR+ and trig features. All repetitions of one
m run in one vmapped call; repetitions of different m use independent keys.

Which point norm the verdicts are drawn at (``in_range_norm``): per generator, the largest c
at which both baselines' MSE stays within the range of the paper's Table 3 (every estimator
<= ``TABLE_3_MAX`` there) in every repetition, m and configuration; the baselines alone decide
it, so the choice cannot favour cluster-HRF. ``measure`` computes; ``report``
(``experiments.hrf_clustered.reporting``) writes the tables, the figure and the summary.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core import outputs
from experiments.core.study import Study
from experiments.core.validate import (
    require,
    require_couplings_draw,
    require_names,
    require_no_repeats,
    require_positive,
)
from experiments.hrf_clustered import data
from experiments.hrf_clustered import reporting as hrf_clustered_report
from experiments.hrf_clustered.data import CLUSTER_ESTIMATORS, ESTIMATORS, GENERATORS
from rfjax import features, projections

STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=100,
    reproduces=(
        "HRF Table 3, Fig. 6: cluster-adapted hybrid features vs FAVOR+ and trigonometric "
        "features on clustered data"
    ),
)

report = hrf_clustered_report.report  # verdicts, tables, figure and summary from the records


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the coupling, the configurations and the sizes before anything runs (by hand only
    the rule that spans fields: ``1 < max_scale < unclipped_scale``).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "feature_counts", "point_norms")
    require_names(config, "coupling", projections.available())
    require_positive(
        config,
        "dim",
        "points_per_cluster",
        "fixed_loss",
        "num_clusters",
        "kmeans_iterations",
        "max_scale",
        "unclipped_scale",
        "point_norms",
        "feature_counts",
        "repetitions",
        "num_pairs",
    )
    for rows in config.feature_counts:
        require_couplings_draw(config, "coupling", config.dim, rows)
    if not 1.0 < config.max_scale < config.unclipped_scale:
        raise ValueError(
            "config.max_scale and config.unclipped_scale must satisfy 1 < max_scale < "
            f"unclipped_scale, got {config.max_scale} and {config.unclipped_scale}"
        )
    require(
        set(config.centre_norms) == set(GENERATORS),
        "centre_norms",
        dict(config.centre_norms),
        f"a length for each of {GENERATORS} and no other",
    )
    require_positive(config.centre_norms, *GENERATORS, prefix="config.centre_norms")
    for entry in config.configurations:
        require(
            len(entry) == 4
            and isinstance(entry[0], str)
            and entry[1] in GENERATORS
            and entry[3] > 0,
            "configurations",
            entry,
            f"entries (name, generator in {GENERATORS}, parameter, sigma > 0)",
        )
        try:
            data.means(jax.random.key(0), entry[1], entry[2], config)
        except ValueError as error:
            raise ValueError(f"config.configurations entry {entry!r}: {error}") from None


@functools.partial(jax.jit, static_argnums=(0, 1))
def _mean_squared_errors(
    coupling: str,
    num_features: int,
    keys: jax.Array,
    x: jax.Array,
    y: jax.Array,
    parameters: dict[str, features.ClusterHybridParameters],
) -> jax.Array:
    """MSE over the pairs per repetition and estimator (``ESTIMATORS``), all on the
    repetition's projections (common random numbers): shape (num_keys, 4)."""
    sampler = projections.get(coupling)
    exact = jnp.exp(jnp.sum(x * y, axis=-1))

    def one_repetition(key):
        w = sampler(key, x.shape[-1], num_features)
        cluster = [
            features.estimate(
                features.cluster_hybrid_features(x, w, parameters[name], side="query"),
                features.cluster_hybrid_features(y, w, parameters[name], side="key"),
            )
            for name in CLUSTER_ESTIMATORS
        ]
        favor = features.estimate(
            features.positive_features(x, w), features.positive_features(y, w)
        )
        trig = features.estimate(
            features.trigonometric_features(x, w), features.trigonometric_features(y, w)
        )
        return jnp.stack([jnp.mean((e - exact) ** 2) for e in (*cluster, favor, trig)])

    return jax.vmap(one_repetition)(keys)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Per (configuration, point norm, m) the MSE of every estimator in every repetition
    (``draws``), the facts of every (configuration, point norm) (``facts``) and the run's wall
    time and load. Writes nothing."""
    del workdir  # nothing to resume
    start = time.time()
    data_key, draw_key = jax.random.split(jax.random.key(config.seed))
    draws, facts = [], []
    for c_index, (name, generator, parameter, sigma) in enumerate(config.configurations):
        setup = data.make_configuration(
            jax.random.fold_in(data_key, c_index), generator, parameter, sigma, config
        )
        for point_norm in config.point_norms:
            rescaled = data.at_point_norm(setup, point_norm, config)
            facts.append(
                {
                    "configuration": name,
                    "generator": generator,
                    "parameter": parameter,
                    "sigma": sigma,
                    "point_norm": point_norm,
                    **data.geometry(setup, rescaled),
                }
            )
            x = jnp.asarray(rescaled["x"], jnp.float32)
            y = jnp.asarray(rescaled["y"], jnp.float32)
            label = f"{name:>40} c = {point_norm:g}, m"
            for m in outputs.progress(config.feature_counts, label):
                keys = jax.random.split(
                    jax.random.fold_in(jax.random.fold_in(draw_key, c_index), m),
                    config.repetitions,
                )
                mse = np.asarray(
                    _mean_squared_errors(config.coupling, m, keys, x, y, rescaled["parameters"]),
                    np.float64,
                )
                draws.append(
                    {
                        "configuration": name,
                        "point_norm": point_norm,
                        "num_features": int(m),
                        **{e: mse[:, i].tolist() for i, e in enumerate(ESTIMATORS)},
                    }
                )
    run = {"seconds": time.time() - start, "load_average": os.getloadavg()[0]}
    return {"draws": draws, "facts": facts, "run": run}
