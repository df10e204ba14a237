"""Config-driven ablations from the command line: a grid of one config field's values (the
arms) x seeds, one study run per cell, and the paired comparison of two arms with its verdict.

    python -m experiments.main --config=configs/performer_vit.py:quick \\
        --sweep=model.feature_map=positive,oprf --seeds=0:5 --metric=accuracy_own

Every cell runs the study's ``measure`` on the config with the field set to the arm's value and
the study's seed field (``SEED_FIELD`` of its module, or ``--seed_field``) set to the seed (and
narrowed to that seed by the module's ``one_seed``, where its runs train several), in
``workdir/runs/<value>_seed<seed>/``; the cell's headline numbers (the study's
``headline(records)``) are its record in the core sweep, stored with the cell's settings, so the
ablation resumes after a kill and grows by seeds. The report compares the first two arms (or
``--compare=A,B``) on ``--metric``, paired by seed, by the claim the command line declares
before the run (``--test``, ``--margin``; default: B greater than A, no margin), and writes
``ablation.md`` and ``verdicts.json``. Over a model study (its config declares
``trained_check``) each arm is checked on its cells' headlines, which hold the check's metric and
trivial model: an arm that fails it leaves the comparison not tested.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from collections.abc import Sequence

import ml_collections

from configs.common import claim, locate_field, parse_field_value
from experiments.core import claims, outputs, records, stats, sweep, training_check, verdicts
from experiments.core.validate import require_distinct_seeds

REPORT_FILE = "ablation.md"


def parse_sweep(text: str, config: ml_collections.ConfigDict) -> tuple[str, list]:
    """``"field=v1,v2"`` -> the field and its values (parsed as the field's type).

    Raises:
      ValueError: for a malformed text, an unknown field or fewer than two values.
    """
    field, sep, values = text.partition("=")
    if not sep or not field or not values:
        raise ValueError(f"--sweep must be FIELD=V1,V2[,...], got {text!r}")
    parent, name = locate_field(config, field)
    parsed = [parse_field_value(field, value, parent[name]) for value in values.split(",")]
    if len(parsed) < 2:
        raise ValueError(f"--sweep {text!r}: an ablation needs two or more values")
    return field, parsed


def parse_seeds(text: str) -> list[int]:
    """``"0:5"`` (a range) or ``"0,3,7"`` -> the seeds.

    Raises:
      ValueError: for anything else, no seeds or a repeated seed (naming it).
    """
    try:
        if ":" in text:
            start, stop = (int(part) for part in text.split(":"))
            seeds = list(range(start, stop))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds must be START:STOP or S1,S2,..., got {text!r}") from None
    if not seeds:
        raise ValueError(f"--seeds {text!r} gives no seed")
    require_distinct_seeds(seeds, f"--seeds={text}")
    return seeds


def cell_config(config: ml_collections.ConfigDict, field: str, value, seed_field: str, seed: int):
    """``config`` with ``field`` = ``value`` and ``seed_field`` = ``seed``."""
    cell = copy.deepcopy(config)
    for key, item in ((field, value), (seed_field, seed)):
        parent, name = locate_field(cell, key)
        with cell.ignore_type():
            parent[name] = item
    return cell


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    sweep_text: str,
    seeds_text: str,
    metric: str,
    seed_field: str | None = None,
    compare: Sequence[str] = (),
    test: str = "greater",
    margin: float = 0.0,
) -> verdicts.Verdict | None:
    """Runs (or resumes) the ablation and writes its paired report; returns its verdict (None
    for a worker of a shared ablation that sees every record after another one reported
    them: ``sweep.reporting``).

    Raises:
      sweep.Pending: for a worker that leaves before every cell has a record.
    """
    module = importlib.import_module(f"experiments.{config.experiment}")
    if not hasattr(module, "headline"):
        raise ValueError(f"experiment {config.experiment!r} has no headline(records) to compare")
    seed_field = seed_field or str(getattr(module, "SEED_FIELD", "seed"))
    field, values = parse_sweep(sweep_text, config)
    seeds = parse_seeds(seeds_text)
    arms = {str(value): value for value in values}
    first, second = _compared(arms, compare, sweep_text)
    _check_claim(test, margin)

    def cell(arm: str, seed: int) -> ml_collections.ConfigDict:
        """The cell's config; a study whose run trains several seeds from its seed field
        narrows it to that seed (``one_seed``), so that the ablation's seeds share no run."""
        cell = cell_config(config, field, arms[arm], seed_field, seed)
        return module.one_seed(cell) if hasattr(module, "one_seed") else cell

    _check_swept_field_kept(field, arms, lambda arm: cell(arm, seeds[0]), seed_field)
    for arm in arms:  # every arm's config, before any cell runs (not at the arm's first cell)
        _validate(module, cell(arm, seeds[0]))

    def measure(arm: str, seed: int, run_dir: str) -> dict:
        run = cell(arm, seed)
        module.validate_config(run)
        measured = module.measure(run, run_dir)
        records.write(run_dir, measured)
        headline = module.headline(measured)
        if metric not in headline:  # after the first cell: the headline's keys are its own
            raise ValueError(
                f"--metric={metric!r} is not one of {config.experiment}'s headline numbers "
                f"{sorted(headline)}"
            )
        return headline

    def report(cells: list[dict]) -> verdicts.Verdict:
        value = {(c["arm"], c["seed"]): c[metric] for c in cells}
        difference = stats.paired_difference(
            [value[second, s] for s in seeds], [value[first, s] for s in seeds]
        )
        declared = ml_collections.ConfigDict(
            {
                "claims": {
                    "ablation": claim(
                        f"{field}={second} vs {first} on {metric}", test, margin=margin
                    )
                },
                # a quick variant's ablation cannot refute its claim either
                "powered": bool(config.get("powered", True)),
            }
        )
        if config.get("trained_check") is not None:  # a model study: its arms are checked too
            declared.trained_check = config.trained_check
        judge = verdicts.Verdicts(declared)
        checked_arms = None
        if judge.trained_check is not None:
            # Each cell's headline holds the check's metric and trivial model (means over the
            # study's runs in that cell).
            judge.check_training(cells, "arm")
            checked_arms = [first, second]
        verdict = judge.effect(
            "ablation",
            difference,
            effect=f"{metric}: {second} - {first}, paired by seed",
            units="seeds",
            number=".4g",
            arms=checked_arms,
        )
        rows = [{"seed": s, **{f"{metric} ({arm})": value[arm, s] for arm in arms}} for s in seeds]
        note = "" if judge.powered else verdicts.unpowered_note(config) + "\n\n"
        text = (
            f"# Ablation of {config.experiment}: {field} in {list(arms)}\n\n{note}"
            f"Seeds {seeds} ({seed_field}); one run of the study per cell in `runs/`.\n\n"
            f"{outputs.markdown_table(rows)}\n\n{verdict.sentence()}\n"
        )
        verdicts.write(workdir, judge)
        outputs.write_text(os.path.join(workdir, REPORT_FILE), text)
        print(text)
        return verdict

    cells = sweep.run(
        workdir,
        list(arms),
        seeds,
        measure,
        lambda arm: records.settings(cell(arm, 0)),
    )
    identity = json.dumps(
        [
            config.to_json_best_effort(sort_keys=True),
            sweep_text,
            seeds,
            metric,
            [first, second],
            test,
            margin,
        ]
    )
    with sweep.reporting(workdir, identity=identity) as reporter:
        if reporter:
            return report(cells)
    print("every cell is recorded; another worker wrote the report", flush=True)
    return None


def _compared(arms: dict, compare: Sequence[str], sweep_text: str) -> tuple[str, str]:
    """The two arms the report compares: ``--compare``'s, else the first two swept values;
    ``ValueError`` naming the flag for anything but two different swept values."""
    if len(arms) < 2:
        raise ValueError(
            f"--sweep={sweep_text} gives {len(arms)} distinct value(s): an ablation compares two"
        )
    if compare and (len(compare) != 2 or compare[0] == compare[1]):
        raise ValueError(f"--compare must name two different arms A,B; got {list(compare)}")
    first, second = compare or list(arms)[:2]
    for arm in (first, second):
        if arm not in arms:
            raise ValueError(f"--compare names {arm!r}, not one of the swept values {list(arms)}")
    return first, second


def _check_swept_field_kept(field: str, arms: dict, cell, seed_field: str) -> None:
    """Raises ``ValueError`` naming the flag if a cell does not run with its arm's value of
    ``field``: the seed field (``--sweep=seed=5,6`` gave every arm the same config, and the
    report a difference of exactly 0) or a field the study's ``one_seed`` sets."""
    for arm, value in arms.items():
        parent, name = locate_field(cell(arm), field)
        if parent[name] != value:
            what = (
                f"the seed field that --seeds sets ({seed_field})"
                if field == seed_field
                else "a field the study sets in every cell (one_seed: one seed per cell)"
            )
            raise ValueError(
                f"--sweep cannot vary {field}: it is {what}, so the cell of {field}={arm} runs "
                f"with {field}={parent[name]!r} and every arm would run the same config. Sweep "
                "another field (and give the seeds with --seeds)."
            )


def _validate(module, config: ml_collections.ConfigDict) -> None:
    """The checks ``experiments.main`` runs on a config that an arm changes: its trainer
    options (``config.train``, nested ones too) and the study's ``validate_config``."""
    if training_check.trainer_sections(config):
        from experiments.core.train import trainer  # here: studies without training need no Orbax

        trainer.validate_train_sections(config)
    module.validate_config(config)


def _check_claim(test: str, margin: float) -> None:
    """``--test`` and ``--margin`` checked before any cell runs (they were read only at the
    report, after every cell): a comparison of two arms, with the margin its test needs."""
    tests = tuple(name for name in claims.TESTS if name != "fact")  # "fact": no noise
    if test not in tests:
        raise ValueError(f"--test must be one of {tests} (two arms compared), got {test!r}")
    try:
        claims.Claim("ablation", test, margin=margin)
    except ValueError as error:
        raise ValueError(f"--test={test} --margin={margin}: {error}") from None
