"""The plots the studies share: learning curves logged during training and their mean over
runs with a ± 1 SE band.

A training run's curve is its metrics log (``experiments.core.train.metrics_log``): records
with a ``"split"`` (``"train"`` or ``"eval"``), a ``"step"`` and the metrics. ``logged_series``
stacks one metric of several runs (seeds) into a ``(runs, steps)`` array and
``mean_se_band`` draws its mean with the band.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def logged_series(
    curves: Sequence[Sequence[Mapping[str, Any]]],
    split: str,
    value: str | Callable[[Any], float],
) -> tuple[list, np.ndarray]:
    """One metric of several runs' logs at the records of ``split``.

    Args:
      curves: one metrics log per run (records with ``"split"`` and ``"step"``), all logged at
        the same steps.
      split: the records to take (``"train"`` or ``"eval"``).
      value: the metric's name, or a function of a record (a derived metric).

    Returns:
      ``(steps, values)``: the first run's steps and a float64 array ``(runs, steps)``.

    Raises:
      ValueError: if the runs were logged at different steps (their mean would mix steps).

    Examples:
      >>> log = [{"split": "eval", "step": 10, "loss": 2.0}, {"split": "train", "step": 10,
      ...        "loss": 3.0}, {"split": "eval", "step": 20, "loss": 1.0}]
      >>> steps, values = logged_series([log, log], "eval", "loss")
      >>> steps, values.tolist()
      ([10, 20], [[2.0, 1.0], [2.0, 1.0]])
    """
    pick = (lambda record: record[value]) if isinstance(value, str) else value
    runs = [[r for r in curve if r["split"] == split] for curve in curves]
    steps = [r["step"] for r in runs[0]]
    for run in runs[1:]:
        if [r["step"] for r in run] != steps:
            raise ValueError(f"the runs' {split!r} records are logged at different steps")
    return steps, np.array([[pick(r) for r in run] for run in runs], np.float64)


def mean_se_band(
    axis, steps: Sequence[float], values, *, color: str, label: str, style: str | None = None
) -> None:
    """Plots the mean over runs (rows of ``values``, one column per step) with a ± 1 SE band
    (no band for one run) on the matplotlib ``axis``, in ``color`` and the line ``style``
    (a format string such as ``"--"``; default: solid)."""
    values = np.asarray(values, float)
    mean = values.mean(0)
    count = values.shape[0]
    se = values.std(0, ddof=1) / np.sqrt(count) if count > 1 else np.zeros_like(mean)
    line = (steps, mean) if style is None else (steps, mean, style)
    axis.plot(*line, color=color, label=label)
    axis.fill_between(steps, mean - se, mean + se, color=color, alpha=0.2)
