"""The statistics every study uses: mean ± SE, paired and independent differences with their
intervals, pooled tests over cells, equivalence (TOST), power and the number of units a
resolution needs, multiple-comparison corrections, ratio estimators with delta-method SEs and
Monte Carlo over independent keys in chunks.

An effect is an ``Estimate``: its mean, its standard error, the number of units behind it
(seeds, draws, models) and the degrees of freedom of its t reference distribution (``math.inf``
for a normal one, as for Monte Carlo means over thousands of draws). Intervals, t statistics,
p-values and the units needed to resolve a boundary all come from an ``Estimate``, so every
study states its evidence the same way; ``experiments.core.verdicts`` turns an ``Estimate``
and a declared claim into a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from scipy import integrate
from scipy import stats as scipy_stats

from experiments.core import outputs


@dataclasses.dataclass(frozen=True)
class Estimate:
    """An estimated effect.

    Attributes:
      mean: the estimate.
      se: its standard error (NaN when it cannot be estimated, e.g. from one unit).
      n: the number of units behind it (seeds, draws, models, cells).
      df: degrees of freedom of its t reference distribution; ``math.inf`` for a normal one.
      spread: the standard deviation of one unit where it was computed directly (None: it is
        ``se * sqrt(n)``).
    """

    mean: float
    se: float
    n: int
    df: float = math.inf
    spread: float | None = None

    @property
    def sd(self) -> float:
        """The spread of one unit."""
        return self.se * math.sqrt(self.n) if self.spread is None else self.spread

    @property
    def t(self) -> float:
        """``mean / se``: 0 for no effect without spread (identical paired samples), NaN
        for any other effect without a positive SE."""
        if self.se > 0:
            return self.mean / self.se
        return 0.0 if self.mean == 0 and self.se == 0 else math.nan

    @property
    def p(self) -> float:
        """The two-sided p-value of ``mean = 0`` (NaN without a positive SE)."""
        if not self.se > 0:
            return math.nan
        return float(2 * _distribution(self.df).sf(abs(self.t)))

    def quantile(self, confidence: float) -> float:
        """The two-sided critical value of the reference distribution at ``confidence``."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if not self.df > 0:
            return math.nan
        return float(_distribution(self.df).ppf((1 + confidence) / 2))

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """The two-sided ``confidence`` interval ``mean ± q se``."""
        half = self.quantile(confidence) * self.se
        return self.mean - half, self.mean + half

    def as_dict(self, confidence: float = 0.95) -> dict[str, float]:
        """``mean``, ``se``, ``sd``, ``t``, ``p``, ``low``, ``high`` and ``n`` (table rows)."""
        low, high = self.interval(confidence)
        return {
            "mean": self.mean,
            "se": self.se,
            "sd": self.sd,
            "t": self.t,
            "p": self.p,
            "low": low,
            "high": high,
            "n": self.n,
        }


def _distribution(df: float):
    return scipy_stats.norm if math.isinf(df) else scipy_stats.t(df)


def mean_se(samples, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean over ``axis`` and its standard error, ``sd (ddof 1) / sqrt(count)``.

    The SE is NaN, without a NumPy warning, where it cannot be estimated: from one sample, or
    where a sample is not finite (the mean is then not finite either). Other entries are not
    affected.

    Raises:
      ValueError: if ``samples`` has no entry along ``axis``.

    Example:
      >>> mean, se = mean_se(np.array([1.0, 2.0, 3.0]))
      >>> float(mean), round(float(se), 4)
      (2.0, 0.5774)
    """
    samples = np.asarray(samples, np.float64)
    count = samples.shape[axis]
    if count < 1:
        raise ValueError(f"samples must have at least one entry along axis {axis}")
    with np.errstate(invalid="ignore"):
        mean = samples.mean(axis=axis)
        if count < 2:
            return mean, np.full_like(mean, np.nan)
        finite = np.isfinite(samples).all(axis=axis)
        spread = np.where(finite, samples, 0.0).std(axis=axis, ddof=1)
    return mean, np.where(finite, spread / math.sqrt(count), np.nan)


def sample_estimate(samples) -> Estimate:
    """The mean of 1-D ``samples`` as an ``Estimate`` (t reference with n - 1 df)."""
    samples = np.asarray(samples, np.float64)
    if samples.ndim != 1:
        raise ValueError(f"samples must be 1-D, got shape {samples.shape}")
    mean, se = mean_se(samples)
    count = len(samples)
    spread = float(samples.std(ddof=1)) if count > 1 and np.isfinite(se) else math.nan
    return Estimate(float(mean), float(se), count, float(count - 1), spread)


def paired_difference(a, b) -> Estimate:
    """The mean of the paired differences ``a_i - b_i`` with its SE and ``n - 1`` df.

    Args:
      a, b: shape ``(n,)``, paired by index (seeds sharing initialisation and data, draws
        sharing a key).

    Raises:
      ValueError: if ``a`` and ``b`` are not 1-D of the same length >= 1.

    Example:
      >>> d = paired_difference([3.0, 5.0, 4.0], [1.0, 2.0, 3.0])
      >>> d.mean, d.n, d.df
      (2.0, 3, 2.0)
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 1:
        raise ValueError(f"a and b must be 1-D of the same length >= 1, got {a.shape}, {b.shape}")
    return sample_estimate(a - b)


def independent_difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b`` for independent estimates: SEs in quadrature, Welch-Satterthwaite df."""
    variance = a.se**2 + b.se**2
    return Estimate(a.mean - b.mean, math.sqrt(variance), a.n + b.n, _welch_df((a, b), (1, 1)))


def pool(
    cells: Sequence[Estimate],
    weights: Sequence[float] | None = None,
    *,
    shared_units: bool = False,
) -> Estimate:
    """One estimate from cells: the weighted mean of their means (equal weights by default).

    Independent cells (``shared_units`` False): SE ``sqrt(sum w_i^2 se_i^2) / sum w_i`` and
    Welch-Satterthwaite df; ``n`` counts the units of all cells. Cells measured on the same
    units (the same draws or seeds at every cell, so correlated in an unknown way): SE
    ``sum w_i se_i / sum w_i``, the bound that holds for any correlation, with the smallest
    df; ``n`` is the largest cell's.

    This is the pooled test over cells: one effect, one interval, instead of a verdict that
    needs every cell to pass.

    Raises:
      ValueError: for no cells or weights of another length.

    Example:
      >>> cells = [Estimate(1.0, 0.3, 10), Estimate(2.0, 0.4, 10)]
      >>> pooled = pool(cells)
      >>> pooled.mean, round(pooled.se, 3), round(pool(cells, shared_units=True).se, 3)
      (1.5, 0.25, 0.35)
    """
    if not cells:
        raise ValueError("pool needs at least one cell")
    w = np.ones(len(cells)) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (len(cells),):
        raise ValueError(f"weights must have one entry per cell ({len(cells)}), got {weights}")
    total = float(w.sum())
    pairs = list(zip(w, cells, strict=True))
    mean = float(sum(w * c.mean for w, c in pairs) / total)
    if shared_units:
        se = float(sum(w * c.se for w, c in pairs) / total)
        return Estimate(mean, se, max(c.n for c in cells), min(c.df for c in cells))
    variance = sum(w**2 * c.se**2 for w, c in pairs) / total**2
    return Estimate(mean, math.sqrt(variance), sum(c.n for c in cells), _welch_df(cells, w))


def _welch_df(cells: Sequence[Estimate], weights) -> float:
    parts = [(w * c.se) ** 2 for w, c in zip(weights, cells, strict=True)]
    if any(math.isinf(c.df) for c in cells):
        return math.inf
    denominator = sum(p**2 / c.df for p, c in zip(parts, cells, strict=True) if c.df > 0)
    return float(sum(parts) ** 2 / denominator) if denominator > 0 else math.nan


def tost_p(estimate: Estimate, margin: float) -> float:
    """The p-value of the two one-sided tests of equivalence within ``±margin``: the larger of
    the one-sided p-values of ``mean <= -margin`` and ``mean >= margin``. Equivalence at level
    alpha is shown when it is below alpha, i.e. when the ``1 - 2 alpha`` interval lies inside
    ``[-margin, margin]``."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    if not estimate.se > 0:
        return math.nan
    distribution = _distribution(estimate.df)
    lower = distribution.sf((estimate.mean + margin) / estimate.se)
    upper = distribution.cdf((estimate.mean - margin) / estimate.se)
    return float(max(lower, upper))


def detectable_difference(
    estimate: Estimate, *, confidence: float = 0.95, power: float = 0.8
) -> float:
    """The true mean a two-sided test at ``1 - confidence`` detects with probability ``power``
    at this estimate's SE and df: ``(q_{(1+confidence)/2} + q_power) se``."""
    distribution = _distribution(estimate.df)
    return float((distribution.ppf((1 + confidence) / 2) + distribution.ppf(power)) * estimate.se)


def units_to_resolve(estimate: Estimate, boundary: float, confidence: float) -> int:
    """The number of units at which the two-sided ``confidence`` interval around the observed
    mean would exclude ``boundary``, at the observed spread: the smallest N with
    ``q(N) se sqrt(n / N) < |mean - boundary|``, q(N) the estimate's quantile with its degrees
    of freedom grown by N - n (the t quantile of a mean; the normal quantile gave too few: 3
    seeds where a t interval needs 4). At most ``n`` when the interval excludes it now, at
    least ``n + 1`` when it does not.

    Raises:
      ValueError: if the mean equals the boundary (no number of units separates them).
    """
    distance = abs(estimate.mean - boundary)
    if distance == 0:
        raise ValueError("the mean lies on the boundary: no number of units resolves it")

    def quantile(units: int) -> float:
        df = estimate.df + units - estimate.n
        return float(_distribution(df if df > 0 else 1.0).ppf((1 + confidence) / 2))

    def half_width(units: int) -> float:
        return quantile(units) * estimate.se * math.sqrt(estimate.n / units)

    z = float(scipy_stats.norm.ppf((1 + confidence) / 2))
    normal_count = math.ceil(estimate.n * (z * estimate.se / distance) ** 2)
    if distance > half_width(estimate.n):  # resolved now: how few would still do
        units = max(1, normal_count)
        while units < estimate.n and half_width(units) >= distance:
            units += 1  # at fewer units the t quantile grows: the quantile at n said too few
        return units
    units = max(estimate.n + 1, normal_count)
    while half_width(units) >= distance:  # from the normal count, which t never undercuts
        units += 1
    return units


def units_for_power(
    sd: float, effect: float, *, confidence: float = 0.95, power: float = 0.8
) -> int:
    """Units n at which the two-sided t test of a mean (one sample or paired, as the verdicts
    use it) at ``1 - confidence`` detects a true ``effect`` with probability ``power`` when one
    unit has spread ``sd``: the smallest n >= 2 whose power under the noncentral t
    (df n - 1, noncentrality effect sqrt(n) / sd) reaches ``power``, searched from the normal
    approximation ``((z_{(1+c)/2} + z_power) sd / effect)^2``, which it never undercuts (that
    approximation said 3 seeds for a power of 0.38)."""
    z = scipy_stats.norm.ppf((1 + confidence) / 2) + scipy_stats.norm.ppf(power)
    units = max(2, math.ceil((z * sd / abs(effect)) ** 2))

    def t_power(n: int) -> float:
        critical = scipy_stats.t.ppf((1 + confidence) / 2, n - 1)
        shift = abs(effect) * math.sqrt(n) / sd
        noncentral = scipy_stats.nct(n - 1, shift)
        return float(noncentral.sf(critical) + noncentral.cdf(-critical))

    while t_power(units) < power:
        units += 1
    return units


def units_for_equivalence(
    sd: float, margin: float, *, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Units n at which TOST at level ``alpha`` (``tost_p``: t tests with df n - 1) shows
    equivalence within ``±margin`` with probability ``power`` if the true difference is 0: the
    smallest n >= 2 whose power (``tost_power``) reaches ``power``, searched from the normal
    approximation ``((z_{1-alpha} + z_{(1+power)/2}) sd / margin)^2``, which it never undercuts
    (that approximation said 3 units for a power of 0.56 at sd = margin / 2). 0 when ``sd`` is 0
    (no spread: the mean is the difference)."""
    if not margin > 0 or not sd >= 0:
        raise ValueError(f"margin must be > 0 and sd >= 0, got margin={margin!r}, sd={sd!r}")
    if sd == 0:
        return 0
    z = scipy_stats.norm.ppf(1 - alpha) + scipy_stats.norm.ppf((1 + power) / 2)
    units = max(2, math.ceil((z * sd / margin) ** 2))
    while tost_power(units, sd, margin, alpha=alpha) < power:
        units += 1
    return units


def tost_power(units: int, sd: float, margin: float, *, alpha: float = 0.05) -> float:
    """The probability that TOST at level ``alpha`` over ``units`` paired differences of spread
    ``sd`` shows equivalence within ``±margin`` when the true difference is 0. It shows it when
    ``|mean| + t_{1-alpha, n-1} s / sqrt(n) < margin``; given the sample SD s (independent of the
    mean, ``(n - 1) s^2 / sd^2`` chi-square with n - 1 df) that has probability
    ``2 Phi(sqrt(n) margin / sd - t s / sd) - 1`` where positive, integrated over s."""
    df = units - 1
    critical = scipy_stats.t.ppf(1 - alpha, df)
    reach = math.sqrt(units) * margin / sd  # the margin in SEs of the mean

    def shown(chi_square: float) -> float:
        gap = reach - critical * math.sqrt(chi_square / df)
        return (2 * scipy_stats.norm.cdf(gap) - 1) * scipy_stats.chi2.pdf(chi_square, df)

    largest = df * (reach / critical) ** 2  # beyond it the interval always crosses the margin
    return float(integrate.quad(shown, 0.0, largest, limit=200)[0])


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (reject where the adjusted p < family level).

    Example:
      >>> holm([0.01, 0.04, 0.03]).round(2).tolist()
      [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, np.float64)
    order = np.argsort(p)
    scaled = (len(p) - np.arange(len(p))) * p[order]
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return adjusted


def bonferroni_z(count: int, family_level: float = 0.05) -> float:
    """The two-sided |z| threshold that keeps the family-wise error of ``count`` tests at
    ``family_level``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return float(scipy_stats.norm.isf(family_level / (2 * count)))


def ratio_of_means(numerator, denominator) -> Estimate:
    """``mean(a) / mean(b)`` over the same draws with its delta-method SE,
    ``sd(a - r b) / (sqrt(N) mean(b))``."""
    a, b = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    ratio = a.mean() / b.mean()
    residual = a - ratio * b
    se = residual.std(ddof=1) / (math.sqrt(a.size) * b.mean())
    return Estimate(float(ratio), float(se), a.size, float(a.size - 1))


def log_ratio_of_means(numerator, denominator) -> Estimate:
    """``ln(mean(a) / mean(b))`` over the same draws with its delta-method SE (the covariance of
    the two means included)."""
    a, b = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    mean_a, mean_b, n = a.mean(), b.mean(), len(a)
    covariance = np.cov(a, b, ddof=1) / n
    variance = (
        covariance[0, 0] / mean_a**2
        + covariance[1, 1] / mean_b**2
        - 2 * covariance[0, 1] / (mean_a * mean_b)
    )
    return Estimate(float(np.log(mean_a / mean_b)), math.sqrt(max(float(variance), 0.0)), n)


def mean_log_ratio(numerator, denominator) -> Estimate:
    """The mean of ``ln(a_i / b_i)`` over paired units with its SE (the other averaging rule
    beside ``log_ratio_of_means``: it weights every unit equally, however large its values)."""
    a, b = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    return sample_estimate(np.log(a / b))


def bootstrap_se(
    samples, statistic: Callable[[np.ndarray], float], *, resamples: int = 2000, seed: int = 0
) -> float:
    """The bootstrap standard error of ``statistic(samples)``: the standard deviation (ddof 1)
    of the statistic over ``resamples`` resamples of the 1-D ``samples`` with replacement
    (``numpy.random.default_rng(seed)``), for statistics without a closed-form SE such as
    quantiles and their spreads.

    Raises:
      ValueError: for fewer than 2 samples or resamples.

    Example:
      >>> draws = np.random.default_rng(1).normal(size=4000)
      >>> se = bootstrap_se(draws, np.mean)
      >>> bool(abs(se - 1 / np.sqrt(4000)) < 0.002)  # the mean's SE, 0.0158
      True
    """
    samples = np.asarray(samples, np.float64)
    if samples.ndim != 1 or len(samples) < 2 or resamples < 2:
        raise ValueError(
            f"samples must be 1-D with >= 2 entries and resamples >= 2, got shape "
            f"{samples.shape} and {resamples}"
        )
    rng = np.random.default_rng(seed)
    values = [
        statistic(samples[rng.integers(0, len(samples), len(samples))]) for _ in range(resamples)
    ]
    return float(np.std(values, ddof=1))


def interquartile_range(samples) -> float:
    """The 75% minus the 25% quantile of ``samples`` (NumPy's default interpolation).

    Example:
      >>> interquartile_range(np.arange(5.0))
      2.0
    """
    low, high = np.quantile(np.asarray(samples, np.float64), [0.25, 0.75])
    return float(high - low)


def draw_in_chunks(
    draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    num_draws: int,
    draws_per_chunk: int,
    description: str,
) -> np.ndarray:
    """Stacks ``draw(keys)`` over ``num_draws`` independent keys in chunks (float64, draws
    first). Chunk ``c`` starting at draw ``s`` uses ``split(fold_in(key, s), count)``, so the
    draws do not depend on the chunk size's effect on anything but the split.

    ``draw`` maps a ``(count,)`` array of keys to a ``(count, ...)`` array (a jitted vmap).
    """
    return np.concatenate(list(_chunks(draw, key, num_draws, draws_per_chunk, description)))


def chunked_mean_se(
    draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    num_draws: int,
    draws_per_chunk: int,
    description: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and SE over draws of ``draw(keys)`` (as ``draw_in_chunks``), accumulated chunk by
    chunk without keeping the draws (sums of values and squares in float64)."""
    total = total_sq = 0.0
    for values in _chunks(draw, key, num_draws, draws_per_chunk, description):
        total = total + values.sum(axis=0)
        total_sq = total_sq + (values**2).sum(axis=0)
    mean = np.asarray(total / num_draws)
    variance = (np.asarray(total_sq) - num_draws * mean**2) / (num_draws - 1)
    return mean, np.sqrt(np.maximum(variance, 0.0) / num_draws)


def _chunks(draw, key, num_draws: int, draws_per_chunk: int, description: str):
    if num_draws < 1 or draws_per_chunk < 1:
        raise ValueError(
            f"num_draws and draws_per_chunk must be >= 1, got {num_draws}, {draws_per_chunk}"
        )
    for start in outputs.progress(range(0, num_draws, draws_per_chunk), description):
        count = min(draws_per_chunk, num_draws - start)
        keys = jax.random.split(jax.random.fold_in(key, start), count)
        yield np.asarray(draw(keys), np.float64)
