"""Estimator zoo: Monte Carlo kernel MSE, attention-matrix error, closed forms and cost of every
softmax-kernel (feature map x coupling) pair, on synthetic and real query/key pairs.

Pair sets (``experiments.estimator_zoo.pairs``): a synthetic grid across norm and angle, the
queries and keys of a trained Performer-ViT (``config.vit_path``), and rows of UCI sets. For
each set and pair, ``num_draws`` draws (common keys for all pairs: paired comparisons) give,
per group of queries and keys, the map fitted to the group (data-fitted maps: OPRF, DERF, as
attention fits them to the current sequence and head; random map parameters, the hybrids',
redrawn with each projection) and one projection of the coupling (independent per group):

* kernel MSE: synthetic pairs, the mean over the pairs (query t with key t) of
  (phi(q) . psi(k) - exp(q.k))^2; real sets, the Gaussian kernel's, every query with every key
  of a group: the estimate exp(-|q|^2/2) phi(q) . psi(k) exp(-|k|^2/2) of exp(-|q - k|^2 / 2)
  (as the SimRF paper's Gaussian-kernel experiments; bounded by 1, where exp(q.k) of real rows
  spans decades and its MSE is one pair's heavy tail). Averaged over groups, mean ± SE over
  draws; the closed form (``rfjax.theory.rank_estimators`` with the group's statistics, weights
  exp(-|q|^2 - |k|^2) on real sets) where one exists;
* attention-matrix error (real sets): |A_hat - A|_F / |A|_F pooled over groups, A = softmax(q
  k^T) the exact attention, A_hat FAVOR's matrix (``rfjax.attention.favor_attention_weights``)
  with the fitted map;
* cost: query plus key feature rows per second (jitted, d = ``config.dim``).

``measure`` keeps the statistics of every set as records (the draws stay in memory);
reporting is in ``experiments.estimator_zoo.reporting``; the papers' variance ratios in
``experiments.estimator_zoo.ratios``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core import outputs, stats
from experiments.core.study import Study
from experiments.core.validate import (
    require_couplings_draw,
    require_int,
    require_interval,
    require_names,
    require_no_repeats,
    require_positive,
)
from experiments.estimator_zoo import importance
from experiments.estimator_zoo import pairs as pair_data
from experiments.estimator_zoo import ratios as estimator_zoo_ratios
from experiments.estimator_zoo import reporting as estimator_zoo_report
from rfjax import data, features, projections, theory
from rfjax.attention import favor_attention_weights

STUDY = Study(
    paper="Beyond SimRF: OPRF (FAVOR++), DERF (FAVOR#) and norm-coupled features (issue 16)",
    order=160,
    reproduces=(
        "Issue 16: Monte Carlo kernel MSE, attention-matrix error, closed forms and cost of"
        " every softmax-kernel (feature map x coupling) pair, on synthetic and real "
        "query/key pairs"
    ),
)

BASELINE = ("positive", "gaussian")  # FAVOR+ with i.i.d. rows
report = estimator_zoo_report.report  # tables, figures and verdicts from the records
PART_FILE = "records_{part}.json"  # one part's records, when two processes share the work


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks names and sizes before anything runs.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    grid = ("feature_maps", "couplings", "real_feature_maps", "real_couplings", "norms")
    require_no_repeats(config, *grid, "cosines", "uci_sets")
    require_no_repeats(config.ratios, "scales", "anisotropies", "mc_scales", prefix="config.ratios")
    require_names(config, "feature_maps", features.available(kernel="softmax"))
    require_names(config, "couplings", projections.available())
    require_names(config, "real_feature_maps", config.feature_maps)
    require_names(config, "real_couplings", config.couplings)
    require_names(config, "part", ("all", "synthetic", "real"))
    require_names(config.ratios, "rule", tuple(estimator_zoo_report.RULES), "config.ratios")
    if "positive" not in config.real_feature_maps or "gaussian" not in config.real_couplings:
        raise ValueError(
            "config.real_feature_maps and config.real_couplings must include FAVOR+ i.i.d. "
            f"('positive', 'gaussian'), the baseline; got {config.real_feature_maps} and "
            f"{config.real_couplings}"
        )
    if config.uci_sets:  # () runs no UCI set
        require_names(config, "uci_sets", data.UCI_DATASETS)
    require_positive(config, "norms")
    require_int(
        config, "dim", "num_features", "cost_inputs", "uci_groups", "uci_group_size", minimum=1
    )
    # An SE needs two draws (one left every SE and paired z NaN, every verdict "not tested").
    require_int(config, "num_draws", "real_draws", "importance_draws", minimum=2)
    # NumPy's generators (the UCI rows, the importance draws) take no negative seed.
    require_int(config, "seed", minimum=0)
    require_int(config.ratios, "seed", minimum=0, prefix="config.ratios")
    require_int(config.ratios, "importance_draws", minimum=2, prefix="config.ratios")
    require_int(config.ratios, "dim", "num_points", minimum=1, prefix="config.ratios")
    require_int(config.ratios, "mc_draws", minimum=2, prefix="config.ratios")  # an SE: two
    require_positive(config.ratios, "scales", "anisotropies", prefix="config.ratios")
    ratios = config.ratios
    # () checks no setting by Monte Carlo; the check runs at kappa = 1 on settings of ``scales``
    if ratios.mc_scales and (
        not set(ratios.mc_scales) <= set(ratios.scales) or 1.0 not in ratios.anisotropies
    ):
        raise ValueError(
            "config.ratios.mc_scales must be among config.ratios.scales "
            f"{tuple(ratios.scales)}, with 1 among config.ratios.anisotropies "
            f"{tuple(ratios.anisotropies)} (the Monte Carlo check runs at kappa = 1), or (); got "
            f"{tuple(ratios.mc_scales)}"
        )
    require_interval(config, "cosines", interval="[-1, 1]")
    require_couplings_draw(config, "couplings", config.dim, config.num_features)


def pair_sets(config: ml_collections.ConfigDict) -> list[pair_data.PairSet]:
    """The synthetic grid, the ViT's queries and keys (if ``vit_path``) and the UCI sets."""
    sets = [
        pair_data.synthetic(jax.random.key(config.seed), config.dim, config.norms, config.cosines)
    ]
    if config.vit_path:
        sets.append(pair_data.vit(config.vit_path))
    sets += [
        pair_data.uci(name, config.uci_groups, config.uci_group_size, config.seed)
        for name in config.uci_sets
    ]
    return sets


def _gaussian_weights(q, k):
    """exp(-|q|^2 - |k|^2) per query-key pair ``(T, S)``: the factor that turns the softmax
    kernel's squared error into the Gaussian kernel's."""
    return np.exp(-np.sum(q**2, -1)[:, None] - np.sum(k**2, -1)[None])


def _gaussian_gram(fmap, w, q, k):
    """The Gaussian-kernel estimate exp(-|q|^2/2) phi(q) . psi(k) exp(-|k|^2/2), formed in log
    space (no overflow of phi for large norms), and its truth exp(-|q - k|^2 / 2)."""
    query = fmap.scaled_features(q, w, side="query")
    key = fmap.scaled_features(k, w, side="key")
    half_q, half_k = 0.5 * jnp.sum(q * q, -1), 0.5 * jnp.sum(k * k, -1)
    left = query.features * jnp.exp(query.log_scale - half_q)[:, None]
    right = key.features * jnp.exp(key.log_scale - half_k)[:, None]
    return left @ right.T, jnp.exp(q @ k.T - half_q[:, None] - half_k[None])


# The samplers run once per (coupling, pair set), so they are compiled for compile time, not run
# time (as ``rfjax.sklearn``'s): XLA backend optimisation level 0, the same draws up to
# rounding. Measured on the ViT set (300 draws x 64 groups, loaded 2-core machine): orthogonal
# 0.9 s compile + 4.8 s run at level 0 against 25.2 s + 1.5 s at the default level, i.i.d.
# 0.5 + 2.3 s against 6.3 + 0.5 s; norm-coupled, whose 64-step bisection is run-time bound,
# 2.6 + 82.5 s against 29.0 + 12.5 s (the one coupling where level 0 costs more). The error
# program, shared by all couplings of a map, runs 14 times per compile and stays at the default
# level: SADERF 2.0 s compile + 0.9 s per run against 2.9 + 2.3 s at level 0, the cluster
# hybrid 14.1 + 3.1 s against 6.3 + 6.9 s.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.partial(
    jax.jit,
    static_argnames=("coupling", "num_groups", "dim", "num_features"),
    compiler_options=FAST_COMPILE,
)
def draw_weights(draw_keys, *, coupling, num_groups, dim, num_features):
    """The projection of ``coupling`` for every draw and group, as dense matrices W
    ``(K, G, m, d)``: group g of draw k uses the first half of ``split(split(draw_keys[k],
    G)[g])`` (the second half draws and fits the map, in ``_draw_errors``). Dense, so that every
    coupling shares one error program per feature map (the maps use a projection only through
    ``x W^T``, ``dim``, ``num_features`` and ``matrix()``; a structured projection's fast
    application gives the same ``x W^T`` up to rounding)."""
    sampler = projections.get(coupling)

    def one_group(key):
        projection_key, _ = jax.random.split(key)
        return sampler(projection_key, dim, num_features).matrix()

    return jax.vmap(lambda key: jax.vmap(one_group)(jax.random.split(key, num_groups)))(draw_keys)


@functools.partial(jax.jit, static_argnames=("name", "paired"))
def _draw_errors(draw_keys, weights, queries, keys_in, *, name, paired):
    """Per draw and group, with the projections ``weights`` ``(K, G, m, d)`` of
    ``draw_weights``: the mean squared kernel error over the group's pairs (paired sets: the
    softmax kernel exp(q.k), query t with key t; other sets: the Gaussian kernel, every query
    with every key) and the squared Frobenius error of the attention matrix (0 for paired
    sets). Two ``(K, G)`` arrays."""
    template = features.get(name)()
    dim = queries.shape[-1]

    def one_group(key, matrix, q, k):
        _, map_key = jax.random.split(key)
        fmap = template.init(map_key, dim).fit(map_key, q, k)
        w = projections.DenseProjection(matrix)
        if paired:
            phi_q = fmap.features(q, w, side="query")
            phi_k = fmap.features(k, w, side="key")
            errors = jnp.sum(phi_q * phi_k, axis=-1) - jnp.exp(jnp.sum(q * k, axis=-1))
            return jnp.mean(errors**2), jnp.zeros((), errors.dtype)
        estimate, truth = _gaussian_gram(fmap, w, q, k)
        attention = favor_attention_weights(q[None, :, None], k[None, :, None], w, feature_map=fmap)
        exact = jax.nn.softmax(q @ k.T, axis=-1)
        return jnp.mean((estimate - truth) ** 2), jnp.sum((attention[0, 0] - exact) ** 2)

    def one_draw(draw):
        key, matrices = draw
        group_keys = jax.random.split(key, queries.shape[0])
        return jax.vmap(one_group)(group_keys, matrices, queries, keys_in)

    return jax.lax.map(one_draw, (draw_keys, weights), batch_size=25)


def closed_forms(pairs: pair_data.PairSet, num_features: int) -> dict[tuple[str, str], np.ndarray]:
    """Per (feature map, coupling) with a closed form, its MSE per group ``(G,)``, for the
    quantity ``_draw_errors`` measures (paired: softmax kernel; else Gaussian kernel)."""
    out: dict[tuple[str, str], np.ndarray] = {}
    with jax.enable_x64(True):
        for g, (q, k) in enumerate(zip(pairs.queries, pairs.keys, strict=True)):
            statistics = features.input_statistics(jnp.asarray(q), jnp.asarray(k))
            if pairs.paired:
                ranking = theory.rank_estimators(q, k, num_features, statistics=statistics)
                scale = 1.0
            else:
                weights = _gaussian_weights(q, k)
                ranking = theory.rank_estimators(
                    q[:, None], k[None], num_features, statistics=statistics, weights=weights
                )
                scale = float(weights.mean())
            for entry in ranking:
                key = (entry.feature_map, entry.coupling)
                out.setdefault(key, np.zeros(len(pairs.queries)))[g] = entry.mse * scale
    return out


@jax.jit
def _feature_rows(fmap, projection, x):
    """Query and key features of ``x`` (jitted at the default optimisation level: timed)."""
    return fmap.features(x, projection, side="query"), fmap.features(x, projection, side="key")


def features_per_second(name: str, coupling: str, config: ml_collections.ConfigDict) -> float:
    """Query plus key feature rows per second (jitted, the coupling's own projection type,
    median of 3 timed calls)."""
    key = jax.random.key(config.seed + 1)
    x = jax.random.normal(key, (config.cost_inputs, config.dim)) / config.dim**0.5
    fmap = features.get(name)().init(key, config.dim).fit(key, x, x)
    w = projections.get(coupling)(key, config.dim, config.num_features)
    jax.block_until_ready(_feature_rows(fmap, w, x))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(_feature_rows(fmap, w, x))
        times.append(time.perf_counter() - start)
    return 2 * config.cost_inputs / float(np.median(times))


def measure_set(pairs: pair_data.PairSet, config: ml_collections.ConfigDict) -> dict:
    """Per (feature map, coupling): the per-draw errors ``(K, G)`` and closed forms ``(G,)``."""
    num_draws = config.num_draws if pairs.paired else config.real_draws
    draw_keys = jax.random.split(jax.random.key(config.seed + 2), num_draws)
    queries = jnp.asarray(pairs.queries, jnp.float32)
    keys_in = jnp.asarray(pairs.keys, jnp.float32)
    kernel, attention = {}, {}
    maps, couplings = (
        (config.feature_maps, config.couplings)
        if pairs.paired
        else (config.real_feature_maps, config.real_couplings)
    )
    for coupling in outputs.progress(couplings, pairs.name):
        weights = draw_weights(
            draw_keys,
            coupling=coupling,
            num_groups=queries.shape[0],
            dim=queries.shape[-1],
            num_features=config.num_features,
        )
        for name in maps:  # one compiled program per map, shared by the couplings
            squared, frobenius = _draw_errors(
                draw_keys, weights, queries, keys_in, name=name, paired=pairs.paired
            )
            kernel[(name, coupling)] = np.asarray(squared, np.float64)
            attention[(name, coupling)] = np.asarray(frobenius, np.float64)
    exact = jax.nn.softmax(jnp.einsum("gtd,gsd->gts", queries, keys_in), axis=-1)
    estimators = [(name, coupling) for name in maps for coupling in couplings]  # map-major
    return {
        "pairs": pairs,
        "kernel": {key: kernel[key] for key in estimators},
        "attention": {key: attention[key] for key in estimators},
        "attention_norm": float(jnp.sum(exact**2)),
        "closed": closed_forms(pairs, config.num_features),
    }


def paired_z(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of a - b over common draws in standard errors (0 when identical; NaN where a draw's
    error is infinite: a signed map's normaliser crossing 0 has no paired difference)."""
    return stats.paired_difference(a, b).t


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    mean, se = stats.mean_se(values)
    return float(mean), float(se)


def summarise_set(measured: dict, costs: dict) -> list[dict]:
    """One row per (feature map, coupling), ranked by MSE (``ranking_value``: the closed form
    where Monte Carlo falls short of it, else Monte Carlo), with paired comparisons: against
    FAVOR+ i.i.d. and against the next row of the ranking (both in SE)."""
    pairs, kernel, attention = measured["pairs"], measured["kernel"], measured["attention"]
    mse_draws = {key: value.mean(axis=1) for key, value in kernel.items()}
    error_draws = {
        key: np.sqrt(value.sum(axis=1) / measured["attention_norm"])
        for key, value in attention.items()
    }
    rows = []
    for key, draws in mse_draws.items():
        mse, se = _mean_se(draws)
        theory_mse = (
            float(measured["closed"][key].mean()) if key in measured["closed"] else math.nan
        )
        row = {
            "data": pairs.name,
            "feature_map": key[0],
            "coupling": key[1],
            "mse_mc": mse,
            "mse_se": se,
            "mse_theory": theory_mse,
            "z_score": (mse - theory_mse) / se if se > 0 else math.nan,
        }
        row["attention_error"], row["attention_se"] = (
            (math.nan, math.nan) if pairs.paired else _mean_se(error_draws[key])
        )
        row["features_per_s"] = costs[key]
        rows.append(row)
    rows.sort(key=estimator_zoo_report.ranking_value)
    for index, row in enumerate(rows):
        key = (row["feature_map"], row["coupling"])
        row["ratio_to_favor_plus"] = row["mse_mc"] / float(mse_draws[BASELINE].mean())
        row["ratio_z"] = paired_z(mse_draws[key], mse_draws[BASELINE])
        following = rows[index + 1] if index + 1 < len(rows) else None
        row["next_z"] = (
            paired_z(mse_draws[key], mse_draws[(following["feature_map"], following["coupling"])])
            if following
            else math.nan
        )
        row["attention_ratio_z"] = (
            math.nan if pairs.paired else paired_z(error_draws[key], error_draws[BASELINE])
        )
    return rows


def with_importance_checks(rows: list[dict], checks: dict[tuple[str, str], dict]) -> list[dict]:
    """The rows with the importance-sampling check of their closed form (``importance``):
    ``mse_is`` ± ``mse_is_se`` over ``is_draws`` draws and ``is_z`` = (mse_is - mse_theory) /
    mse_is_se; for the block couplings the check of their coupling term (``coupling_term_is``
    ± ``coupling_term_is_se`` against ``coupling_term_theory``, the closed form minus the
    i.i.d. row's; ``coupling_term_z``); NaN (and 0 draws) where the row has none (a row
    without the coupling term's check: ``coupling_term_theory`` NaN too)."""
    iid = next(
        (r["mse_theory"] for r in rows if (r["feature_map"], r["coupling"]) == BASELINE), math.nan
    )
    out = []
    for row in rows:
        check = {
            "mse_is": math.nan,
            "mse_is_se": math.nan,
            "is_draws": 0,
            "coupling_term_is": math.nan,
            "coupling_term_is_se": math.nan,
            **checks.get((row["feature_map"], row["coupling"]), {}),
        }
        # NaN for a row without the check: the difference is a coupling term only there
        term = row["mse_theory"] - iid if check["coupling_term_is_se"] > 0 else math.nan
        out.append(
            {
                **row,
                **check,
                "is_z": _z(check["mse_is"] - row["mse_theory"], check["mse_is_se"]),
                "coupling_term_theory": term,
                "coupling_term_z": _z(
                    check["coupling_term_is"] - term, check["coupling_term_is_se"]
                ),
            }
        )
    return out


def _z(difference: float, se: float) -> float:
    """difference / se, NaN without a positive SE."""
    return difference / se if se > 0 else math.nan


def by_norm_rows(synthetic: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """Per (estimator, norm) of the synthetic grid: MSE, its ratio to FAVOR+ i.i.d. (paired z)
    and the Monte Carlo - closed form z."""
    kernel, closed = synthetic["kernel"], synthetic["closed"]
    baseline = kernel[BASELINE]
    rows = []
    for key, draws in kernel.items():
        for g, norm in enumerate(config.norms):
            values, reference = draws[:, g], baseline[:, g]
            mse, se = _mean_se(values)
            theory_mse = float(closed[key][g]) if key in closed else math.nan
            rows.append(
                {
                    "feature_map": key[0],
                    "coupling": key[1],
                    "norm": float(norm),
                    "mse_mc": mse,
                    "mse_se": se,
                    "mse_theory": theory_mse,
                    "z_score": (mse - theory_mse) / se if se > 0 else math.nan,
                    "ratio_to_favor_plus": mse / float(reference.mean()),
                    "ratio_z": paired_z(values, reference),
                }
            )
    return rows


def norm_coupled_rows(one: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """Positive features, norm-coupled against orthogonal, on one set (per norm for the
    synthetic grid): kernel-MSE ratio and attention-error ratio (real sets) with paired z."""
    rows: list[dict] = []
    nc, orth = ("positive", "norm_coupled"), ("positive", "orthogonal")
    kernel, pairs = one["kernel"], one["pairs"]
    if nc not in kernel or orth not in kernel:
        return rows
    groups = (
        [(f"{pairs.name} norm {norm:g}", [g]) for g, norm in enumerate(config.norms)]
        if pairs.paired
        else [(pairs.name, list(range(len(pairs.queries))))]
    )
    for label, index in groups:
        a, b = kernel[nc][:, index].mean(axis=1), kernel[orth][:, index].mean(axis=1)
        ratio = stats.ratio_of_means(a, b)  # paired draws: delta-method SE
        row = {
            "data": label,
            "draws": len(a),
            "mse_ratio": ratio.mean,
            "mse_ratio_se": ratio.se,
            "mse_z": paired_z(a, b),
            "attention_ratio": math.nan,
            "attention_z": math.nan,
        }
        if not pairs.paired:
            norm = one["attention_norm"]
            ea = np.sqrt(one["attention"][nc].sum(axis=1) / norm)
            eb = np.sqrt(one["attention"][orth].sum(axis=1) / norm)
            row["attention_ratio"], row["attention_z"] = ea.mean() / eb.mean(), paired_z(ea, eb)
        rows.append(row)
    return rows


def _measure_part(config: ml_collections.ConfigDict, part: str) -> dict:
    """The records of one part: ``"synthetic"`` (with the per-norm rows and the papers' variance
    ratios) or ``"real"`` (the ViT and UCI sets). The draws stay here; the records keep the
    statistics of each set."""
    start = time.perf_counter()
    estimators = [(n, c) for n in config.feature_maps for c in config.couplings]
    costs = {key: features_per_second(*key, config) for key in estimators}
    records: dict = {"sets": [], "rows": [], "by_norm": [], "norm_coupled": []}
    for pairs in pair_sets(config):
        if pairs.paired != (part == "synthetic"):
            continue
        one = measure_set(pairs, config)
        records["sets"].append({"name": pairs.name, "paired": pairs.paired})
        checks = importance.check_set(
            pairs, config.num_features, config.importance_draws, config.seed
        )
        records["rows"] += with_importance_checks(summarise_set(one, costs), checks)
        records["norm_coupled"] += norm_coupled_rows(one, config)
        if pairs.paired:
            records["by_norm"] += by_norm_rows(one, config)
    records["ratios"] = estimator_zoo_ratios.measure(config.ratios) if part == "synthetic" else []
    # Wall seconds and the 1-min load average at the end: the machine's share.
    records["elapsed"] = {part: [time.perf_counter() - start, os.getloadavg()[0]]}
    return records


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """The records of ``config.part``; with part ``"synthetic"`` or ``"real"`` (two processes
    started with the same workdir: the same keys, the same numbers) each part is stored as
    ``records_<part>.json`` and the second to finish returns both, the first
    ``{"waiting_for": part}``."""
    validate_config(config)
    parts = ("synthetic", "real") if config.part == "all" else (config.part,)
    measured = {part: _measure_part(config, part) for part in parts}
    for part, part_records in measured.items():
        outputs.write_json(os.path.join(workdir, PART_FILE.format(part=part)), part_records)
    for part in ("synthetic", "real"):
        path = os.path.join(workdir, PART_FILE.format(part=part))
        if part not in measured:
            if not os.path.exists(path):
                return {"waiting_for": part}
            with open(path) as handle:
                measured[part] = json.load(handle)
    merged: dict = {}
    for part in ("synthetic", "real"):
        for key, value in measured[part].items():
            merged[key] = (
                {**merged.get(key, {}), **value}
                if key == "elapsed"
                else [
                    *merged.get(key, []),
                    *value,
                ]
            )
    return merged
