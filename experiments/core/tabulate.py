"""What every study's report does with its records: pivot runs by seed, pair two arms on the
seeds both have, and write an estimate as text ("mean ± SE", with its interval).

A study's records are lists of runs, each a dict with a ``"seed"`` and the fields that name
its arm (``"run"``, ``"kind"``, ``"attention"``, ...). ``by_seed`` and ``seed_values`` pick one
arm's values, ``paired`` lines two arms up by seed for ``stats.paired_difference``;
``plus_minus``, ``summarise`` and ``estimate_text`` are the one way an estimate is written in a
table cell or a summary sentence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments.core import stats


def by_seed(runs: Iterable[Mapping[str, Any]], value: str, **where: Any) -> dict[Any, Any]:
    """``{seed: run[value]}`` of the runs whose fields equal ``where`` (one arm's values).

    Args:
      runs: records with a ``"seed"`` field.
      value: the field to pick.
      **where: ``field=value`` pairs a run must match (e.g. ``kind="exact"``).

    Raises:
      ValueError: if two matching runs have the same seed (the arm is not named uniquely).

    Examples:
      >>> runs = [{"seed": 1, "kind": "a", "loss": 0.5}, {"seed": 0, "kind": "a", "loss": 0.7},
      ...         {"seed": 0, "kind": "b", "loss": 0.9}]
      >>> by_seed(runs, "loss", kind="a")
      {1: 0.5, 0: 0.7}
    """
    found: dict[Any, Any] = {}
    for run in runs:
        if all(run[key] == wanted for key, wanted in where.items()):
            if run["seed"] in found:
                raise ValueError(f"two runs with seed {run['seed']!r} match {where}")
            found[run["seed"]] = run[value]
    return found


def seed_values(runs: Iterable[Mapping[str, Any]], value: str, **where: Any) -> np.ndarray:
    """One arm's ``value`` in seed order as a float64 array (``by_seed``).

    Examples:
      >>> seed_values([{"seed": 1, "x": 2.0}, {"seed": 0, "x": 3.0}], "x")
      array([3., 2.])
    """
    values = by_seed(runs, value, **where)
    return np.array([values[seed] for seed in sorted(values)], np.float64)


def paired(first: Mapping[Any, float], second: Mapping[Any, float]) -> tuple[np.ndarray, ...]:
    """The values of two arms (``{seed: value}``, as ``by_seed`` gives) on the seeds both
    have, in seed order: ``(first values, second values)``, float64 arrays of equal length
    (empty where no seed is shared).

    Examples:
      >>> paired({0: 1.0, 1: 2.0, 3: 4.0}, {1: 5.0, 0: 6.0, 2: 7.0})
      (array([1., 2.]), array([6., 5.]))
    """
    seeds = sorted(set(first) & set(second))
    return (
        np.array([first[s] for s in seeds], np.float64),
        np.array([second[s] for s in seeds], np.float64),
    )


def paired_arms(
    runs: Iterable[Mapping[str, Any]], value: str, field: str, first: Any, second: Any
) -> tuple[np.ndarray, ...]:
    """``paired`` of two arms named by one field: ``value`` of the runs whose ``field`` is
    ``first`` and of those whose ``field`` is ``second``, on the seeds both have.

    Examples:
      >>> runs = [{"seed": 0, "kind": "a", "loss": 1.0}, {"seed": 0, "kind": "b", "loss": 2.0},
      ...         {"seed": 1, "kind": "a", "loss": 3.0}]
      >>> paired_arms(runs, "loss", "kind", "a", "b")
      (array([1.]), array([2.]))
    """
    return paired(by_seed(runs, value, **{field: first}), by_seed(runs, value, **{field: second}))


def plus_minus(mean: float, se: float, number: str = ".4f", se_number: str | None = None) -> str:
    """``"mean ± se"``: the mean formatted with ``number`` (e.g. ``"+.4f"`` for a signed
    difference), the SE with ``se_number`` (default: ``number`` without a sign); the mean
    alone where the SE is not finite (NaN: one unit gives none; infinite: a heavy tail).

    Examples:
      >>> plus_minus(0.12345, 0.0061)
      '0.1235 ± 0.0061'
      >>> plus_minus(-0.012, 0.004, "+.3f")
      '-0.012 ± 0.004'
      >>> plus_minus(2.5, float("nan"), ".3g", ".2g")
      '2.5'
    """
    shown = format(mean, number)
    if not math.isfinite(se):
        return shown
    return f"{shown} ± {format(se, se_number or number.lstrip('+'))}"


def summarise(
    values: Sequence[float] | np.ndarray, number: str = ".4f", se_number: str | None = None
) -> str:
    """``plus_minus`` of the mean of ``values`` over its first axis and its SE
    (``stats.mean_se``; ``number`` and ``se_number`` as there): the mean alone for one value.

    Examples:
      >>> summarise([1.0, 2.0, 3.0], ".3f")
      '2.000 ± 0.577'
    """
    mean, se = stats.mean_se(np.asarray(values, np.float64))
    return plus_minus(float(mean), float(se), number, se_number)


def estimate_text(
    mean: float,
    se: float,
    interval: tuple[float, float],
    *,
    number: str = ".4f",
    level: float = 0.95,
    details: Sequence[str] = (),
) -> str:
    """An effect with its interval, for a summary sentence:
    ``"+mean ± se (95% CI [+low, +high], details...)"`` (signed, ``number`` digits).

    Args:
      mean, se: the estimate and its standard error.
      interval: ``(low, high)`` at ``level`` (``stats.Estimate.interval``).
      number: format spec of every number, without the sign.
      level: the interval's confidence.
      details: further parts after the interval (``"p = 0.03"``, ``"8 seeds"``).

    Examples:
      >>> estimate = stats.Estimate(0.02, 0.005, 8, 7.0)
      >>> estimate_text(estimate.mean, estimate.se, estimate.interval(), details=["8 seeds"])
      '+0.0200 ± 0.0050 (95% CI [+0.0082, +0.0318], 8 seeds)'
    """
    low, high = interval
    parts = [
        f"{100 * level:g}% CI [{format(low, '+' + number)}, {format(high, '+' + number)}]",
        *details,
    ]
    return f"{plus_minus(mean, se, '+' + number, number)} ({', '.join(parts)})"
