"""Concentration of structured (P-model) random Fourier features against the bounds.

Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices" (seed 003,
arXiv:1604.07356; docs/maths/structured.md). Every family is a ``rfjax.projections.PModel``
drawn with ``projections.p_model`` (the unstructured Gaussian one as ``IndependentRows``, t = n^2),
with and without the H D_3 H D_2 H D_1 preprocessing (Step 1, Eq. 12). The Gaussian kernel is
estimated with sin/cos features (``features.fourier_features``) on pairs of real points; the
bounds come from ``rfjax.theory``: ``rff_pointwise_bound`` (Kakade), ``chromatic_deviation_bound``
with chi[P] from ``p_model_chromatic_number``, ``structured_fourier_bound`` with the row
covariance of each draw (``row_covariance``) and ``rff_uniform_bound`` (Sutherland & Schneider).

``measure`` returns per-method statistics (means and SEs over draws, chi[P], the P-model bound)
and saves them to ``workdir/measurements.json`` method by method (a rerun resumes; ``report``
alone can be rerun from it); ``report`` writes ``methods.csv``, ``tails.csv``, the figures and
``summary.md`` (template ``experiments/structured_concentration/summary.md``).

Modules: ``methods`` (the families, with and without HD), ``rows`` (per-method and tail rows),
``contrast`` (the chi contrast), ``judging`` (verdicts), ``reporting`` (tables, figures,
summary); this module validates the config and measures.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import structured_kernels
from experiments.core import outputs, records, stats, validate
from experiments.core.study import Study
from experiments.structured_concentration.contrast import (
    chi_contrast_rows,
    chi_contrast_text,
    chi_order_cells,
    contrast_labels,
    equivalence_bound_text,
)
from experiments.structured_concentration.judging import (
    features_for_uniform_bound,
    judge,
    power_note,
)
from experiments.structured_concentration.methods import (
    FAMILIES,
    LABELS,
    REFERENCE,
    method_name,
    methods,
)
from experiments.structured_concentration.reporting import (
    numbers,
    report,
)
from experiments.structured_concentration.rows import (
    gaussian_uniform_bound,
    method_rows,
    tail_rows,
)
from rfjax import features, projections, theory

__all__ = [
    "FAMILIES",
    "LABELS",
    "REFERENCE",
    "STUDY",
    "chi_contrast_rows",
    "chi_contrast_text",
    "chi_order_cells",
    "choose_pairs",
    "contrast_labels",
    "covariance_norms",
    "equivalence_bound_text",
    "features_for_uniform_bound",
    "gaussian_uniform_bound",
    "judge",
    "load_points",
    "measure",
    "measure_chi_contrast",
    "measure_errors",
    "measure_method",
    "method_name",
    "method_rows",
    "methods",
    "numbers",
    "power_note",
    "report",
    "tail_rows",
    "validate_config",
]


STUDY = Study(
    paper="Fast nonlinear embeddings via structured matrices (Choromanski & Fagan)",
    order=70,
    reproduces=(
        "Choromanski & Fagan: tails P(\\|K_hat - K\\| > eps) of every P-model family (± HD) "
        "against the bounds, MSE against the budget of randomness"
    ),
)

BOUND_PAIR_BATCH = 250  # pairs per row_covariance call (memory: batch x m x t floats)
MEASUREMENTS = "measurements.json"


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the config field that is out of range."""
    validate.require_no_repeats(config, "families", "preprocess")
    validate.require_names(config, "families", tuple(FAMILIES))
    validate.require(
        REFERENCE in config.families, "families", config.families, f"including {REFERENCE!r}"
    )
    validate.require_nonempty(config, "preprocess", "epsilons")
    validate.require_positive(config, "epsilons")
    eps = list(config.epsilons)
    validate.require(eps == sorted(set(eps)), "epsilons", config.epsilons, "increasing")
    validate.require_int(config, "num_draws", minimum=2)
    validate.require_int(config, "draws_per_chunk", "bound_draws", minimum=1)
    structured_kernels.validate_points(config)
    pairs = config.num_points * (config.num_points - 1) // 2
    validate.require_int(config, "num_pairs", minimum=1, maximum=pairs)  # of the points' pairs
    contrast, prefix = config.chi_contrast, "config.chi_contrast"
    validate.require_names(contrast, "family", tuple(FAMILIES), prefix)
    validate.require_int(contrast, "dims", "num_features", minimum=1, prefix=prefix)
    validate.require_no_repeats(contrast, "dims", prefix=prefix)
    validate.require(len(contrast.dims) == 2, "dims", contrast.dims, "two block sizes", prefix)
    validate.require(
        0 < contrast.tail_floor < 1, "tail_floor", contrast.tail_floor, "in (0, 1)", prefix
    )


def load_points(config: ml_collections.ConfigDict) -> tuple[np.ndarray, float]:
    """``structured_kernels.load_points`` (centred, mean norm 1, median-distance lengthscale)
    without the pixels that are constant on the subset (they carry nothing)."""
    points, lengthscale = structured_kernels.load_points(config)
    return points[:, points.std(axis=0) > 0], lengthscale


def choose_pairs(num_points: int, num_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random subset of ``num_pairs`` of the pairs i < j."""
    first, second = np.triu_indices(num_points, 1)
    if num_pairs > len(first):
        raise ValueError(f"num_pairs must be <= {len(first)} (all pairs), got {num_pairs}")
    chosen = np.sort(np.random.default_rng(seed + 1).choice(len(first), num_pairs, replace=False))
    return first[chosen], second[chosen]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _estimates(model, preprocess, num_features, keys, points, first, second):
    """K_hat of every pair under one projection per key: ``(keys, pairs)``."""
    dim = points.shape[-1]

    def one(key):
        projection = projections.p_model(
            key, dim, num_features, generator=model, preprocess=preprocess
        )
        phi = features.fourier_features(points, projection)
        return jnp.sum(phi[first] * phi[second], axis=-1)

    return jax.vmap(one)(keys)


def measure_errors(
    config, model, preprocess, points, first, second, exact, key, num_features=None
) -> dict:
    """Statistics of K_hat - K over ``config.num_draws`` draws (SEs over draws), with
    ``num_features`` projections (default: the points' dimension, one full block).

    Per draw: the mean over pairs of the squared error (``mse``) and of the error (``bias``),
    the fraction of pairs with |error| > eps (``tail``) and whether the largest |error| over
    pairs exceeds eps (``max_tail``); each as mean and SE. Per pair: the mean error over draws
    and its SE, summarised as the number of pairs with |mean| > 4 SE (``flagged_pairs``).
    """
    eps = np.asarray(config.epsilons)
    num_pairs = len(first)
    per_draw: dict[str, list[np.ndarray]] = {"mse": [], "bias": [], "tail": [], "max_tail": []}
    pair_sum, pair_squares = np.zeros(num_pairs), np.zeros(num_pairs)
    args = (jnp.asarray(points, jnp.float32), jnp.asarray(first), jnp.asarray(second))
    num_features = num_features or points.shape[-1]
    for start in outputs.progress(range(0, config.num_draws, config.draws_per_chunk), "draws"):
        count = min(config.draws_per_chunk, config.num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        estimates = _estimates(model, preprocess, num_features, keys, *args)
        errors = np.asarray(estimates, np.float64) - exact  # (count, pairs)
        per_draw["mse"].append(np.mean(errors**2, axis=1))
        per_draw["bias"].append(np.mean(errors, axis=1))
        per_draw["tail"].append(np.mean(np.abs(errors)[..., None] > eps, axis=1))
        per_draw["max_tail"].append(np.abs(errors).max(axis=1)[:, None] > eps)
        pair_sum += errors.sum(axis=0)
        pair_squares += (errors**2).sum(axis=0)
    draws = config.num_draws
    pair_mean = pair_sum / draws
    pair_se = np.sqrt((pair_squares - draws * pair_mean**2) / (draws - 1) / draws)
    result = {"flagged_pairs": int(np.sum(np.abs(pair_mean) > 4 * pair_se))}
    for name, values in per_draw.items():
        mean, se = stats.mean_se(np.concatenate(values))
        result[name], result[f"{name}_se"] = mean.tolist(), se.tolist()
    return result


def covariance_norms(config, model, preprocess, deltas, key) -> np.ndarray:
    """lambda = ||Cov(W delta)||_op per pair, for ``config.bound_draws`` draws of the HD signs
    and h (one draw when the P-model has neither): ``(draws, pairs)``.

    For independent rows Cov(W delta) = |delta|^2 I (no draw needed)."""
    if isinstance(model, projections.IndependentRows):
        return np.sum(deltas**2, axis=-1)[None]
    dim, num_features = deltas.shape[-1], deltas.shape[-1]
    norms = []
    for index in range(config.bound_draws):
        projection = projections.p_model(
            jax.random.fold_in(key, index),
            dim,
            num_features,
            generator=model,
            preprocess=preprocess,
        )
        row = []
        for start in range(0, len(deltas), BOUND_PAIR_BATCH):
            covariance = theory.row_covariance(projection, deltas[start : start + BOUND_PAIR_BATCH])
            row.append(np.linalg.eigvalsh(covariance)[..., -1])
        norms.append(np.concatenate(row))
        if projection.signs is None and projection.parameters is None:
            break  # deterministic given the data
    return np.stack(norms)


def measure_method(config, family, preprocess, data, key) -> dict:
    """Error statistics, chi[P], the budget t and the P-model bound of one method."""
    scaled, first, second, deltas, exact = data
    model = FAMILIES[family]
    draw_key, bound_key = jax.random.split(key)
    result = measure_errors(config, model, preprocess, scaled, first, second, exact, draw_key)
    dim = scaled.shape[-1]
    sample = projections.p_model(bound_key, dim, dim, generator=model, preprocess=preprocess)
    norms = covariance_norms(config, model, preprocess, deltas, bound_key)  # (draws, pairs)
    eps = np.asarray(config.epsilons)
    bound = theory.structured_fourier_bound(eps[:, None, None], dim, norms[None])
    result.update(
        budget=model.budget_size(sample.block_dim),
        block_dim=sample.block_dim,
        chromatic=1 if family == REFERENCE else theory.p_model_chromatic_number(sample),
        mean_lambda=float(norms.mean()),
        p_model_bound=bound.mean(axis=(1, 2)).tolist(),  # over HD/h draws and pairs
    )
    return result


def measure_chi_contrast(config, data, key) -> dict:
    """The contrast of chi[P] within one family at equal m and (nearly) equal budget: the
    plain ``config.chi_contrast.family`` P-model at each block size n of
    ``config.chi_contrast.dims`` (the points zero-padded to n, which changes no kernel value),
    each with the same ``num_features`` rows; per n the error statistics of ``measure_errors``
    (independent draws per n), chi[P] and the budget t.

    Raises:
      ValueError: if a block size is below the points' dimension.
    """
    scaled, first, second, _, exact = data
    contrast = config.chi_contrast
    model = FAMILIES[contrast.family]
    measured = {}
    for index, n in enumerate(contrast.dims):
        if n < scaled.shape[-1] or contrast.num_features > n:
            raise ValueError(
                f"config.chi_contrast.dims must be >= the data's d = {scaled.shape[-1]} and >= "
                f"num_features = {contrast.num_features}, got {n}"
            )
        padded = np.pad(scaled, ((0, 0), (0, n - scaled.shape[-1])))
        draw_key = jax.random.fold_in(key, index)
        result = measure_errors(
            config, model, False, padded, first, second, exact, draw_key, contrast.num_features
        )
        sample = projections.p_model(
            draw_key, n, contrast.num_features, generator=model, preprocess=False
        )
        result.update(
            chromatic=theory.p_model_chromatic_number(sample),
            budget=model.budget_size(sample.block_dim),
        )
        measured[str(n)] = result
    return measured


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Per-method statistics, the within-family chi contrast (``chi_contrast``) and data
    constants, JSON-serialisable.

    With a ``workdir``, each finished method (and the contrast) is saved to
    ``workdir/measurements.json`` and a rerun with the same config resumes from it (``report``
    can then be rerun alone; a changed ``chi_contrast`` reruns the contrast only).
    """
    validate_config(config)
    path = os.path.join(workdir, MEASUREMENTS) if workdir else None
    results: dict[str, Any] = {
        "config": records.settings(config, exclude=("chi_contrast",)),
        "methods": {},
        "seconds": 0.0,
    }
    if path and os.path.exists(path):
        with open(path) as handle:
            saved = json.load(handle)
        if saved.get("config") == results["config"]:
            results = saved
    points, lengthscale = load_points(config)
    scaled = points / lengthscale  # the kernel exp(-|x - y|^2 / 2) on scaled points
    first, second = choose_pairs(len(points), config.num_pairs, config.seed)
    deltas = scaled[first] - scaled[second]
    exact = np.exp(-0.5 * np.sum(deltas**2, axis=-1))
    data = (scaled, first, second, deltas, exact)
    key = jax.random.key(config.seed)
    for index, (name, family, preprocess) in enumerate(
        outputs.progress(methods(config), "methods")
    ):
        if name in results["methods"]:
            continue
        method_started = time.perf_counter()
        results["methods"][name] = measure_method(
            config, family, preprocess, data, jax.random.fold_in(key, index)
        )
        results["seconds"] += time.perf_counter() - method_started
        if path:
            outputs.write_json(path, results)
    contrast_settings = records.settings(config.chi_contrast)
    if results.get("chi_contrast", {}).get("settings") != contrast_settings:
        started = time.perf_counter()
        measured = measure_chi_contrast(config, data, jax.random.fold_in(key, 10_000))
        results["chi_contrast"] = {
            "settings": contrast_settings,
            "dims": measured,
            "seconds": time.perf_counter() - started,
            "load_average": os.getloadavg()[0],
        }
        if path:
            outputs.write_json(path, results)
    dim = points.shape[-1]
    distances = np.linalg.norm(scaled[:, None] - scaled[None], axis=-1)
    results.update(
        dim=dim,
        num_features=dim,
        lengthscale=lengthscale,
        diameter=float(distances.max()),
        iid_mse=float(np.mean(theory.rff_mse(scaled[first], scaled[second], dim))),
    )
    return results
