"""One verdict rule for every study.

A config declares its claims before the run (``config.claims``, built with
``configs.common.claim``; ``experiments.core.claims``): what is claimed, the test (an
ordering, equivalence, non-inferiority, agreement within k SE) and the margin beyond which an
effect against the claim refutes it. A study measures an effect (an
``experiments.core.stats.Estimate``) and ``Verdicts`` turns claim and effect into a ``Verdict``
with exactly one of four outcomes:

- **holds**: the interval at the claim's confidence lies where the claim says;
- **does not hold**: the interval lies against the claim beyond the declared margin. Never with
  a zero margin and never from a variant that is not sized to test the claims
  (``config.powered`` False: quick and smoke variants, undertrained models), whose summaries
  open with a note saying so and naming the variant that is (``unpowered_note``);
- **not resolved**: the interval straddles a boundary; the sentence says how many units (seeds,
  draws) would resolve it at the observed spread, or why no number would;
- **not tested**: the design could not test the claim (e.g. one seed: no interval); the
  sentence says why. In particular a
  claim whose test uses an arm (a kind of model trained on several seeds) that failed the
  config's declared training check (``config.trained_check``, against the task's trivial
  model; ``experiments.core.training_check``) is not tested: a model that did not train
  neither supports nor refutes a claim.

Model studies cannot skip the training check: a config that trains models (a trainer section,
``training_check.TRAINER_SECTIONS``) is refused without one; ``Verdicts.check_training`` applies
it to every arm's runs, every judging method of such a config must name the arms its test uses
(``arms=``) and refuses an arm without a check result; the summary states every arm's outcome
(``$training_check``). A claim over several competitors is an intersection (``Verdicts.every``
over one cell per pair, ``Verdicts.cell_rows`` for the per-pair table). Where an interval lies
inside the margin on both sides, the evidence reports the equivalence bound it puts on the
effect.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ml_collections

from experiments.core import claims, outputs, training_check
from experiments.core.claims import Claim
from experiments.core.stats import Estimate, pool, units_to_resolve
from experiments.core.training_check import ArmCheck

VERDICTS_FILE = "verdicts.json"


class Outcome(enum.StrEnum):
    HOLDS = "holds"
    DOES_NOT_HOLD = "does not hold"
    NOT_RESOLVED = "not resolved"
    NOT_TESTED = "not tested"


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


def _number(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "nan"


class Verdicts:
    """The verdicts of one report, judged by the claims ``config`` declares.

    Every method takes the name of a declared claim and returns its ``Verdict``; ``write``
    stores them all (and raises if a declared claim got none).

    Args:
      config: the run's config, with ``claims``, ``powered`` (default True; False for a
        variant not sized to test the claims: its verdicts are never "does not hold") and
        optionally ``trained_check`` (``training_check.TrainedCheck``).
    """

    def __init__(self, config: ml_collections.ConfigDict):
        self.claims = claims.declared(config)
        self.powered = bool(config.get("powered", True))
        self.trained_check = training_check.declared(config)
        self.arm_checks: dict[str, ArmCheck] = {}
        self._remedy: Callable[[list[str]], str] | None = None
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

    def check_training(
        self,
        runs: Sequence[Mapping[str, Any]],
        arm: str,
        *,
        label: Callable[[Any], str] = str,
        remedy: Callable[[list[str]], str] | None = None,
    ) -> dict[str, ArmCheck]:
        """Applies the declared training check to every arm of ``runs`` (one record per run:
        its arm under the key ``arm``, the check's metric and trivial model under their names)
        and keeps the results for the judging methods, whose ``arms`` name arms by
        ``label(arm value)``. An arm whose runs lack a field of the check is "not measured".

        Args:
          runs: one record per run.
          arm: the key of a run's arm.
          label: the arm's name in summaries and in the judging methods' ``arms``.
          remedy: ``failing arms -> what would test a claim that uses them`` (appended to its
            "not tested" sentence).

        Returns:
          ``{arm: ArmCheck}`` in the order the arms first appear in ``runs``.

        Raises:
          ValueError: if the config declares no ``trained_check``.
        """
        check = self.trained_check
        if check is None:
            raise ValueError("check_training needs a declared config.trained_check")
        grouped: dict[str, list[Mapping[str, Any]]] = {}
        for run in runs:
            grouped.setdefault(label(run[arm]), []).append(run)
        fields = [check.metric, *([check.trivial] if check.trivial else [])]
        for name, group in grouped.items():
            missing = next((f for f in fields if any(run.get(f) is None for run in group)), "")
            if missing == check.metric or (missing and check.limit is None):
                self.arm_checks[name] = ArmCheck(name, missing=missing)
                continue
            if missing and check.limit is not None:  # the limit alone can still fail the arm
                values = tuple(float(run[check.metric]) for run in group)
                self.arm_checks[name] = ArmCheck(
                    name, values, (float(check.limit),) * len(values), missing=missing
                )
                continue
            values = tuple(float(run[check.metric]) for run in group)
            trivial = tuple(float(run[check.trivial]) for run in group) if check.trivial else ()
            thresholds = tuple(
                check.threshold(trivial[i] if trivial else None) for i in range(len(values))
            )
            self.arm_checks[name] = ArmCheck(name, values, thresholds, trivial)
        if remedy is not None:
            self._remedy = remedy
        return {name: self.arm_checks[name] for name in grouped}

    def _arms_with(self, *outcomes: str) -> list[str]:
        check = self.trained_check
        if check is None:
            return []
        return [a for a, c in self.arm_checks.items() if c.outcome(check) in outcomes]

    def passed_arms(self) -> list[str]:
        """The checked arms that passed the declared training check."""
        return self._arms_with("passed")

    def failed_arms(self) -> list[str]:
        """The checked arms that failed the declared training check (measured and failed, or
        not resolved: not shown to have trained)."""
        return self._arms_with("failed", "not resolved")

    def training_text(self) -> str:
        """The declared training check and every checked arm's outcome, for the summary (the
        failures stated as findings with their numbers)."""
        check = self.trained_check
        if check is None:
            return "none declared (this study trains no models)"
        checks = list(self.arm_checks.values())
        text = f"an arm counts as trained if {check.describe()}: {check.reason}."
        groups = {
            outcome: [c for c in checks if c.outcome(check) == outcome]
            for outcome in ("passed", "failed", "not resolved", "not measured")
        }
        if groups["passed"]:
            text += f" Passed by {', '.join(c.arm for c in groups['passed'])}."
        for outcome, head in (("failed", "Failed by"), ("not resolved", "Not resolved for")):
            if groups[outcome]:
                text += (
                    f" **{head} {', '.join(c.arm for c in groups[outcome])}** (a finding: "
                    "every claim whose test uses one of them is not tested): "
                    + "; ".join(c.finding(check) for c in groups[outcome])
                    + "."
                )
        if groups["not measured"]:
            text += (
                " Not measured (every claim whose test uses one of them is not tested): "
                + "; ".join(c.finding(check) for c in groups["not measured"])
                + "."
            )
        if not checks:
            text += " No arm was checked."
        return text

    def _untrained(self, name: str, arms: Sequence[str] | None) -> Verdict | None:
        """The "not tested" verdict of claim ``name`` if an arm its test uses failed the
        declared training check or could not be checked; None if every arm passed or the
        config trains no models.

        Raises:
          ValueError: if the config declares a training check and ``arms`` is empty (a claim of
            a model study names the arms its test uses), if an arm has no check result
            (``check_training`` first), or if ``arms`` is given without a declared check.
        """
        check = self.trained_check
        if check is None:
            if arms:
                raise ValueError(
                    f"claim {name!r} names arms {tuple(arms)}, but the config declares no "
                    "trained_check"
                )
            return None
        if not arms:
            raise ValueError(
                f"claim {name!r}: the config trains models (config.trained_check), so its test "
                "must name the arms it uses (arms=...), each checked by check_training"
            )
        unchecked = [a for a in arms if a not in self.arm_checks]
        if unchecked:
            raise ValueError(
                f"claim {name!r} uses arms {unchecked} without a training-check result: pass "
                f"their runs to Verdicts.check_training first (checked: {list(self.arm_checks)})"
            )
        checks = [self.arm_checks[a] for a in dict.fromkeys(arms)]
        failed = [c for c in checks if c.outcome(check) == "failed"]
        unresolved = [c for c in checks if c.outcome(check) == "not resolved"]
        unmeasured = [c for c in checks if c.outcome(check) == "not measured"]
        if not failed and not unresolved and not unmeasured:
            return None
        parts = []
        if failed:
            parts.append(
                f"{', '.join(c.arm for c in failed)} failed the declared training check "
                f"({check.describe()}), and a model that did not train neither supports nor "
                "refutes the claim: " + "; ".join(c.finding(check) for c in failed)
            )
        if unresolved:
            parts.append(
                f"{'The' if parts else 'the'} declared training check ({check.describe()}) "
                f"is not resolved for {', '.join(c.arm for c in unresolved)}, so the claim "
                "cannot rest on them: " + "; ".join(c.finding(check) for c in unresolved)
            )
        if unmeasured:
            parts.append(
                f"{'The' if parts else 'the'} declared training check was not measured for "
                f"{', '.join(c.arm for c in unmeasured)}, so the claim cannot rest on them: "
                + "; ".join(c.finding(check) for c in unmeasured)
            )
        text = ". ".join(parts)
        if (failed or unresolved) and self._remedy is not None:
            text += f". What would test it: {self._remedy([c.arm for c in failed + unresolved])}"
        return self.not_tested(name, text)

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
        arms: Sequence[str] | None = None,
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
          arms: the arms (kinds of trained model) the test uses, named as in
            ``check_training``: required where the config declares a training check; a claim
            using an arm that failed it is not tested.
        """
        claim = self._claim(name)
        if (untrained := self._untrained(name, arms)) is not None:
            return untrained
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
        arms: Sequence[str] | None = None,
    ) -> Verdict:
        """The verdict on agreement in every cell (a ``within_se`` claim: a closed form checked
        by Monte Carlo) from the cell farthest from it in SEs (``arms``: as in ``effect``)."""
        if (untrained := self._untrained(name, arms)) is not None:
            return untrained
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
            arms=arms,
        )

    def closed_form_agreement(
        self,
        name: str,
        rows: Iterable[Mapping[str, Any]],
        *,
        measured: str,
        closed_form: str,
        se: str,
        draws: int,
        cell: Callable[[Mapping[str, Any]], str],
        where: Callable[[Mapping[str, Any]], bool] | None = None,
        effect: str = "Monte Carlo - closed form",
        cell_name: str = "cells",
    ) -> Verdict:
        """The verdict on a closed form checked by Monte Carlo in every cell (``worst_cell``):
        each row (those ``where`` keeps) is the cell ``cell(row)`` with the effect
        ``row[measured] - row[closed_form]`` and the SE ``row[se]`` over ``draws`` draws.

        Examples:
          >>> import ml_collections
          >>> config = ml_collections.ConfigDict({"claims": {"exact": {
          ...     "statement": "E = m", "test": "within_se", "k": 4.0, "margin": 0.0}}})
          >>> rows = [{"v": 1, "mc": 1.02, "theory": 1.0, "se": 0.01},
          ...         {"v": 2, "mc": 1.99, "theory": 2.0, "se": 0.01}]
          >>> verdict = Verdicts(config).closed_form_agreement(
          ...     "exact", rows, measured="mc", closed_form="theory", se="se", draws=1000,
          ...     cell=lambda row: f"v = {row['v']}")
          >>> verdict.outcome.value, "the worst of 2 cells (v = 1)" in verdict.evidence
          ('holds', True)
        """
        cells = {
            cell(r): Estimate(r[measured] - r[closed_form], r[se], draws)
            for r in rows
            if where is None or where(r)
        }
        return self.worst_cell(name, cells, effect=effect, units="draws", cell_name=cell_name)

    def below_bound(
        self,
        name: str,
        rows: Sequence[Mapping[str, Any]],
        *,
        measured: str,
        bound: str,
        se: str,
        draws: int,
        cell: Callable[[Mapping[str, Any]], str],
        effect: str,
        cell_name: str,
    ) -> Verdict:
        """The verdict on a bound that holds in every cell (each row one cell ``cell(row)``):
        the effect ``row[measured] - row[bound]`` (SE ``row[se]`` over ``draws`` draws) at the
        cell where the measured value is closest to the bound (largest in SEs), with the
        smallest bound / measured ratio where the bound is below 1 as a note."""
        worst = max(rows, key=lambda r: (r[measured] - r[bound]) / max(r[se], 1e-300))
        useful = [r for r in rows if r[bound] < 1]
        slack = min((r[bound] / max(r[measured], 1e-300) for r in useful), default=math.nan)
        return self.effect(
            name,
            Estimate(worst[measured] - worst[bound], worst[se], draws),
            effect=f"{effect} at the closest of {len(rows)} {cell_name} ({cell(worst)})",
            units="draws",
            note=f"Smallest bound / empirical ratio where the bound is < 1: {slack:.3g}",
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
        arms: Sequence[str] | None = None,
    ) -> Verdict:
        """The verdict on an ordering over cells: one pooled test of the mean effect over the
        cells (``stats.pool``, weighted as the claim declares; ``shared_units`` where every
        cell is measured on the same draws or seeds), with, for description, the cells where
        the effect alone is beyond ``k`` SE either way. Cells without a finite estimate or SE
        are left out (and counted). ``arms``: as in ``effect``."""
        if not cells:
            return self.not_tested(name, f"no {cell_name} measured")
        if (untrained := self._untrained(name, arms)) is not None:
            return untrained
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
            arms=arms,
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
        arms: Sequence[str] | None = None,
    ) -> Verdict:
        """The verdict on a claim about every cell (an intersection-union test, for
        equivalence, where pooling signed effects would let deviations of both signs cancel):
        it holds if it holds in every cell at the claim's confidence (no correction needed);
        it does not hold if in some cell the interval at the Bonferroni-corrected confidence
        lies against it beyond the margin; otherwise it is not resolved, and the sentence names
        the unresolved cells and the units the worst of them needs. A claim over several
        competitors is such an intersection: one cell per (claimed-better, competitor) pair, so
        that no pair going the other way hides in a pooled mean (``cell_rows`` gives the
        per-pair table). ``arms``: as in ``effect`` (every arm of every cell)."""
        claim = self._claim(name)
        if not cells:
            return self.not_tested(name, f"no {cell_name} measured")
        if (untrained := self._untrained(name, arms)) is not None:
            return untrained
        margin = self.margin_of(name)
        blind = [c for c, e in cells.items() if _side(claim, e, margin) == "none"]
        if blind:
            units_text = ", ".join(f"{c}: {cells[c].n}" for c in blind)
            return self.not_tested(
                name,
                f"no interval at {_cells_text(blind, cell_name)} ({units} {units_text}: an "
                "interval needs at least 2 with a spread), so the design cannot test a claim "
                f"about every {cell_name}",
            )
        strict = dataclasses.replace(claim, confidence=1 - (1 - claim.level) / len(cells))
        failing = [c for c, e in cells.items() if _side(strict, e, margin) == "against"]
        open_cells = [c for c, e in cells.items() if _side(claim, e, margin) != "holds"]
        # The quoted cell decides the outcome: the farthest of those against the claim, else of
        # the unresolved ones, else the one nearest to not holding (the farthest in either
        # direction quoted a cell for the claim beside "does not hold", and the strongest cell
        # where the claim holds everywhere).
        if failing or open_cells:
            deciding = failing or open_cells
            where = f"the {cell_name} farthest against it" if failing else ""
            where = where or f"the farthest unresolved {cell_name}"
            worst = max(deciding, key=lambda c: abs(cells[c].mean) / max(cells[c].se, 1e-300))
        else:
            where = f"the {cell_name} nearest to not holding"
            worst = min(cells, key=lambda c: _slack(claim, cells[c], margin))
        head = _estimate_text(
            f"{effect} at {where} ({worst})", cells[worst], claim.level, units, number
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
                    f"{cell}: {_every_cell_text(claim, strict, cells[cell], margin, units, number)}"
                    for cell in open_cells
                )
            )
        verdict = Verdict(
            claim.statement, outcome, f"{head}; {reason}", _margin_text(claim, margin, number)
        )
        return self._record(name, verdict)

    def fact(
        self, name: str, true: bool, evidence: str, *, arms: Sequence[str] | None = None
    ) -> Verdict:
        """The verdict on a deterministic statement (claim test ``"fact"``): computed exactly,
        with no noise to resolve, so it holds or does not hold (in a variant not sized to test
        the claims, a false statement is "not resolved": it was computed at that variant's
        sizes). ``arms``: as in ``effect``."""
        claim = self._claim(name)
        if (untrained := self._untrained(name, arms)) is not None:
            return untrained
        if claim.test != "fact":
            raise ValueError(f"claim {name!r} is a {claim.test!r} claim, not a 'fact'")
        if true:
            outcome = Outcome.HOLDS
        elif self.powered:
            outcome = Outcome.DOES_NOT_HOLD
        else:
            outcome, evidence = Outcome.NOT_RESOLVED, f"{evidence}; false here, but {UNPOWERED}"
        return self._record(name, Verdict(claim.statement, outcome, evidence, "exact"))

    def exact(
        self,
        name: str,
        value: float,
        *,
        effect: str,
        number: str = ".3g",
        arms: Sequence[str] | None = None,
    ) -> Verdict:
        """``fact``: a closed-form ``value`` that the claim says is > 0."""
        return self.fact(
            name, value > 0, f"{effect} = {_number(value, '+' + number)} (exact)", arms=arms
        )

    def cell_rows(
        self,
        name: str,
        cells: Mapping[Any, Estimate],
        *,
        cell_name: str,
        units: str,
        number: str = ".4g",
    ) -> list[dict[str, Any]]:
        """The per-cell table of claim ``name`` (e.g. one row per (hybrid, competitor) pair of
        an ``every`` claim): each cell's estimate, its interval at the claim's confidence and
        where that interval lies (the claim's side; against it beyond the margin, at the
        Bonferroni-corrected confidence over the cells that refuting needs; or straddling)."""
        claim = self._claim(name)
        margin = self.margin_of(name)
        strict = dataclasses.replace(claim, confidence=1 - (1 - claim.level) / max(len(cells), 1))
        places = {
            "holds": "the claimed side",
            "against": "against, beyond the margin",
            "open": "straddles a boundary",
            "none": "no interval",
        }
        rows = []
        for cell, estimate in cells.items():
            low, high = estimate.interval(claim.level)
            place = places[_side(claim, estimate, margin)]
            if _side(claim, estimate, margin) == "against" and len(cells) > 1:
                place = (
                    "against, beyond the margin"
                    if _side(strict, estimate, margin) == "against"
                    else f"against at {100 * claim.level:g}%, not at the "
                    f"{100 * strict.level:.4g}% (Bonferroni) that refuting needs"
                )
            rows.append(
                {
                    cell_name: str(cell),
                    units: estimate.n,
                    "mean ± 1 SE": f"{_number(estimate.mean, '+' + number)} ± "
                    f"{_number(estimate.se, number)}",
                    f"{100 * claim.level:g}% CI": f"[{_number(low, '+' + number)}, "
                    f"{_number(high, '+' + number)}]",
                    "interval lies": place,
                }
            )
        return rows

    def _interval_rule(self, claim, estimate, margin, units, number):
        side = _side(claim, estimate, margin)
        lies = "it lies" if estimate.se == 0 else "the interval lies"
        bound = _equivalence_bound(claim, estimate, margin, number)
        if side == "none":
            return Outcome.NOT_TESTED, (
                f"no interval ({estimate.n} {units}: an interval needs at least 2 with a "
                "spread), so the design cannot test the claim"
            )
        if side == "holds":
            region = _region_text(_regions(claim.test, margin)[0], number)
            return Outcome.HOLDS, f"{lies} {region}{bound}"
        if side == "against" and margin == 0:  # a relative margin of a reference of 0
            return Outcome.NOT_TESTED, (
                f"{lies} against the claim, but its margin is 0 here (a relative margin of a "
                "reference of 0), and a zero margin cannot refute a claim"
            )
        if side == "against" and self.powered:
            return Outcome.DOES_NOT_HOLD, (
                f"{lies} against the claim beyond the margin {_number(margin, number)}"
            )
        if side == "against":
            return Outcome.NOT_RESOLVED, (
                f"{lies} against the claim beyond the margin, but {UNPOWERED}"
            )
        text = _unresolved_text(claim, estimate, margin, units, number)
        if not self.powered and _mean_against(claim, estimate.mean, margin):
            # More units would resolve it against the claim, which this variant cannot refute.
            text += f" against the claim, but {UNPOWERED}"
        return Outcome.NOT_RESOLVED, text + bound

    def _within_se(self, claim, estimate, margin, number):
        if not (math.isfinite(estimate.mean) and math.isfinite(estimate.se)):
            return Outcome.NOT_TESTED, (
                f"the estimate is not finite (mean {estimate.mean}, SE {estimate.se}), so the "
                "design cannot test the claim"
            )
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


def _slack(claim: Claim, estimate: Estimate, margin: float) -> float:
    """How far the claim's interval lies inside the region where it holds, in SEs."""
    low, high = estimate.interval(claim.level)
    region = _regions(claim.test, margin)[0]
    return min(low - region[0], region[1] - high) / max(estimate.se, 1e-300)


def _inside(interval: tuple[float, float], region: tuple[float, float] | None) -> bool:
    return region is not None and region[0] < interval[0] and interval[1] < region[1]


def _mean_against(claim: Claim, mean: float, margin: float) -> bool:
    """Whether the estimate lies against the claim beyond the margin (so that more units would
    resolve it that way)."""
    if claim.test == "equivalent":
        return abs(mean) > margin
    return _inside((mean, mean), _regions(claim.test, margin)[1])


def _equivalence_bound(claim: Claim, estimate: Estimate, margin: float, number: str) -> str:
    """Where the interval lies inside (-margin, margin): the bound it puts on the effect's size
    ("; ..." to append), whatever the claim's direction; "" otherwise."""
    if not margin > 0 or claim.test in ("within_se", "fact"):
        return ""
    low, high = estimate.interval(claim.level)
    if not (math.isfinite(low) and math.isfinite(high) and -margin < low and high < margin):
        return ""
    bound = max(abs(low), abs(high))
    return (
        f"; equivalence bound: the interval puts the effect within ±{_number(bound, number)}, "
        f"inside the margin ±{_number(margin, number)}"
    )


def _region_text(region: tuple[float, float], number: str) -> str:
    low, high = region
    if math.isinf(low):
        return f"below {_number(high, number)}"
    if math.isinf(high):
        return f"above {_number(low, number)}"
    return f"inside [{_number(low, number)}, {_number(high, number)}]"


def _every_cell_text(claim, strict, estimate, margin, units, number) -> str:
    """Why one cell of an ``every`` claim is unresolved: its interval straddles a boundary at
    the claim's level, or lies against the claim beyond the margin at the claim's level but not
    at the Bonferroni-corrected ``strict`` level that refuting needs."""
    if _side(claim, estimate, margin) != "against":
        return _unresolved_text(claim, estimate, margin, units, number)
    return (
        f"against the claim beyond the margin at {100 * claim.level:g}% but not at the "
        f"{100 * strict.level:.4g}% that refuting it in one of several cells needs; "
        + _unresolved_text(strict, estimate, margin, units, number)
    )


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
    else:  # "greater" or "less" between 0 and the margin against the claim
        edge = -margin if claim.test == "greater" else margin
        return (
            f"the estimate lies between 0 and the margin against the claim, "
            f"{_number(edge, '+' + number)}: at this mean no number of {units} resolves it"
        )
    boundary = min(boundaries, key=lambda b: abs(mean - b))
    if mean == boundary or not estimate.se > 0:
        return f"the estimate lies on the boundary {_number(boundary, number)}"
    # At least one more unit: the t interval is wider than the normal one the count uses.
    needed = max(estimate.n + 1, units_to_resolve(estimate, boundary, claim.level))
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
    ``verdicts.json`` (``write``) and the config to ``config.json``; returns the summary.

    Where the config declares a training check, the template must place
    ``$training_check`` (``Verdicts.training_text``: the check and every arm's outcome, the
    failures as findings with their numbers): a model study's summary cannot leave it out.
    """
    sentences = {f"verdict_{name}": v.sentence() for name, v in judge.given.items()}
    if judge.trained_check is not None:
        values = {**values, "training_check": judge.training_text()}
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
