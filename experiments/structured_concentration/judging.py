"""Structured concentration's verdicts: the MSE orderings, the bounds held by the empirical
tails, the chi order and the features a uniform bound needs.
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np
from scipy import stats as scipy_stats

from experiments.core import stats, verdicts
from experiments.core.stats import Estimate
from experiments.structured_concentration.contrast import chi_order_cells, contrast_labels
from experiments.structured_concentration.methods import REFERENCE, method_name
from experiments.structured_concentration.rows import (
    _mse,
    gaussian_uniform_bound,
    method_rows,
    tail_rows,
)


def _circulant_chi(n: int) -> int:
    """chi[P] of a circulant P-model: its coherence graphs are cycles of length n / gcd(n,
    shift), odd for some shift iff n is not a power of 2."""
    return 3 if n & (n - 1) else 2


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares (methods use independent draws)."""
    judge = verdicts.Verdicts(config)
    rows, tails, n = method_rows(results, config), tail_rows(results, config), config.num_draws
    by_name = {r["method"]: r for r in rows}
    worst = max(rows, key=lambda r: abs(r["bias z"]))
    flags = sum(r["pairs abs(z) > 4"] for r in rows)
    judge.effect(
        "unbiased",
        Estimate(worst["bias"], worst["bias SE"], n),
        effect=f"mean error of the most biased of {len(rows)} methods ({worst['method']})",
        units="draws",
        note=f"Pairs with |bias| > 4 SE: {flags} of {len(rows) * config.num_pairs} (chance: "
        f"{len(rows) * config.num_pairs * 6.3e-5:.1f})",
    )
    circulants = [
        m
        for m in ("circulant", "circulant_hd", "skew_circulant", "skew_circulant_hd")
        if m in by_name
    ]
    judge.fact(
        "circulant_chi",
        all(by_name[m]["chi[P]"] == _circulant_chi(by_name[m]["n"]) for m in circulants),
        ", ".join(
            f"{m}: chi[P] = {by_name[m]['chi[P]']} at n = {by_name[m]['n']}" for m in circulants
        )
        + "; Fig. 1 (n = 5): every graph a 5-cycle, chi = 3 (tests)",
    )
    toeplitz = [
        by_name[m]["chi[P]"]
        for m in ("toeplitz", "toeplitz_hd", "hankel", "hankel_hd")
        if m in by_name
    ]
    judge.fact(
        "toeplitz_chi",
        all(c == 2 for c in toeplitz),
        f"chi[P] of Toeplitz/Hankel (plain, HD): {', '.join(map(str, toeplitz))}; Fig. 2 "
        "(5 x 5): four path forests, chi = 2 (tests)",
    )

    def lower(name: str, pairs: list[tuple[str, str]], effect: str, cell_name: str):
        """MSE(second) - MSE(first) over the measured pairs: the first lower."""
        cells = {
            f"{a} vs {b}": stats.independent_difference(_mse(by_name[b], n), _mse(by_name[a], n))
            for a, b in pairs
            if a in by_name and b in by_name
        }
        if not cells:
            return judge.not_tested(name, "the families it compares were not run")
        return judge.ordering(
            name, cells, effect=effect, cell_name=cell_name, units="draws", number=".3g"
        )

    lower(
        "budget",
        [(method_name("toeplitz", p), method_name("circulant", p)) for p in config.preprocess],
        "MSE circulant - Toeplitz",
        "preprocessings",
    )
    lower(
        "ldr",
        [
            (method_name(big, p), method_name(small, p))
            for p in config.preprocess
            for small, big in (("ldr1", "ldr2"), ("ldr2", "ldr4"))
        ],
        "MSE at the smaller displacement rank - the larger",
        "(rank step, preprocessing)",
    )
    lower(
        "hd",
        [(method_name(f, True), method_name(f, False)) for f in config.families if f != REFERENCE],
        "MSE plain - HD",
        "families",
    )
    structured = [r for r in rows if r["family"] != REFERENCE]
    high, low = contrast_labels(results)
    judge.ordering(
        "chi_order",
        chi_order_cells(results, config),
        effect=f"ln(tail at {high} / tail at {low})",
        cell_name="eps",
        units="draws",
        shared_units=True,
    )
    if len(structured) < 5:
        judge.not_tested("lambda_order", "needs at least five structured methods")
    else:
        rho = scipy_stats.spearmanr(
            [r["mean lambda"] for r in structured], [r["MSE"] for r in structured]
        ).statistic
        count = len(structured)
        judge.effect(
            "lambda_order",
            Estimate(
                math.atanh(np.clip(rho, -1 + 1e-9, 1 - 1e-9)), math.sqrt(1.06 / (count - 3)), count
            ),
            effect=f"Fisher z of Spearman(mean lambda, MSE) (rho = {rho:.2f})",
            units="structured methods",
        )
    for claim, bound in (
        ("hoeffding", "Hoeffding"),
        ("p_model", "P-model"),
        ("chromatic", "chromatic"),
    ):
        checked = [t for t in tails if bound != "Hoeffding" or t["family"] == REFERENCE]
        _bound_verdict(judge, claim, checked, bound, "tail", "tail SE", n)
    reference = [t for t in tails if t["method"] == REFERENCE]
    _bound_verdict(judge, "uniform", reference, "uniform", "max tail", "max tail SE", n)
    return judge


def _bound_verdict(judge, name: str, cells: list[dict], bound: str, tail: str, se: str, n: int):
    """The bound holds: the empirical tail minus the bound at the (method, eps) cell where it
    is closest (``Verdicts.below_bound``)."""
    judge.below_bound(
        name,
        cells,
        measured=tail,
        bound=bound,
        se=se,
        draws=n,
        cell=lambda t: f"{t['method']}, eps {t['eps']:g}",
        effect="empirical tail - bound",
        cell_name="(method, eps) cells",
    )


def features_for_uniform_bound(epsilon: float, delta: float, dim: int, diameter: float) -> int:
    """The smallest m (frequencies) with ``rff_uniform_bound <= delta`` (bisection)."""

    def bound(m):
        return float(gaussian_uniform_bound(epsilon, m, dim, diameter))

    high = 1
    while bound(high) > delta:
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if bound(middle) > delta else (low, middle)
    return high


def power_note(rows: list[dict]) -> str:
    """The smallest MSE difference between two methods resolved with 80% power at 5%."""
    structured = [r for r in rows if r["family"] != REFERENCE]
    relative = [2.8 * math.sqrt(2) * r["MSE SE"] / r["MSE"] for r in structured]
    return (
        f"{min(relative):.1%}-{max(relative):.1%} of a structured method's MSE "
        f"(2.8 x the SE of a difference of two methods with similar SEs)"
    )
