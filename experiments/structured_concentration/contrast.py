"""The chi contrast of structured concentration: two P-models of one budget whose coherence
graphs differ in chromatic number, their tail ratio and its equivalence bound.
"""

from __future__ import annotations

import math

import ml_collections
from scipy import stats as scipy_stats

from experiments.core import claims, outputs, stats, tabulate
from experiments.core.stats import Estimate


def contrast_labels(results: dict) -> tuple[str, str]:
    """ "n = N (chi = C)" of the chi contrast's block sizes, the larger chi first."""
    dims = results["chi_contrast"]["dims"]
    larger, smaller = sorted(dims, key=lambda n: -dims[n]["chromatic"])
    return _contrast_label(dims, larger), _contrast_label(dims, smaller)


def _contrast_label(dims: dict, n: str) -> str:
    return f"n = {n} (chi = {dims[n]['chromatic']})"


def chi_contrast_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """Per eps: the tail P(|K_hat - K| > eps) at the chi contrast's two block sizes (the larger
    chi first; independent draws), ln of their ratio with its delta-method SE, and the ratio
    the m / chi mechanism would give if the errors were Gaussian with variance proportional to
    chi[P]: 2 Q(z sqrt(chi_low / chi_high)) at the low-chi tail 2 Q(z)."""
    dims = results["chi_contrast"]["dims"]
    high, low = sorted(dims.values(), key=lambda d: -d["chromatic"])
    high_label, low_label = contrast_labels(results)
    rows = []
    for index, eps in enumerate(config.epsilons):
        p_high, p_low = high["tail"][index], low["tail"][index]
        se_high, se_low = high["tail_se"][index], low["tail_se"][index]
        z = scipy_stats.norm.isf(p_low / 2) if p_low > 0 else math.inf
        predicted = 2 * scipy_stats.norm.sf(z * math.sqrt(low["chromatic"] / high["chromatic"]))
        both = p_high > 0 and p_low > 0
        rows.append(
            {
                "eps": float(eps),
                f"tail, {high_label}": p_high,
                f"tail, {high_label} SE": se_high,
                f"tail, {low_label}": p_low,
                f"tail, {low_label} SE": se_low,
                "ln ratio": math.log(p_high / p_low) if both else math.nan,
                "ln ratio SE": math.hypot(se_high / p_high, se_low / p_low) if both else math.nan,
                "m / chi reading": math.log(predicted / p_low) if p_low > 0 else math.nan,
            }
        )
    return rows


def chi_order_cells(results: dict, config: ml_collections.ConfigDict) -> dict[float, Estimate]:
    """The chi contrast's cells as the verdict tests them: per eps where both tails are at
    least ``tail_floor``, ln(tail at the larger chi / tail at the smaller)."""
    high, low = contrast_labels(results)
    return {
        row["eps"]: Estimate(row["ln ratio"], row["ln ratio SE"], config.num_draws)
        for row in chi_contrast_rows(results, config)
        if min(row[f"tail, {high}"], row[f"tail, {low}"]) >= config.chi_contrast.tail_floor
    }


def equivalence_bound_text(estimate: Estimate, level: float, margin: float) -> str:
    """What an interval establishes about an effect's size: the bound B = max(|low|, |high|)
    of the ``level`` interval, i.e. the effect lies within ±B (here a log ratio, so a ratio
    within a factor e^B), and whether B is inside the declared ``margin``."""
    low, high = estimate.interval(level)
    bound = max(abs(low), abs(high))
    inside = "inside" if bound < margin else "not inside"
    return (
        f"equivalence bound: the {100 * level:g}% interval [{low:+.3f}, {high:+.3f}] puts the "
        f"effect within ±{bound:.3f} (a tail ratio within a factor {math.exp(bound):.3f} either "
        f"way), {inside} the declared margin {margin:.3f} (ln 1.1) in both directions"
    )


def chi_contrast_text(results: dict, config: ml_collections.ConfigDict) -> str:
    """The chi contrast's MSEs, its tails at the shown eps and the equivalence bound its pooled
    interval establishes (the verdict's own estimate and level), for the claims' table."""
    dims = results["chi_contrast"]["dims"]
    high, low = (dims[n] for n in sorted(dims, key=lambda n: -dims[n]["chromatic"]))
    labels = contrast_labels(results)
    n = config.num_draws
    mse = [Estimate(d["mse"], d["mse_se"], n) for d in (high, low)]
    difference = stats.independent_difference(*mse)
    shown = min(chi_contrast_rows(results, config), key=lambda r: abs(r["eps"] - 0.15))
    claim = claims.Claim.from_config(config.claims.chi_order)
    return (
        f"{config.chi_contrast.family}, m = {config.chi_contrast.num_features} rows, "
        f"{labels[0]} against {labels[1]}: MSE {mse[0].mean:.4g} against {mse[1].mean:.4g} "
        f"(difference {tabulate.plus_minus(difference.mean, difference.se, '+.2g', '.2g')}); at "
        f"eps = {shown['eps']:g} ln(tail ratio) = "
        f"{tabulate.plus_minus(shown['ln ratio'], shown['ln ratio SE'], '+.3f')}, where the "
        f"m / chi mechanism with Gaussian errors would give {shown['m / chi reading']:+.2f}; "
        + equivalence_bound_text(
            stats.pool(list(chi_order_cells(results, config).values()), shared_units=True),
            claim.level,
            claim.margin,
        )
    )


def contrast_values(results: dict, config: ml_collections.ConfigDict) -> dict[str, str]:
    """The chi contrast's settings, run time and table for the summary template."""
    contrast = results["chi_contrast"]
    dims = contrast["dims"]
    return {
        "contrast_dims": " and ".join(dims),
        "contrast_chis": " and ".join(str(d["chromatic"]) for d in dims.values()),
        "contrast_budgets": " and ".join(str(d["budget"]) for d in dims.values()),
        "contrast_runtime": f"{contrast['seconds'] / 60:.1f} min, 1-min load average "
        f"{contrast['load_average']:.1f} at its end",
        "contrast_table": outputs.markdown_table(
            chi_contrast_rows(results, config), float_format="{:.4g}"
        ),
    }
