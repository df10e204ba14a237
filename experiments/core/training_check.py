"""The training check a model study declares before its runs (``config.trained_check``, built
with ``configs.common.trained_check``): each arm (a kind of model trained on several seeds) must
beat its task's trivial model (or a fixed limit) on a declared metric. ``TrainedCheck`` is the
declaration, ``ArmCheck`` one arm's runs against it (passed, failed, not resolved or not
measured, and the finding in numbers), ``declared`` reads and checks a config's. A config that
trains models (a trainer section, ``TRAINER_SECTIONS``) is refused without one.
``experiments.core.verdicts.Verdicts.check_training`` applies it, and a claim entered by an arm
that failed it is not tested."""

from __future__ import annotations

import dataclasses
import math

import ml_collections
import numpy as np

from experiments.core.stats import Estimate, sample_estimate, units_to_resolve

BETTER = ("lower", "higher")

# Config sections of the core's trainers (``experiments.core.train``: ``train`` for the
# gradient trainer, ``es`` for evolution strategies): a config with one trains models, so it
# must declare ``trained_check``.
TRAINER_SECTIONS = ("train", "es")


@dataclasses.dataclass(frozen=True)
class TrainedCheck:
    """A check, declared before the run (``config.trained_check``, built with
    ``configs.common.trained_check``), that an arm (a kind of model trained on several seeds)
    trained. Each run's ``metric`` must beat a threshold, i.e. lie below it (above where
    ``better`` is ``"higher"``): the stricter of ``limit`` (a fixed value, e.g. chance level)
    and, when ``trivial`` names a record field, the task's trivial model on the same run (a
    count unigram model's perplexity, the same model with uniform attention swapped in, a
    random policy's return) beaten by ``margin`` (a fraction of the trivial model's value where
    ``relative``). The arm passes if every seed beats its threshold or the 95% interval of the
    mean excess over seeds lies beyond it; it fails if that interval lies on the wrong side (one
    seed: if it does not beat it); otherwise its check is not resolved (``ArmCheck``). A NaN
    never beats a threshold.

    Attributes:
      metric: the per-run record field checked, e.g. ``"digit_error_rate"``.
      reason: why a model that does not beat the threshold has not trained, in words.
      limit: a fixed threshold (None: none).
      trivial: the per-run record field holding the trivial model's value ("": none).
      trivial_name: the trivial model in words, e.g. "a count unigram model".
      margin: how far the metric must beat the trivial model's value (>= 0).
      relative: whether ``margin`` is a fraction of the trivial model's value.
      better: ``"lower"`` or ``"higher"``: which way the metric improves.
    """

    metric: str
    reason: str
    limit: float | None = None
    trivial: str = ""
    trivial_name: str = ""
    margin: float = 0.0
    relative: bool = False
    better: str = "lower"

    def __post_init__(self):
        if not (isinstance(self.metric, str) and self.metric):
            raise ValueError(f"trained_check metric must be a record field, got {self.metric!r}")
        if not (isinstance(self.reason, str) and self.reason):
            raise ValueError("trained_check reason must say why failing it means 'not trained'")
        if self.limit is not None and not (
            isinstance(self.limit, (int, float)) and math.isfinite(self.limit)
        ):
            raise ValueError(f"trained_check limit must be a finite number, got {self.limit!r}")
        if not isinstance(self.trivial, str) or bool(self.trivial) != bool(self.trivial_name):
            raise ValueError(
                "trained_check trivial (a record field) and trivial_name (the trivial model in "
                f"words) go together, got {self.trivial!r} and {self.trivial_name!r}"
            )
        if self.limit is None and not self.trivial:
            raise ValueError("trained_check needs a limit, a trivial model, or both")
        if not (isinstance(self.margin, (int, float)) and self.margin >= 0):
            raise ValueError(f"trained_check margin must be a number >= 0, got {self.margin!r}")
        if self.better not in BETTER:
            raise ValueError(f"trained_check better must be one of {BETTER}, got {self.better!r}")

    @property
    def lower(self) -> bool:
        return self.better == "lower"

    def threshold(self, trivial: float | None = None) -> float:
        """The value a run's metric must beat, given its trivial model's value."""
        bounds = [] if self.limit is None else [float(self.limit)]
        if self.trivial:
            if trivial is None:
                raise ValueError(f"the check needs the trivial model's value ({self.trivial})")
            margin = self.margin * abs(trivial) if self.relative else self.margin
            bounds.append(trivial - margin if self.lower else trivial + margin)
        return min(bounds) if self.lower else max(bounds)

    def beats(self, value: float, threshold: float) -> bool:
        """Whether ``value`` beats ``threshold`` (a NaN never does)."""
        return bool(value < threshold) if self.lower else bool(value > threshold)

    def describe(self) -> str:
        """The criterion in words."""
        side = "below" if self.lower else "above"
        parts = [] if self.limit is None else [f"{side} {self.limit:g}"]
        if self.trivial:
            if self.margin == 0:
                by = ""
            elif self.relative:
                by = f" by {self.margin:.0%} of it"
            else:
                by = f" by {self.margin:g}"
            parts.append(f"{'below' if self.lower else 'above'} {self.trivial_name}'s{by}")
        return (
            f"{self.metric} {' and '.join(parts)} (in every seed, or on average over seeds "
            "with 95% confidence)"
        )


CHECK_LEVEL = 0.95  # the confidence of an arm's training check over its seeds


@dataclasses.dataclass(frozen=True)
class ArmCheck:
    """The declared training check applied to one arm's runs (``Verdicts.check_training``).

    Attributes:
      arm: the arm, as the summaries name it.
      values: the check's metric per seed.
      thresholds: the value each seed had to beat.
      trivial: the trivial model's value per seed (empty where the check declares none).
      missing: the record field the runs lack ("" when the check was measured): runs made
        before the check was declared cannot be checked.
    """

    arm: str
    values: tuple[float, ...] = ()
    thresholds: tuple[float, ...] = ()
    trivial: tuple[float, ...] = ()
    missing: str = ""

    @property
    def measured(self) -> bool:
        return not self.missing and bool(self.values)

    def _limit_only(self) -> ArmCheck:
        return dataclasses.replace(self, missing="")

    def excess(self, check: TrainedCheck) -> Estimate:
        """How far the arm beats its thresholds: the mean over seeds of threshold - metric
        (metric - threshold where higher is better), positive where it beats them (a NaN
        metric counts as -inf)."""
        sign = 1.0 if check.lower else -1.0
        excess = sign * (np.asarray(self.thresholds, float) - np.asarray(self.values, float))
        return sample_estimate(np.where(np.isnan(excess), -np.inf, excess))

    def failing(self, check: TrainedCheck) -> int:
        """The number of seeds that do not beat their threshold."""
        return sum(not check.beats(v, t) for v, t in zip(self.values, self.thresholds, strict=True))

    def outcome(self, check: TrainedCheck) -> str:
        """``"passed"``, ``"failed"``, ``"not resolved"`` or ``"not measured"`` (class doc).
        Runs without the trivial model's field but with the metric are checked against the
        limit alone: failing it fails the arm, passing it leaves the check not measured."""
        if self.missing and self.values:  # the limit alone (the trivial model is missing)
            return "failed" if self._limit_only().outcome(check) == "failed" else "not measured"
        if not self.measured:
            return "not measured"
        if self.failing(check) == 0:
            return "passed"
        excess = self.excess(check)
        if len(self.values) == 1 or not math.isfinite(excess.mean):
            return "failed"
        low, high = excess.interval(CHECK_LEVEL) if excess.se > 0 else (excess.mean,) * 2
        if low > 0:
            return "passed"
        if high < 0:
            return "failed"
        return "not resolved"

    def passed(self, check: TrainedCheck) -> bool:
        return self.outcome(check) == "passed"

    def finding(self, check: TrainedCheck) -> str:
        """The arm's numbers against the check: how many seeds fail it, how far the arm is from
        the trivial model (or the limit), and, where the check is not resolved, how many seeds
        would resolve it."""
        if self.missing and self.outcome(check) == "failed":
            return (
                f"{self._limit_only().finding(check)} (against the limit alone: the runs have "
                f"no `{self.missing}`)"
            )
        if not self.measured:
            return (
                f"{self.arm}: not measured (its runs have no `{self.missing}`: they were made "
                "before the check was declared)"
            )
        values = np.asarray(self.values, float)
        text = (
            f"{self.arm}: {check.metric} {_spread(values)} over {_count(len(values), 'seed')}, "
            f"{self.failing(check)} of {len(values)} failing"
        )
        if self.trivial:
            trivial = np.asarray(self.trivial, float)
            difference = sample_estimate(values - trivial)
            text += (
                f"; {check.trivial_name} {_spread(trivial)}: the arm minus it "
                + (
                    f"{difference.mean:+.4g} ± {difference.se:.2g} per seed, "
                    if difference.se > 0
                    else ""
                )
                + _spread(values - trivial, sign=True)
            )
            if np.all(trivial > 0):
                text += f", {np.mean(values / trivial):.3g} times it"
        if check.limit is not None:
            text += f" (limit {check.limit:g})"
        if self.outcome(check) == "not resolved":
            excess = self.excess(check)
            needed = max(len(self.values) + 1, units_to_resolve(excess, 0.0, CHECK_LEVEL))
            text += (
                f"; its excess over the threshold, {excess.mean:+.4g} ± {excess.se:.2g}, "
                f"straddles 0 at {CHECK_LEVEL:.0%}: not resolved (about {needed} seeds would "
                "resolve it at the observed spread)"
            )
        return text


def _count(number: int, noun: str) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _spread(values: np.ndarray, sign: bool = False) -> str:
    """``mean (min to max)`` of per-seed values."""
    spec = "+.4g" if sign else ".4g"
    if np.all(values == values[0]):
        return format(float(values[0]), spec)
    return (
        f"{format(float(np.mean(values)), spec)} ({format(float(np.min(values)), spec)} to "
        f"{format(float(np.max(values)), spec)})"
    )


def declared(config: ml_collections.ConfigDict) -> TrainedCheck | None:
    """The training check ``config`` declares (``config.trained_check``), checked; None if it
    declares none.

    Raises:
      ValueError: naming the field, for a malformed check, or for a config that trains models
        (it has a trainer section, ``TRAINER_SECTIONS``) and declares no check.
    """
    entry = config.get("trained_check")
    if entry is None:
        sections = trainer_sections(config)
        if sections:
            raise ValueError(
                f"config.trained_check is missing: a config that trains models (config."
                f"{sections[0]}) declares, before its runs, the check that each arm trained "
                "against its task's trivial model (configs.common.trained_check)"
            )
        return None
    values = dict(entry)
    fields = {f.name for f in dataclasses.fields(TrainedCheck)}
    if not set(values) <= fields or "metric" not in values or "reason" not in values:
        raise ValueError(
            f"config.trained_check must have fields among {sorted(fields)} (metric and reason "
            f"required), got {sorted(values)}"
        )
    try:
        return TrainedCheck(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config.{error}") from None


def trainer_sections(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """The dotted names of the trainer sections (``TRAINER_SECTIONS``) of ``config`` and of
    its nested configs (a study may train another study's models: ``"vit.train"``)."""
    found = [f"{prefix}{name}" for name in TRAINER_SECTIONS if name in config]
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict) and name not in TRAINER_SECTIONS:
            found += trainer_sections(value, f"{prefix}{name}.")
    return found
