"""The plots the studies share: a series with a band, learning curves and forest plots.

``series`` draws a line with a shaded band around it (an interval, a range). A training run's
curve is its metrics log (``experiments.core.train.metrics_log``): records with a ``"split"``
(``"train"`` or ``"eval"``), a ``"step"`` and the metrics. ``logged_series`` stacks one metric
of several runs (seeds) into a ``(runs, steps)`` array and ``mean_se_band`` draws its mean with
a ± 1 SE band. ``forest`` draws estimates with their intervals, one row each, beside zero.
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
    series(axis, steps, mean, mean - se, mean + se, color=color, label=label, style=style)


def series(
    axis,
    x,
    y,
    low,
    high,
    *,
    color: str,
    label: str | None = None,
    style: str | None = None,
    alpha: float = 0.2,
    band_label: str | None = None,
    **line: Any,
) -> None:
    """Plots ``y`` against ``x`` on the matplotlib ``axis`` as a line in ``color`` and the line
    ``style`` (a format string such as ``"o-"``; default: solid), with the band from ``low``
    to ``high`` shaded in the same colour at opacity ``alpha``.

    Args:
      axis: the matplotlib axes.
      x, y, low, high: sequences of one length: the points, the line and the band's edges.
      color: the colour of both.
      label, band_label: the legend entries of the line and of the band (none where None).
      style: the line's format string.
      alpha: the band's opacity.
      **line: further properties of the line (``ms=3``, ``lw=1.4``).

    Examples:
      >>> import matplotlib.pyplot as plt
      >>> figure, axis = plt.subplots()
      >>> series(axis, [1, 2], [2.0, 3.0], [1.5, 2.0], [2.5, 4.0], color="C0", style="o-")
      >>> axis.get_lines()[0].get_ydata().tolist()
      [2.0, 3.0]
      >>> plt.close(figure)
    """
    points = (x, y) if style is None else (x, y, style)
    axis.plot(*points, color=color, label=label, **line)
    axis.fill_between(x, low, high, color=color, alpha=alpha, label=band_label)


def forest(
    axis,
    means: Sequence[float],
    errors,
    labels: Sequence[str],
    *,
    color: str | None,
    top_down: bool = False,
    capsize: float = 3,
    label: str | None = None,
    zero_color: str = "black",
    zero_width: float = 0.8,
    fontsize: float | None = None,
) -> np.ndarray:
    """A forest plot on the matplotlib ``axis``: one row per estimate, its mean a point and its
    interval a horizontal bar, with a vertical line at zero (no difference).

    Args:
      axis: the matplotlib axes.
      means: the estimates, one per row.
      errors: the bars' half-widths as matplotlib's ``xerr`` takes them: one per row
        (symmetric, e.g. 2 SE) or two sequences ``(below, above)`` (an interval:
        ``[mean - low, high - mean]``).
      labels: the rows' tick labels.
      color: the colour of every row, drawn in one call; None: one colour per row, the axis'
        colour cycle (``errors`` then as ``(below, above)``).
      top_down: the first row at the top (default: at the bottom).
      capsize: the bars' cap length (points).
      label: the legend entry of the rows (with ``color`` only).
      zero_color, zero_width: the zero line's colour and width.
      fontsize: the tick labels' size (default: matplotlib's).

    Returns:
      The rows' y positions.

    Examples:
      >>> import matplotlib.pyplot as plt
      >>> figure, axis = plt.subplots()
      >>> forest(axis, [0.5, -0.2], [0.1, 0.3], ["a", "b"], color="C0", top_down=True).tolist()
      [1, 0]
      >>> plt.close(figure)
    """
    y = np.arange(len(labels))[::-1] if top_down else np.arange(len(labels))
    if color is None:
        below, above = errors
        for row, mean in enumerate(means):
            xerr = [[below[row]], [above[row]]]
            axis.errorbar(mean, y[row], xerr=xerr, fmt="o", capsize=capsize)
    else:
        axis.errorbar(means, y, xerr=errors, fmt="o", capsize=capsize, color=color, label=label)
    axis.axvline(0, color=zero_color, linewidth=zero_width)
    axis.set_yticks(y, labels, **({} if fontsize is None else {"fontsize": fontsize}))
    return y
