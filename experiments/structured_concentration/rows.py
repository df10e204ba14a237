"""Structured concentration's measurements as rows: one per method (budget, chi, MSE, pair
checks) and one per method and eps (tails against the bounds).
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from experiments.core.stats import Estimate
from experiments.structured_concentration.methods import REFERENCE, methods
from rfjax import theory


def method_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per method: budget, chi, MSE, bias, MSE ratio to the reference, pair checks."""
    reference = results["methods"][REFERENCE]
    rows = []
    for name, family, preprocess in methods(config):
        measured = results["methods"][name]
        mse, mse_se = measured["mse"], measured["mse_se"]
        ratio = mse / reference["mse"]
        ratio_se = ratio * math.hypot(mse_se / mse, reference["mse_se"] / reference["mse"])
        rows.append(
            {
                "method": name,
                "family": family,
                "preprocess": preprocess,
                "n": measured["block_dim"],
                "budget t": measured["budget"],
                "chi[P]": measured["chromatic"],
                "MSE": mse,
                "MSE SE": mse_se,
                "ratio to Gaussian": ratio,
                "ratio SE": 0.0 if name == REFERENCE else ratio_se,
                "bias": measured["bias"],
                "bias SE": measured["bias_se"],
                "bias z": measured["bias"] / measured["bias_se"],
                "pairs abs(z) > 4": measured["flagged_pairs"],
                "mean lambda": measured["mean_lambda"],
            }
        )
    return rows


def gaussian_uniform_bound(epsilon, num_features: int, dim: int, diameter: float) -> np.ndarray:
    """``theory.rff_uniform_bound`` for the study's kernel, the Gaussian at unit lengthscale,
    whose frequencies w ~ N(0, I_d) have sigma_p = sqrt(E|w|^2) = sqrt(d)."""
    return theory.rff_uniform_bound(
        epsilon, num_features, dim, diameter=diameter, sigma_p=math.sqrt(dim)
    )


def tail_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per (method, eps): empirical tails (pairwise and max over pairs) and bounds."""
    eps = np.asarray(config.epsilons)
    m, dim = results["num_features"], results["dim"]
    hoeffding = theory.rff_pointwise_bound(eps, m)
    uniform = gaussian_uniform_bound(eps, m, dim, results["diameter"])
    rows = []
    for name, family, _ in methods(config):
        measured = results["methods"][name]
        chromatic = theory.chromatic_deviation_bound(eps, m, measured["chromatic"])
        for index, epsilon in enumerate(eps):
            rows.append(
                {
                    "method": name,
                    "family": family,
                    "eps": float(epsilon),
                    "tail": measured["tail"][index],
                    "tail SE": measured["tail_se"][index],
                    "max tail": measured["max_tail"][index],
                    "max tail SE": measured["max_tail_se"][index],
                    "Hoeffding": float(hoeffding[index]),
                    "chromatic": float(chromatic[index]),
                    "P-model": measured["p_model_bound"][index],
                    "uniform": float(uniform[index]),
                }
            )
    return rows


def _mse(row: dict, n: int) -> Estimate:
    return Estimate(row["MSE"], row["MSE SE"], n)
