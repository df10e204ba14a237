"""Monte Carlo over independent keys in vmapped chunks, the sample mean with its SE, paired
differences of two methods over seeds with their t-tests and confidence intervals, and the
verdict on an ordering tested cell by cell."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import numpy as np
from scipy import stats

from experiments.core import outputs


def draw_in_chunks(
    draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    num_draws: int,
    draws_per_chunk: int,
    description: str,
) -> np.ndarray:
    """Stacks ``draw(keys)`` over ``num_draws`` independent keys in chunks (float64, draws first).

    ``draw`` maps a ``(count,)`` array of keys to a ``(count, ...)`` array (a jitted vmap).
    """
    results = []
    for start in outputs.progress(range(0, num_draws, draws_per_chunk), description):
        count = min(draws_per_chunk, num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        results.append(np.asarray(draw(keys), np.float64))
    return np.concatenate(results)


def mean_and_se(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the first axis and its standard error (NaN for one sample: no spread to
    estimate, and no NumPy warning about it)."""
    count = samples.shape[0]
    if count < 1:
        raise ValueError("samples must have at least one row")
    mean = samples.mean(axis=0)
    if count < 2:
        return mean, np.full_like(mean, np.nan, dtype=np.float64)
    return mean, samples.std(axis=0, ddof=1) / np.sqrt(count)


def paired_difference(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> dict[str, float]:
    """Mean of the paired differences a_i - b_i with its SE, the paired t-test and the Student-t
    confidence interval.

    Args:
      a, b: shape ``(n,)``, n >= 1, paired by index (e.g. seeds sharing initialisation and data).
      confidence: the interval's coverage.

    Returns:
      ``mean``, ``se`` (sd / sqrt(n)), ``sd`` (of the differences, ddof 1), ``t`` (mean / se),
      ``p`` (two-sided paired t-test), ``low`` and ``high`` (mean -/+ t_{(1+confidence)/2, n-1}
      se) and ``n``. With one pair, ``se``, ``sd``, ``low`` and ``high`` are nan; ``t`` and ``p``
      are nan also when the differences have no spread.

    Raises:
      ValueError: if ``a`` and ``b`` are not 1-D of the same length >= 1.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 1:
        raise ValueError(f"a and b must be 1-D of the same length >= 1, got {a.shape}, {b.shape}")
    differences = a - b
    count = len(differences)
    mean = float(differences.mean())
    if count < 2:
        nan = float("nan")
        return {
            "mean": mean,
            "se": nan,
            "sd": nan,
            "t": nan,
            "p": nan,
            "low": nan,
            "high": nan,
            "n": count,
        }
    sd = float(differences.std(ddof=1))
    se = sd / np.sqrt(count)
    half_width = stats.t.ppf((1 + confidence) / 2, count - 1) * se
    t = mean / se if se > 0 else float("nan")
    p = float(2 * stats.t.sf(abs(t), df=count - 1)) if se > 0 else float("nan")
    return {
        "mean": mean,
        "se": float(se),
        "sd": sd,
        "t": float(t),
        "p": p,
        "low": float(mean - half_width),
        "high": float(mean + half_width),
        "n": count,
    }


def ordering_verdict(z: Mapping, claim: str, cells: str, threshold: float = 3.0) -> str:
    """The verdict on an ordering claimed in every cell, from each cell's gap in SEs.

    Args:
      z: per cell (any label), (value of the worse - value of the better) / SE of the
        difference; positive where the claimed order shows.
      claim: what holds when the gap is positive, e.g. "SimRF below ORF".
      cells: what the labels are, e.g. "v" or "(coupling, m)".
      threshold: the gap in SEs that resolves a cell.

    Returns:
      "holds (...)" if every gap exceeds ``threshold``; "does not hold, because ..." with the
      cells where the order is reversed by more than ``threshold`` SE, if any; otherwise
      "resolved only in part: ..." naming the cells within ``threshold`` SE (no verdict: a gap
      inside the noise neither shows nor refutes the order); "not measured" without cells.
    """
    if not z:
        return "not measured"
    shown = [cell for cell, value in z.items() if value > threshold]
    reversed_cells = [cell for cell, value in z.items() if value < -threshold]
    unresolved = [cell for cell, value in z.items() if abs(value) <= threshold]
    if reversed_cells:
        return (
            f"does not hold, because the order is reversed by > {threshold:g} SE at {cells} in "
            f"{reversed_cells}"
        )
    if not unresolved:
        return (
            f"holds ({claim} by > {threshold:g} SE at all {len(z)} {cells}; smallest gap "
            f"{min(z.values()):.1f} SE)"
        )
    return (
        f"resolved only in part: {claim} by > {threshold:g} SE at {cells} in {shown}, within "
        f"{threshold:g} SE at {cells} in {unresolved}, reversed nowhere"
    )
