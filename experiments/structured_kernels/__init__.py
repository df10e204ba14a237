"""Gram-matrix error of structured projections vs an unstructured Gaussian one.

Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices" (seed 003,
arXiv:1604.07356; docs/maths/structured.md). Each method draws a projection with
``rfjax.projections.get(coupling)`` (circulant, Toeplitz and Hankel optionally with
``preprocess=True``, the H D_3 H D_2 H D_1 rotation of the paper's Step 1) and estimates the
angular (``features.angular_features``), arc-cosine of order 1 (``features.arccos_features``)
and Gaussian (``features.fourier_features``) kernels on a data set; the exact Gram matrices
come from ``rfjax.kernels``.
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, validate, verdicts
from experiments.core.stats import Estimate, draw_in_chunks, mean_se
from experiments.core.study import Study
from rfjax import features, kernels, projections, theory

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Fast nonlinear embeddings via structured matrices (Choromanski & Fagan)",
    order=60,
    reproduces=(
        "Choromanski & Fagan: kernel error of circulant / Toeplitz / Hankel (± HD) vs "
        "Gaussian projections"
    ),
)

KERNELS = ("angular", "arccos", "gaussian")
DATASETS = ("digits",)
DATASET_SIZES = {"digits": 1797}  # images in scikit-learn's digits
PREPROCESS_SUFFIX = "_hd"
REFERENCE = "gaussian"
STRUCTURES = ("circulant", "toeplitz", "hankel")  # the couplings with a ``preprocess`` option


def parse_method(method: str) -> tuple[str, bool]:
    """``"toeplitz_hd"`` -> ``("toeplitz", True)``; a plain coupling name -> ``(name, False)``.

    Raises:
      ValueError: for an unknown coupling, or ``_hd`` on a coupling without ``preprocess``.
    """
    preprocess = method.endswith(PREPROCESS_SUFFIX) and method[: -len(PREPROCESS_SUFFIX)] in (
        STRUCTURES
    )
    coupling = method[: -len(PREPROCESS_SUFFIX)] if preprocess else method
    projections.get(coupling)  # raises for unknown names
    return coupling, preprocess


def validate_points(config: ml_collections.ConfigDict) -> None:
    """Checks ``config.dataset`` and ``config.num_points`` (a subset of it, at least one pair)
    before anything runs (``structured_concentration`` draws the same points).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    validate.require_names(config, "dataset", DATASETS)
    validate.require_int(config, "num_points", minimum=2, maximum=DATASET_SIZES[config.dataset])


def load_points(config: ml_collections.ConfigDict) -> tuple[np.ndarray, float]:
    """A fixed random subset of the data, centred and scaled to mean norm 1, and the median
    pairwise distance (the Gaussian kernel's lengthscale)."""
    validate_points(config)
    from sklearn.datasets import load_digits

    data = load_digits().data.astype(np.float64)
    rng = np.random.default_rng(config.seed)
    x = data[rng.choice(data.shape[0], config.num_points, replace=False)]
    x = x - x.mean(axis=0)
    x = x / np.linalg.norm(x, axis=1).mean()
    distances = np.linalg.norm(x[:, None] - x[None], axis=-1)
    lengthscale = float(np.median(distances[np.triu_indices(len(x), 1)]))
    return x, lengthscale


@functools.partial(jax.jit, static_argnums=(1,))
def exact_grams(x: jax.Array, lengthscale: float) -> dict[str, jax.Array]:
    """The exact Gram matrix of each kernel on ``x``."""
    return {
        "angular": kernels.gram(kernels.angular, x, x),
        "arccos": kernels.gram(kernels.arccos, x, x, order=1),
        "gaussian": kernels.gram(kernels.gaussian, x, x, lengthscale=lengthscale),
    }


def feature_maps(
    x: jax.Array, projection: projections.Projection, lengthscale: float
) -> dict[str, jax.Array]:
    """The three feature maps of ``x`` under one drawn projection."""
    return {
        "angular": features.angular_features(x, projection),
        "arccos": features.arccos_features(x, projection, order=1),
        "gaussian": features.fourier_features(x, projection, lengthscale=lengthscale),
    }


def _autocorrelations(delta: np.ndarray, structure: str) -> np.ndarray:
    """c_k = sum_t delta_t delta_(t+k) for lags k = 0..n-1 (cyclic for circulant): the
    covariance of (row i).delta and (row i+k).delta of one block, ``(..., n) -> (..., n)``."""
    n = delta.shape[-1]
    length = n if structure == "circulant" else 2 * n
    spectrum = np.fft.rfft(delta, n=length, axis=-1)
    return np.fft.irfft(np.abs(spectrum) ** 2, n=length, axis=-1)[..., :n]


def _block_sizes(num_features: int, block: int) -> list[int]:
    return [block] * (num_features // block) + (
        [num_features % block] if num_features % block else []
    )


def gaussian_kernel_theory(
    points: np.ndarray, lengthscale: float, method: str, num_features: int
) -> float:
    """Exact E|K_hat - K|_F^2 / |K|_F^2 of the Fourier-feature Gaussian-kernel Gram matrix for
    i.i.d. rows and for circulant, Toeplitz and Hankel blocks without preprocessing (NaN for the
    other methods, whose row correlations depend on the random HD draw).

    With a_i = w_i.delta / l jointly Gaussian, Var a_i = s^2 = |delta|^2 / l^2 and
    Cov(a_i, a_j) = c_(i-j) / l^2 (c the autocorrelation of delta, cyclic for circulant; rows of
    different blocks are independent), the estimate (1/m) sum_i cos a_i has
    MSE = (1/m^2) [m (1 - e^(-s^2))^2 / 2 + sum_(i != j, same block) e^(-s^2)
    (cosh(c_(i-j) / l^2) - 1)], from E cos a cos b = [e^(-Var(a-b)/2) + e^(-Var(a+b)/2)] / 2.
    """
    coupling, preprocess = parse_method(method)
    if preprocess or coupling not in (REFERENCE, *STRUCTURES):
        return float("nan")
    delta = points[:, None, :] - points[None, :, :]
    s2 = np.sum(delta**2, axis=-1) / lengthscale**2
    exact = np.exp(-0.5 * s2)
    total = num_features * (-np.expm1(-s2)) ** 2 / 2
    if coupling in STRUCTURES:
        n = points.shape[-1]
        excess = np.cosh(_autocorrelations(delta, coupling) / lengthscale**2) - 1.0
        lags = np.arange(1, n)
        for size in _block_sizes(num_features, n):
            counts = np.maximum(size - lags, 0)  # ordered pairs (i, i + k) in the block
            if coupling == "circulant":  # lag -k is lag n - k
                pair_sum = excess[..., lags] + excess[..., n - lags]
            else:
                pair_sum = 2 * excess[..., lags]
            total = total + np.exp(-s2) * (pair_sum @ counts)
    return float(np.sum(total / num_features**2) / np.sum(exact**2))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _draw_matrices(
    coupling: str, preprocess: bool, dim: int, num_features: int, keys: jax.Array
) -> jax.Array:
    """W of one projection per key, ``(keys, num_features, dim)``."""
    sampler = projections.get(coupling)
    options = {"preprocess": True} if preprocess else {}
    return jax.vmap(lambda key: sampler(key, dim, num_features, **options).matrix())(keys)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _relative_errors(
    num_features: tuple[int, ...],
    lengthscale: float,
    matrices: jax.Array,
    x: jax.Array,
    exact: dict[str, jax.Array],
) -> jax.Array:
    """|K_hat - K|_F^2 / |K|_F^2 per draw, m and kernel: ``(draws, len(num_features), 3)``.

    ``matrices`` holds one W of M = max(num_features) rows per draw; its first m rows are an
    m-row draw of the same coupling (blocks are independent and the last one is truncated), so
    one draw serves every m (the errors at different m of one draw are correlated).
    """

    def one_draw(weights):
        per_m = []
        for m in num_features:
            maps = feature_maps(x, projections.DenseProjection(weights[:m]), lengthscale)
            per_m.append(
                [
                    jnp.sum((maps[k] @ maps[k].T - exact[k]) ** 2) / jnp.sum(exact[k] ** 2)
                    for k in KERNELS
                ]
            )
        return jnp.asarray(per_m)

    return jax.vmap(one_draw)(matrices)


def measure(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """``rows``, one per (kernel, method, m): mean relative squared Frobenius error, its SE,
    the closed form and the ratio to ``gaussian``; the Gaussian kernel's ``lengthscale``; the
    input dimension ``dim``. Writes nothing."""
    del workdir  # nothing to resume
    validate_config(config)
    points, lengthscale = load_points(config)
    x = jnp.asarray(points, jnp.float32)
    exact = exact_grams(x, lengthscale)
    key = jax.random.key(config.seed)
    num_features = tuple(config.num_features)
    rows = []
    for method_index, method in enumerate(config.methods):
        coupling, preprocess = parse_method(method)

        def draw(keys, coupling=coupling, preprocess=preprocess):
            matrices = _draw_matrices(coupling, preprocess, x.shape[-1], max(num_features), keys)
            return _relative_errors(num_features, lengthscale, matrices, x, exact)

        errors = draw_in_chunks(
            draw,
            jax.random.fold_in(key, method_index),
            config.num_draws,
            config.draws_per_chunk,
            method,
        )
        mean, se = mean_se(errors)
        for m_index, m in enumerate(num_features):
            for k_index, kernel in enumerate(KERNELS):
                predicted = (
                    gaussian_kernel_theory(points, lengthscale, method, m)
                    if kernel == "gaussian"
                    else float("nan")
                )
                error, error_se = float(mean[m_index, k_index]), float(se[m_index, k_index])
                rows.append(
                    {
                        "kernel": kernel,
                        "method": method,
                        "m": m,
                        "error": error,
                        "error_se": error_se,
                        "error_theory": predicted,
                        "z_score": (error - predicted) / error_se,
                    }
                )
    add_ratios(rows)
    return {"rows": rows, "lengthscale": lengthscale, "dim": points.shape[-1]}


def add_ratios(rows: list[dict]) -> None:
    """Adds each row's error ratio to the Gaussian reference at the same kernel and m, with its
    delta-method SE (independent draws)."""
    reference = {(r["kernel"], r["m"]): r for r in rows if r["method"] == REFERENCE}
    for row in rows:
        ref = reference[(row["kernel"], row["m"])]
        ratio = row["error"] / ref["error"]
        row["ratio"] = ratio
        row["ratio_se"] = (
            0.0
            if row is ref
            else ratio * math.hypot(row["error_se"] / row["error"], ref["error_se"] / ref["error"])
        )


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the config field that is out of range."""
    validate.require(
        REFERENCE in config.methods,
        "methods",
        config.methods,
        f"including the reference {REFERENCE!r}",
    )
    validate.require_no_repeats(config, "methods")
    for method in config.methods:
        parse_method(method)
    validate.require(
        tuple(config.kernels) == KERNELS,
        "kernels",
        config.kernels,
        f"{KERNELS} (all three share each draw)",
    )
    validate.require_nonempty(config, "num_features")
    validate.require_int(config, "num_features", "draws_per_chunk", minimum=1)
    m = list(config.num_features)
    validate.require(m == sorted(set(m)), "num_features", config.num_features, "increasing")
    validate.require_int(config, "num_draws", minimum=2)
    validate_points(config)


def plot(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Error vs m per kernel (log-log), one line per method, 2-SE bars."""
    fig, axes = plt.subplots(1, len(KERNELS), figsize=(4.2 * len(KERNELS), 4))
    for ax, kernel in zip(axes, KERNELS, strict=True):
        for index, method in enumerate(config.methods):
            mine = [r for r in rows if r["kernel"] == kernel and r["method"] == method]
            ax.errorbar(
                [r["m"] for r in mine],
                [r["error"] for r in mine],
                yerr=[2 * r["error_se"] for r in mine],
                fmt="--" if method in STRUCTURES else "-",
                marker="o",
                ms=3,
                color=f"C{index}",
                label=method,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("m (projections)")
        ax.set_title(f"{kernel} kernel (bars: ± 2 SE)")
    axes[0].set_ylabel("|K_hat - K|_F^2 / |K|_F^2")
    axes[-1].legend(fontsize=7)
    outputs.save_figure(fig, path)


def _ratio_table(rows: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Per method and kernel: the mean over m of the error ratio to ``gaussian``, its range and
    the largest SE of a ratio."""
    table = []
    for method in config.methods:
        row: dict = {"method": method}
        for kernel in KERNELS:
            mine = [r for r in rows if r["kernel"] == kernel and r["method"] == method]
            ratios = np.array([r["ratio"] for r in mine])
            ses = np.array([r["ratio_se"] for r in mine])
            row[f"{kernel} ratio (mean over m)"] = float(ratios.mean())
            row[f"{kernel} range"] = f"{ratios.min():.3f}-{ratios.max():.3f}"
            row[f"{kernel} max SE"] = float(ses.max())
        table.append(row)
    return table


def _hd_table(rows: list[dict], dim: int) -> list[dict]:
    """Per kernel: the range of the ``_hd`` methods' ratios for m < d and m >= d."""
    table = []
    for kernel in KERNELS:
        row = {"kernel": kernel}
        for label, keep in (("m < d", lambda m: m < dim), ("m >= d", lambda m: m >= dim)):
            ratios = [
                r["ratio"]
                for r in rows
                if r["kernel"] == kernel
                and r["method"].endswith(PREPROCESS_SUFFIX)
                and keep(r["m"])
            ]
            row[label] = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        table.append(row)
    return table


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares: each a test of the mean ratio to
    ``gaussian`` over its cells (the m of one method share their draws)."""
    judge = verdicts.Verdicts(config)
    rows, n = results["rows"], config.num_draws

    def ratios(keep) -> dict:
        return {
            (r["kernel"], r["method"], r["m"]): Estimate(r["ratio"] - 1.0, r["ratio_se"], n)
            for r in rows
            if keep(r)
        }

    for kernel in KERNELS:
        judge.ordering(
            f"hd_{kernel}",
            ratios(
                lambda r, k=kernel: r["kernel"] == k and r["method"].endswith(PREPROCESS_SUFFIX)
            ),
            effect=f"{kernel} kernel: error ratio of the `_hd` methods to `gaussian` - 1",
            cell_name="(kernel, method, m)",
            units="draws",
            shared_units=True,
        )
    judge.ordering(
        "plain",
        ratios(lambda r: r["method"] in STRUCTURES),
        effect="error ratio of plain circulant/Toeplitz/Hankel to `gaussian` - 1",
        cell_name="(kernel, method, m)",
        units="draws",
        shared_units=True,
    )
    judge.closed_form_agreement(
        "theory",
        rows,
        measured="error",
        closed_form="error_theory",
        se="error_se",
        draws=n,
        cell=lambda r: f"{r['method']}, m = {r['m']}",
        where=lambda r: np.isfinite(r["z_score"]),
    )
    return judge


ERROR_COLUMNS = {
    "method": "method",
    "kernel": "kernel",
    "error": "error",
    "SE": "error_se",
    "theory": "error_theory",
    "ratio": "ratio",
    "ratio SE": "ratio_se",
}


def orf_mse_ratio(dim: int) -> float:
    """MSE(ORF) / MSE(IID) of random Fourier features at |x - y| = 1 (``rfjax.theory``)."""
    unit = np.zeros(dim)
    unit[0] = 1.0
    return float(
        theory.rff_mse(unit, np.zeros(dim), dim, coupling="orthogonal")
        / theory.rff_mse(unit, np.zeros(dim), dim)
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Writes ``results.csv``, ``error_vs_features.png``, ``config.json``, ``summary.md`` and
    ``verdicts.json``."""
    rows, lengthscale, dim = results["rows"], results["lengthscale"], results["dim"]
    largest = max(config.num_features)
    orthogonal = [r for r in rows if r["method"] == "hd_orthogonal"]
    ratios = [r["ratio"] for r in orthogonal]
    text = verdicts.write_summary(
        workdir,
        "structured_kernels",
        judge(results, config),
        config,
        lengthscale=f"{lengthscale:.3f}",
        num_features=list(config.num_features),
        dim=dim,
        largest=largest,
        ratio_table=outputs.markdown_table(_ratio_table(rows, config), float_format="{:.3f}"),
        hd_table=outputs.markdown_table(_hd_table(rows, dim), float_format="{:.3f}"),
        orthogonal_range="-" if not ratios else f"{min(ratios):.3f}-{max(ratios):.3f}",
        orthogonal_below=sum(r["ratio"] - 1 < -3 * r["ratio_se"] for r in orthogonal),
        orthogonal_cells=len(orthogonal),
        orf_ratio=f"{orf_mse_ratio(dim):.3f}",
        hd_margin=f"{config.claims.hd_angular.margin:g}",
        hd_margin_percent=f"{config.claims.hd_angular.margin:.0%}",
        hd_rmse_margin=f"{math.sqrt(1 + config.claims.hd_angular.margin) - 1:.0%}",
        error_table=outputs.markdown_table(
            outputs.select([r for r in rows if r["m"] == largest], ERROR_COLUMNS)
        ),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), rows)
    plot(rows, config, os.path.join(workdir, "error_vs_features.png"))
    print(text)
    return results
