"""One verdict rule for every study.

A config declares its claims before the run (``config.claims``, built with
``configs.common.claim``): what is claimed, the test (an ordering, equivalence,
non-inferiority, agreement within k SE) and the margin beyond which an effect against the claim
refutes it. A study measures an effect (an ``experiments.core.stats.Estimate``) and ``Verdicts``
turns claim and effect into a ``Verdict`` with exactly one of four outcomes:

- **holds**: the interval at the claim's confidence lies where the claim says;
- **does not hold**: the interval lies against the claim beyond the declared margin. Never with
  a zero margin and never from a variant that is not sized to test the claims
  (``config.powered`` False: quick and smoke variants, undertrained models), whose summaries
  open with a note saying so and naming the variant that is (``unpowered_note``);
- **not resolved**: the interval straddles a boundary; the sentence says how many units (seeds,
  draws) would resolve it at the observed spread, or why no number would;
- **not tested**: the design could not test the claim; the sentence says why. In particular a
  claim whose test uses an arm (a kind of model trained on several seeds) that failed the
  config's declared training check (``config.trained_check``: ``TrainedCheck``) is not tested
  (``Verdicts.untrained``): a model that did not train neither supports nor refutes a claim.

Verdict prose comes from here only: a study passes numbers, never sentences about outcomes.
``Verdicts.write`` stores the verdicts (``verdicts.json``) for the results page.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from experiments.core import outputs
from experiments.core.stats import Estimate, pool, units_to_resolve

VERDICTS_FILE = "verdicts.json"


class Outcome(enum.StrEnum):
    HOLDS = "holds"
    DOES_NOT_HOLD = "does not hold"
    NOT_RESOLVED = "not resolved"
    NOT_TESTED = "not tested"


# test -> (default confidence, whether it needs a margin > 0, what it claims about the effect)
TESTS = {
    "greater": (0.95, False, "the effect is > 0"),
    "less": (0.95, False, "the effect is < 0"),
    "noninferior": (0.95, True, "the effect is > -margin (higher is better)"),
    "nonsuperior": (0.95, True, "the effect is < +margin (lower is better)"),
    "equivalent": (0.90, True, "the effect is within ±margin (two one-sided tests)"),
    "within_se": (0.95, False, "the effect is within k SE of 0 (agreement with a reference)"),
    "fact": (0.95, False, "a deterministic statement (a closed form, a graph colouring): no noise"),
}


POOLINGS = ("equal", "precision")


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim as its config declares it (see ``configs.common.claim``).

    Attributes:
      statement: the claim in words, with its source.
      test: one of ``TESTS``.
      margin: the size of an effect against the claim that refutes it (>= 0; in the effect's
        units, or a fraction of a reference value when ``relative``).
      relative: whether ``margin`` is a fraction of a reference the study passes.
      confidence: the interval's coverage (0 for the test's default: 0.90 for equivalence,
        i.e. TOST at 5%, 0.95 otherwise).
      k: for ``within_se``, the number of SEs that count as agreement.
      pooling: how an ordering over cells weights them: ``"equal"`` (the plain mean effect over
        the cells) or ``"precision"`` (weights 1 / se^2: for cells whose noise differs by orders
        of magnitude, e.g. Monte Carlo cells with heavy tails).
    """

    statement: str
    test: str
    margin: float = 0.0
    relative: bool = False
    confidence: float = 0.0
    k: float = 3.0
    pooling: str = "equal"

    def __post_init__(self):
        if self.test not in TESTS:
            raise ValueError(f"claim test must be one of {tuple(TESTS)}, got {self.test!r}")
        if not (isinstance(self.margin, (int, float)) and self.margin >= 0):
            raise ValueError(f"claim margin must be a number >= 0, got {self.margin!r}")
        if TESTS[self.test][1] and not self.margin > 0:
            raise ValueError(f"a {self.test!r} claim needs a margin > 0, got {self.margin!r}")
        if not (self.confidence == 0 or 0 < self.confidence < 1):
            raise ValueError(f"claim confidence must be in (0, 1) or 0, got {self.confidence!r}")
        if not self.k > 0:
            raise ValueError(f"claim k must be > 0, got {self.k!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"claim pooling must be one of {POOLINGS}, got {self.pooling!r}")

    @property
    def level(self) -> float:
        """The interval's coverage."""
        return self.confidence or TESTS[self.test][0]

    @classmethod
    def from_config(cls, entry: ml_collections.ConfigDict | Mapping) -> Claim:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = dict(entry)
        unknown = set(values) - fields
        if unknown:
            raise ValueError(f"claim fields {sorted(unknown)} are not among {sorted(fields)}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim's outcome with its evidence and the margin it was judged at."""

    claim: str
    outcome: Outcome
    evidence: str
    margin: str

    def sentence(self) -> str:
        """``**outcome**: evidence`` (for summaries)."""
        return f"**{self.outcome}**: {self.evidence}"

    def as_dict(self) -> dict[str, str]:
        return {**dataclasses.asdict(self), "outcome": str(self.outcome)}


@dataclasses.dataclass(frozen=True)
class TrainedCheck:
    """A check, declared before the run (``config.trained_check``, built with
    ``configs.common.trained_check``), that an arm trained at all: it passes if its
    ``metric`` is below ``ceiling`` in every seed (a NaN fails).

    Attributes:
      metric: the per-run record field checked, e.g. ``"digit_error_rate"``.
      ceiling: the value every seed's ``metric`` must be below.
      reason: why a model at or above the ceiling has not trained, in words.
    """

    metric: str
    ceiling: float
    reason: str

    def __post_init__(self):
        if not (isinstance(self.metric, str) and self.metric):
            raise ValueError(f"trained_check metric must be a record field, got {self.metric!r}")
        if not (isinstance(self.ceiling, (int, float)) and math.isfinite(self.ceiling)):
            raise ValueError(f"trained_check ceiling must be a finite number, got {self.ceiling!r}")
        if not (isinstance(self.reason, str) and self.reason):
            raise ValueError("trained_check reason must say why the ceiling means 'not trained'")

    def passes(self, values: Sequence[float]) -> bool:
        """Whether an arm with these per-seed values of ``metric`` trained."""
        return len(values) > 0 and all(float(v) < self.ceiling for v in values)

    def describe(self) -> str:
        """The criterion in words."""
        return f"{self.metric} < {self.ceiling:g} in every seed"


def trained_check(config: ml_collections.ConfigDict) -> TrainedCheck | None:
    """The training check ``config`` declares (``config.trained_check``), checked; None if it
    declares none.

    Raises:
      ValueError: naming the field, for a malformed check.
    """
    entry = config.get("trained_check")
    if entry is None:
        return None
    values = dict(entry)
    fields = {f.name for f in dataclasses.fields(TrainedCheck)}
    if set(values) != fields:
        raise ValueError(
            f"config.trained_check must have the fields {sorted(fields)}, got {sorted(values)}"
        )
    try:
        return TrainedCheck(**values)
    except ValueError as error:
        raise ValueError(f"config.{error}") from None


def validate_claims(config: ml_collections.ConfigDict) -> dict[str, Claim]:
    """The claims ``config`` declares, checked (``ValueError`` naming the claim)."""
    if "claims" not in config:
        raise ValueError("config.claims is missing: declare the claims before the run")
    claims = {}
    for name, entry in config.claims.items():
        try:
            claims[name] = Claim.from_config(entry)
        except (TypeError, ValueError) as error:
            raise ValueError(f"config.claims.{name}: {error}") from None
    if not isinstance(config.get("powered", True), bool):
        raise TypeError(f"config.powered must be a bool, got {config.powered!r}")
    return claims


def _number(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "nan"


class Verdicts:
    """The verdicts of one report, judged by the claims ``config`` declares.

    Every method takes the name of a declared claim and returns its ``Verdict``; ``write``
    stores them all (and raises if a declared claim got none).

    Args:
      config: the run's config, with ``claims``, ``powered`` (default True; False for a
        variant not sized to test the claims: its verdicts are never "does not hold") and
        optionally ``trained_check`` (``TrainedCheck``).
    """

    def __init__(self, config: ml_collections.ConfigDict):
        self.claims = validate_claims(config)
        self.powered = bool(config.get("powered", True))
        self.trained_check = trained_check(config)
        self.given: dict[str, Verdict] = {}

    def _claim(self, name: str) -> Claim:
        if name not in self.claims:
            raise KeyError(f"claim {name!r} is not declared in config.claims {tuple(self.claims)}")
        return self.claims[name]

    def _record(self, name: str, verdict: Verdict) -> Verdict:
        self.given[name] = verdict
        return verdict

    def margin_of(self, name: str, reference: float | None = None) -> float:
        """The declared margin of claim ``name`` in the effect's units."""
        claim = self._claim(name)
        if not claim.relative:
            return float(claim.margin)
        if reference is None or not math.isfinite(reference):
            raise ValueError(f"claim {name!r} has a relative margin: pass a finite reference")
        return float(claim.margin * abs(reference))

    def not_tested(self, name: str, why: str) -> Verdict:
        """A claim the design could not test, and why."""
        claim = self._claim(name)
        return self._record(name, Verdict(claim.statement, Outcome.NOT_TESTED, why, "—"))

    def untrained_arms(self, runs: Sequence[Mapping[str, Any]], arm: str) -> list[str]:
        """The arms that fail the declared training check ([] if the config declares none), in
        the order they first appear in ``runs`` (one record per run: its arm under the key
        ``arm``, the check's metric under its name)."""
        check = self.trained_check
        if check is None:
            return []
        values: dict[str, list[float]] = {}
        for run in runs:
            values.setdefault(run[arm], []).append(run[check.metric])
        return [name for name, seeds in values.items() if not check.passes(seeds)]

    def untrained(self, name: str, arms: Mapping[str, str], *, remedy: str) -> Verdict:
        """Claim ``name`` is not tested: its test uses ``arms`` (arm -> the evidence that it did
        not train: its metric, its losses), which failed the declared training check;
        ``remedy`` says what would test it."""
        if self.trained_check is None or not arms:
            raise ValueError("untrained needs a declared config.trained_check and failing arms")
        listed = "; ".join(f"{arm}: {evidence}" for arm, evidence in arms.items())
        return self.not_tested(
            name,
            f"{', '.join(arms)} did not train (declared check: "
            f"{self.trained_check.describe()}), and a model that did not train neither "
            f"supports nor refutes the claim: {listed}. What would test it: {remedy}",
        )

    def effect(
        self,
        name: str,
        estimate: Estimate,
        *,
        effect: str,
        units: str,
        reference: float | None = None,
        number: str = ".3g",
        note: str = "",
    ) -> Verdict:
        """The verdict on claim ``name`` from one estimated ``effect``.

        Args:
          name: a claim declared in ``config.claims``.
          estimate: the effect, oriented as the claim's test reads it (e.g. for ``greater``,
            positive where the claim shows).
          effect: what the estimate is, e.g. "SimRF - ORF test accuracy".
          units: what ``estimate.n`` counts ("seeds", "draws", ...).
          reference: the value a relative margin is a fraction of.
          number: format spec of the numbers in the evidence.
          note: a sentence appended to the evidence.
        """
        claim = self._claim(name)
        margin = self.margin_of(name, reference)
        margin_text = _margin_text(claim, margin, number)
        if claim.test == "within_se":
            outcome, reason = self._within_se(claim, estimate, margin, number)
        else:
            outcome, reason = self._interval_rule(claim, estimate, margin, units, number)
        evidence = f"{_estimate_text(effect, estimate, claim.level, units, number)}; {reason}"
        if note:
            evidence += f". {note}"
        return self._record(name, Verdict(claim.statement, outcome, evidence, margin_text))

    def worst_cell(
        self,
        name: str,
        cells: Mapping[Any, Estimate],
        *,
        effect: str,
        units: str,
        cell_name: str = "cells",
        number: str = ".3g",
        note: str = "",
    ) -> Verdict:
        """The verdict on agreement in every cell (a ``within_se`` claim: a closed form checked
        by Monte Carlo) from the cell farthest from it in SEs."""
        checked = {c: e for c, e in cells.items() if math.isfinite(e.mean) and e.se > 0}
        if not checked:
            return self.not_tested(name, f"no {cell_name} with a finite estimate and SE")
        cell, worst = max(checked.items(), key=lambda item: abs(item[1].mean) / item[1].se)
        return self.effect(
            name,
            worst,
            effect=f"{effect} at the worst of {len(checked)} {cell_name} ({cell})",
            units=units,
            number=number,
            note=note,
        )

    def ordering(
        self,
        name: str,
        cells: Mapping[Any, Estimate],
        *,
        effect: str,
        cell_name: str,
        units: str,
        reference: float | None = None,
        number: str = ".3g",
        k: float = 3.0,
        shared_units: bool = False,
    ) -> Verdict:
        """The verdict on an ordering over cells: one pooled test of the mean effect over the
        cells (``stats.pool``, weighted as the claim declares; ``shared_units`` where every
        cell is measured on the same draws or seeds), with, for description, the cells where
        the effect alone is beyond ``k`` SE either way. Cells without a finite estimate or SE
        are left out (and counted)."""
        if not cells:
            return self.not_tested(name, f"no {cell_name} measured")
        finite = {c: e for c, e in cells.items() if math.isfinite(e.mean) and e.se > 0}
        if not finite:
            return self.not_tested(name, f"no {cell_name} with a finite estimate and SE")
        precision = self._claim(name).pooling == "precision"
        weights = [1 / e.se**2 for e in finite.values()] if precision else None
        pooled = pool(list(finite.values()), weights, shared_units=shared_units)
        shown = [c for c, e in finite.items() if e.mean > k * e.se]
        against = [c for c, e in finite.items() if e.mean < -k * e.se]
        test = self._claim(name).test
        if test in ("less", "nonsuperior"):
            shown, against = against, shown
        note = (
            f"Cell by cell: beyond {k:g} SE the claimed way at {len(shown)} of {len(finite)} "
            f"{cell_name}, the other way at {_cells_text(against, cell_name)}"
        )
        if test == "equivalent":
            note = (
                f"Cell by cell: beyond {k:g} SE of 0 at {len(shown) + len(against)} of "
                f"{len(finite)} {cell_name} ({len(shown)} above, {len(against)} below)"
            )
        if len(finite) < len(cells):
            note += f"; {len(cells) - len(finite)} {cell_name} without a finite estimate left out"
        return self.effect(
            name,
            pooled,
            effect=f"{effect}, {'precision-weighted ' if precision else ''}mean over "
            f"{len(finite)} {cell_name}"
            + (" (SE bounded for units shared by the cells)" if shared_units else ""),
            units=units,
            reference=reference,
            number=number,
            note=note,
        )

    def every(
        self,
        name: str,
        cells: Mapping[Any, Estimate],
        *,
        effect: str,
        cell_name: str,
        units: str,
        number: str = ".3g",
    ) -> Verdict:
        """The verdict on a claim about every cell (an intersection-union test, for
        equivalence, where pooling signed effects would let deviations of both signs cancel):
        it holds if it holds in every cell at the claim's confidence (no correction needed);
        it does not hold if in some cell the interval at the Bonferroni-corrected confidence
        lies against it beyond the margin; otherwise it is not resolved, and the sentence names
        the unresolved cells and the units the worst of them needs."""
        claim = self._claim(name)
        if not cells:
            return self.not_tested(name, f"no {cell_name} measured")
        margin = self.margin_of(name)
        strict = dataclasses.replace(claim, confidence=1 - (1 - claim.level) / len(cells))
        failing = [c for c, e in cells.items() if _side(strict, e, margin) == "against"]
        open_cells = [c for c, e in cells.items() if _side(claim, e, margin) != "holds"]
        worst = max(cells.items(), key=lambda item: abs(item[1].mean) / max(item[1].se, 1e-300))
        head = _estimate_text(
            f"{effect} at the farthest {cell_name} ({worst[0]})",
            worst[1],
            claim.level,
            units,
            number,
        )
        if failing:
            outcome = Outcome.DOES_NOT_HOLD if self.powered else Outcome.NOT_RESOLVED
            reason = (
                f"against the claim beyond the margin {_number(margin, number)} at "
                f"{_cells_text(failing, cell_name)} (intervals at {100 * strict.level:.4g}%, "
                f"Bonferroni over {len(cells)} {cell_name})"
            ) + ("" if self.powered else f", but {UNPOWERED}")
        elif not open_cells:
            outcome, reason = Outcome.HOLDS, f"it holds at all {len(cells)} {cell_name}"
        else:
            outcome = Outcome.NOT_RESOLVED
            reason = f"not resolved at {_cells_text(open_cells, cell_name)} of {len(cells)}: " + (
                "; ".join(
                    f"{cell}: {_unresolved_text(claim, cells[cell], margin, units, number)}"
                    for cell in open_cells
                )
            )
        verdict = Verdict(
            claim.statement, outcome, f"{head}; {reason}", _margin_text(claim, margin, number)
        )
        return self._record(name, verdict)

    def fact(self, name: str, true: bool, evidence: str) -> Verdict:
        """The verdict on a deterministic statement (claim test ``"fact"``): computed exactly,
        with no noise to resolve, so it holds or does not hold (in a variant not sized to test
        the claims, a false statement is "not resolved": it was computed at that variant's
        sizes)."""
        claim = self._claim(name)
        if claim.test != "fact":
            raise ValueError(f"claim {name!r} is a {claim.test!r} claim, not a 'fact'")
        if true:
            outcome = Outcome.HOLDS
        elif self.powered:
            outcome = Outcome.DOES_NOT_HOLD
        else:
            outcome, evidence = Outcome.NOT_RESOLVED, f"{evidence}; false here, but {UNPOWERED}"
        return self._record(name, Verdict(claim.statement, outcome, evidence, "exact"))

    def exact(self, name: str, value: float, *, effect: str, number: str = ".3g") -> Verdict:
        """``fact``: a closed-form ``value`` that the claim says is > 0."""
        return self.fact(name, value > 0, f"{effect} = {_number(value, '+' + number)} (exact)")

    def _interval_rule(self, claim, estimate, margin, units, number):
        side = _side(claim, estimate, margin)
        lies = "it lies" if estimate.se == 0 else "the interval lies"
        if side == "none":
            return Outcome.NOT_RESOLVED, "no interval (too few units or no spread)"
        if side == "holds":
            return Outcome.HOLDS, f"{lies} {_region_text(_regions(claim.test, margin)[0], number)}"
        if side == "against" and self.powered:
            return Outcome.DOES_NOT_HOLD, (
                f"{lies} against the claim beyond the margin {_number(margin, number)}"
            )
        if side == "against":
            return Outcome.NOT_RESOLVED, (
                f"{lies} against the claim beyond the margin, but {UNPOWERED}"
            )
        return Outcome.NOT_RESOLVED, _unresolved_text(claim, estimate, margin, units, number)

    def _within_se(self, claim, estimate, margin, number):
        z = abs(estimate.mean) / estimate.se if estimate.se > 0 else math.inf
        if abs(estimate.mean) <= claim.k * estimate.se or estimate.mean == 0:
            return Outcome.HOLDS, f"within {claim.k:g} SE ({z:.2f} SE)"
        beyond = abs(estimate.mean) - claim.k * estimate.se
        if margin > 0 and beyond > margin and self.powered:
            return Outcome.DOES_NOT_HOLD, (
                f"{z:.2f} SE off, beyond {claim.k:g} SE by more than the margin "
                f"{_number(margin, number)}"
            )
        why = (
            "by less than the margin"
            if margin > 0
            else "and no margin is declared, so a disagreement cannot refute the claim"
        )
        return Outcome.NOT_RESOLVED, f"{z:.2f} SE off (more than {claim.k:g} SE), {why}"


def _regions(test: str, margin: float):
    """(holds region, fails region or None) as open intervals of the effect."""
    inf = math.inf
    if test == "greater":
        return (0.0, inf), ((-inf, -margin) if margin > 0 else None)
    if test == "less":
        return (-inf, 0.0), ((margin, inf) if margin > 0 else None)
    if test == "noninferior":
        return (-margin, inf), (-inf, -margin)
    if test == "nonsuperior":
        return (-inf, margin), (margin, inf)
    return (-margin, margin), None  # equivalent: fails on either side, see _interval_rule


UNPOWERED = (
    "this variant is not sized to test the claims (config.powered is False), so it cannot refute it"
)


def _side(claim: Claim, estimate: Estimate, margin: float) -> str:
    """Where the claim's interval lies: ``"holds"``, ``"against"`` (beyond the margin),
    ``"open"`` (straddling) or ``"none"`` (no interval)."""
    low, high = estimate.interval(claim.level)
    if not (math.isfinite(low) and math.isfinite(high)):
        return "none"
    holds, fails = _regions(claim.test, margin)
    if _inside((low, high), holds):
        return "holds"
    if _inside((low, high), fails) or (
        claim.test == "equivalent" and (low > margin or high < -margin)
    ):
        return "against"
    return "open"


def _inside(interval: tuple[float, float], region: tuple[float, float] | None) -> bool:
    return region is not None and region[0] < interval[0] and interval[1] < region[1]


def _region_text(region: tuple[float, float], number: str) -> str:
    low, high = region
    if math.isinf(low):
        return f"below {_number(high, number)}"
    if math.isinf(high):
        return f"above {_number(low, number)}"
    return f"inside [{_number(low, number)}, {_number(high, number)}]"


def _unresolved_text(claim: Claim, estimate: Estimate, margin: float, units: str, number: str):
    """Why the interval resolves nothing, and how many units would resolve it at the observed
    mean and spread (or why no number would)."""
    holds, fails = _regions(claim.test, margin)
    mean = estimate.mean
    if claim.test == "equivalent":
        boundaries = [math.copysign(margin, mean)]
    elif _inside((mean, mean), holds):
        boundaries = [b for b in holds if math.isfinite(b)]
    elif _inside((mean, mean), fails):
        boundaries = [b for b in fails if math.isfinite(b)]
    elif mean in (0.0, margin, -margin):
        return f"the estimate lies on the boundary {_number(mean, number)}"
    elif claim.test in ("greater", "less") and margin == 0:
        return (
            "the estimate lies on the other side of 0, and no margin is declared, so no "
            "number of units can refute the claim"
        )
    else:
        return (
            f"the estimate lies between 0 and the margin {_number(margin, number)}: at this "
            f"mean no number of {units} resolves it"
        )
    boundary = min(boundaries, key=lambda b: abs(mean - b))
    if mean == boundary or not estimate.se > 0:
        return f"the estimate lies on the boundary {_number(boundary, number)}"
    needed = units_to_resolve(estimate, boundary, claim.level)
    return (
        f"the interval straddles {_number(boundary, number)}; at the observed spread about "
        f"{needed} {units} would resolve it"
    )


def _estimate_text(effect: str, estimate: Estimate, level: float, units: str, number: str):
    if estimate.se == 0:
        return (
            f"{effect} = {_number(estimate.mean, '+' + number)} ({estimate.n} {units}, no spread)"
        )
    low, high = estimate.interval(level)
    return (
        f"{effect} = {_number(estimate.mean, '+' + number)} ± {_number(estimate.se, number)} "
        f"({100 * level:g}% CI [{_number(low, '+' + number)}, {_number(high, '+' + number)}], "
        f"{estimate.n} {units})"
    )


def _margin_text(claim: Claim, margin: float, number: str) -> str:
    if claim.test == "within_se":
        base = f"{claim.k:g} SE"
        return base + (f", margin {_number(margin, number)}" if margin else "")
    if claim.relative:
        return f"{claim.margin:.0%} of the reference = {_number(margin, number)}"
    return _number(margin, number) if margin else "0 (none declared)"


def _cells_text(cells: list, cell_name: str, shown: int = 6) -> str:
    if not cells:
        return "none"
    listed = ", ".join(str(c) for c in cells[:shown]) + (", ..." if len(cells) > shown else "")
    return f"{len(cells)} ({cell_name} {listed})"


def write(workdir: str, verdicts: Verdicts) -> str:
    """Writes the verdicts of ``verdicts`` to ``workdir/verdicts.json`` (process 0).

    Raises:
      ValueError: if a declared claim has no verdict (a study must say "not tested" and why).
    """
    missing = sorted(set(verdicts.claims) - set(verdicts.given))
    if missing:
        raise ValueError(f"claims without a verdict: {missing} (use Verdicts.not_tested)")
    path = os.path.join(workdir, VERDICTS_FILE)
    ordered = {name: verdicts.given[name].as_dict() for name in verdicts.claims}
    outputs.write_json(path, ordered)
    return path


def write_summary(
    workdir: str,
    template: str,
    judge: Verdicts,
    config: ml_collections.ConfigDict,
    **values: object,
) -> str:
    """Renders the summary template ``template`` with ``values``, ``$config.<path>`` from
    ``config`` and every verdict of ``judge`` as ``$verdict_<claim>`` (its
    ``Verdict.sentence``); writes it to ``workdir/summary.md``, the verdicts to
    ``verdicts.json`` (``write``) and the config to ``config.json``; returns the summary."""
    sentences = {f"verdict_{name}": v.sentence() for name, v in judge.given.items()}
    summary = outputs.render_summary(template, config, **values, **sentences)
    if not judge.powered:
        title, _, body = summary.partition("\n")
        summary = f"{title}\n\n{unpowered_note(config)}\n{body}"
    write(workdir, judge)
    outputs.write_text(os.path.join(workdir, "summary.md"), summary)
    outputs.save_config(workdir, config)
    return summary


def unpowered_note(config: ml_collections.ConfigDict) -> str:
    """The note under the title of a summary from a variant not sized to test its claims
    (``config.powered`` False): what that means for its verdicts and which variant of its
    config file is sized to resolve them (``powered_variant``)."""
    name = config.get("experiment")
    variant = powered_variant(name) if isinstance(name, str) else None
    if variant is None:
        resolve = "no variant of its config file is sized to resolve them"
    else:
        argument = f"configs/{name}.py" + (f":{variant}" if variant else "")
        resolve = f"`--config={argument}` is sized to resolve them"
    return (
        "> **Not powered.** This variant is not sized to test the claims (`config.powered` is "
        'False: a smoke test or undertrained models), so none of its verdicts is "does not '
        'hold": an effect against a claim beyond its margin reads "not resolved"; '
        f"{resolve}."
    )


def powered_variant(experiment: str) -> str | None:
    """The variant of ``configs/<experiment>.py`` sized to test its claims: ``""`` for the
    default config, else ``"paper"``; None if neither is (or the file has no such variant)."""
    try:
        module = importlib.import_module(f"configs.{experiment}")
    except ImportError:
        return None
    for variant in ("", "paper"):
        try:
            candidate = module.get_config(variant or None)
        except ValueError:  # no such variant
            continue
        if candidate.get("powered", True):
            return variant
    return None


def read(workdir: str) -> dict[str, Verdict]:
    """The verdicts ``write`` stored in ``workdir`` ({} if none)."""
    path = os.path.join(workdir, VERDICTS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        stored = json.load(handle)
    return {
        name: Verdict(v["claim"], Outcome(v["outcome"]), v["evidence"], v["margin"])
        for name, v in stored.items()
    }
