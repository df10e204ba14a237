"""Config-driven ablations from the command line: arms x seeds, one study run per cell, records
per cell, resumption, and the paired report with its verdict."""

import json
import os
import signal
import subprocess
import sys

import pytest

from configs import kernel_mse as kernel_mse_config
from experiments.core import ablation, status, verdicts
from tests.support import ROOT, SUPPORT

COMMAND = [
    sys.executable,
    "-m",
    "experiments.main",
    "--config=configs/kernel_mse.py:quick,num_draws=200,draws_per_chunk=200",
    "--sweep=num_features=8,16",
    "--seeds=0:3",
    "--metric=ratio_simplex",
    "--test=less",
]


def run(workdir, *options):
    completed = subprocess.run(
        [*COMMAND, f"--workdir={workdir}", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.integration
def test_an_ablation_records_every_cell_reports_the_pair_and_resumes(tmp_path):
    workdir = tmp_path / "ablation"
    printed = run(workdir)
    cells = sorted(p.name for p in (workdir / "runs").iterdir())
    assert cells == [f"{m}_seed{s}" for m in (16, 8) for s in range(3)]
    stored = verdicts.read(str(workdir))["ablation"]
    assert stored.claim == "num_features=16 vs 8 on ratio_simplex"
    report = (workdir / "ablation.md").read_text()
    assert status.read(str(workdir))["state"] == "done"  # ablations keep a status too
    assert stored.sentence() in report and "ratio_simplex" in printed
    # An ablation of a quick variant is not powered either (its verdict cannot refute): it
    # says so, and which config is sized to resolve the claim.
    assert "**Not powered.**" in report and "`--config=configs/kernel_mse.py` is sized" in report
    record = json.loads((workdir / "runs" / "8_seed1" / "result.json").read_text())
    assert record["settings"]["num_features"] == 8 and "ratio_simplex" in record["run"]
    # The report's effect is the mean of the paired per-seed differences of the cells' records.
    value = {
        (m, s): json.loads((workdir / "runs" / f"{m}_seed{s}" / "result.json").read_text())["run"]
        for m in (8, 16)
        for s in range(3)
    }
    differences = [value[16, s]["ratio_simplex"] - value[8, s]["ratio_simplex"] for s in range(3)]
    assert f"= {sum(differences) / 3:+.4g} ±" in stored.evidence
    assert all(value[m, s]["seed"] == s for m, s in value)
    # Started again: every cell is reused; a cell whose run was killed before its record is
    # measured again, alone.
    times = {p: p.stat().st_mtime_ns for p in (workdir / "runs").glob("*/result.json")}
    killed = workdir / "runs" / "16_seed2" / "result.json"
    os.remove(killed)
    run(workdir)
    for path, mtime in times.items():
        if path != killed:
            assert path.stat().st_mtime_ns == mtime, path
    assert killed.exists()


@pytest.mark.integration
def test_two_workers_share_an_ablation_and_the_last_one_reports(tmp_path):
    first = run(tmp_path, "--worker=0/2", "--worker_wait=0")
    assert "cells wait for other workers" in first and not (tmp_path / "ablation.md").exists()
    left = status.read(str(tmp_path))
    assert left["state"] == "waiting" and left["missing"] == [["16", s] for s in range(3)]
    measured = sorted(p.parent.name for p in (tmp_path / "runs").glob("*/result.json"))
    # cells 0, 2, 4 of (8, 0) (16, 0) (8, 1) (16, 1) (8, 2) (16, 2): seeds outside
    assert measured == ["8_seed0", "8_seed1", "8_seed2"]
    run(tmp_path, "--worker=1/2")
    assert len(list((tmp_path / "runs").glob("*/result.json"))) == 6
    assert "ablation" in verdicts.read(str(tmp_path))


def test_bad_ablation_arguments_name_the_problem():
    config = kernel_mse_config.get_config("quick")
    with pytest.raises(ValueError, match="FIELD=V1,V2"):
        ablation.parse_sweep("num_features", config)
    with pytest.raises(ValueError, match="two or more values"):
        ablation.parse_sweep("num_features=8", config)
    with pytest.raises(ValueError, match="no field 'num_feature'"):
        ablation.parse_sweep("num_feature=8,16", config)
    assert ablation.parse_sweep("couplings=gaussian,simplex", config)[1] == [
        ("gaussian",),
        ("simplex",),
    ]
    assert ablation.parse_seeds("2:5") == [2, 3, 4] and ablation.parse_seeds("1,7") == [1, 7]
    with pytest.raises(ValueError, match="START:STOP"):
        ablation.parse_seeds("a:b")
    # A repeated seed would count one measurement twice ("holds" from one seed).
    with pytest.raises(ValueError, match=r"--seeds=0,0 repeats seed 0"):
        ablation.parse_seeds("0,0")


TOY_STUDY = [sys.executable, str(SUPPORT / "toy_study.py")]


def start_workers(workdir, count: int, *options: str, env=None, killed=()) -> list:
    """``count`` workers of the toy study's ablation in ``workdir``, started at once; those in
    ``killed`` SIGKILL themselves while writing their first cell record."""
    return [
        subprocess.Popen(
            [
                *TOY_STUDY,
                str(workdir),
                f"--worker={index}/{count}",
                *options,
                *(["--kill_at_record"] if index in killed else []),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]


def finish(workers) -> tuple[list[int], list[str]]:
    """The workers' return codes and outputs (stdout and stderr)."""
    outputs = [worker.communicate(timeout=600) for worker in workers]
    return [worker.returncode for worker in workers], [out + err for out, err in outputs]


REPORT_HEADING = "# Ablation of toy_study"


@pytest.mark.integration
@pytest.mark.parametrize("count", [2, 3, 4])
def test_workers_started_together_always_end_with_exactly_one_report(tmp_path, count):
    codes, printed = finish(start_workers(tmp_path, count, "--worker_wait=300"))
    assert codes == [0] * count, printed
    assert sum(REPORT_HEADING in text for text in printed) == 1, printed
    assert REPORT_HEADING in (tmp_path / "ablation.md").read_text()
    assert "ablation" in verdicts.read(str(tmp_path))
    assert status.read(str(tmp_path))["state"] == "done"
    assert len(list((tmp_path / "runs").glob("*/result.json"))) == 4


def _cell_records(workdir) -> dict:
    """Every cell's record and study records, less the wall time of the measurement."""
    found = {}
    for cell in sorted((workdir / "runs").iterdir()):
        stored = json.loads((cell / "result.json").read_text())
        stored["run"].pop("seconds")
        found[cell.name] = (stored, json.loads((cell / "records.json").read_text()))
    return found


@pytest.mark.integration
def test_chaos_a_worker_killed_mid_write_then_a_changed_setting_ends_as_a_clean_run(tmp_path):
    """Four workers of a training ablation start together; one is SIGKILLed while it writes
    its record; the others give up waiting for it. Run again with another optimizer: every
    cell is trained again from step 0 (its old run moved aside), exactly one worker reports,
    and the records and report equal those of one clean sequential run."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    shared = tmp_path / "shared"
    training = ("--steps=10",)
    codes, printed = finish(
        start_workers(shared, 4, *training, "--worker_wait=5", env=env, killed=(3,))
    )
    assert codes == [0, 0, 0, -signal.SIGKILL], printed
    assert not (shared / "ablation.md").exists()
    assert not (shared / "runs" / "0.03_seed1" / "result.json").exists()  # killed mid-write
    assert status.read(str(shared))["state"] in ("waiting", "dead")

    changed = (*training, "--optimizer=adam")
    codes, printed = finish(start_workers(shared, 4, *changed, "--worker_wait=300", env=env))
    assert codes == [0] * 4, printed
    assert sum(REPORT_HEADING in text for text in printed) == 1, printed
    assert not any("resuming from step" in text for text in printed), printed
    assert sorted(p.name for p in (shared / "superseded").iterdir()) == [
        f"{arm}_seed{seed}.1" for arm in ("0.01", "0.03") for seed in (0, 1)
    ]
    assert status.read(str(shared))["state"] == "done"

    clean = tmp_path / "clean"
    codes, printed = finish(start_workers(clean, 1, *changed, env=env))
    assert codes == [0], printed
    assert _cell_records(shared) == _cell_records(clean)
    assert (shared / "ablation.md").read_text() == (clean / "ablation.md").read_text()


def test_an_ablation_of_a_model_study_checks_both_arms(tmp_path, monkeypatch):
    """Over a model study (performer_vit declares a training check), an arm whose models do not
    beat the same model with uniform attention leaves the comparison not tested."""
    from configs import performer_vit as vit_config
    from experiments import performer_vit
    from experiments.core.verdicts import Outcome

    def measure(config, workdir):
        del workdir
        own = 0.85 + 0.001 * config.train.seed
        uniform = own - (0.0 if config.model.num_features == 16 else 0.05)
        return {"accuracy_own": own, "accuracy_uniform_attention": uniform}

    monkeypatch.setattr(performer_vit, "measure", measure)
    monkeypatch.setattr(performer_vit, "validate_config", lambda config: None)
    monkeypatch.setattr(performer_vit, "headline", lambda records: records)
    verdict = ablation.run(
        vit_config.get_config("quick"),
        str(tmp_path),
        sweep_text="model.num_features=8,16",
        seeds_text="0:3",
        metric="accuracy_own",
    )
    assert verdict.outcome == Outcome.NOT_TESTED
    assert verdict.evidence.startswith("16 failed the declared training check")


def test_the_comparison_is_checked_before_any_cell_runs(tmp_path):
    """--compare, --test and --margin raise naming the flag before a cell runs (an unpacking
    error, or a KeyError / claim error after every cell had been measured); --metric after
    the first cell, whose headline names the numbers there are."""
    config = kernel_mse_config.get_config("quick,num_draws=200,draws_per_chunk=200")
    run = dict(config=config, workdir=str(tmp_path / "a"), seeds_text="0:2", metric="ratio_simplex")
    bad = [
        (dict(sweep_text="num_features=12,12"), "gives 1 distinct value"),
        (dict(sweep_text="num_features=8,16", compare=["8"]), "--compare must name two"),
        (dict(sweep_text="num_features=8,16", compare=["8", "8"]), "--compare must name two"),
        (dict(sweep_text="num_features=8,16", test="fact"), "--test must be one of"),
        (dict(sweep_text="num_features=8,16", test="noninferior"), "needs a margin > 0"),
        (dict(sweep_text="num_features=8,16", margin=-1.0), "margin must be a number >= 0"),
        # The seed field: every arm's cell ran seed s, the report a difference of exactly 0.
        (dict(sweep_text="seed=5,6"), r"cannot vary seed: it is the seed field .*\(seed\)"),
        # An arm's value that the study refuses: the first arm's cell ran before it raised.
        (dict(sweep_text="num_features=8,-4"), r"config\.num_features must be finite and > 0"),
    ]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            ablation.run(**run, **options)
    assert not os.path.exists(tmp_path / "a" / "runs")  # nothing measured
    with pytest.raises(ValueError, match=r"--metric='bogus' is not one of .*ratio_simplex"):
        ablation.run(**{**run, "metric": "bogus"}, sweep_text="num_features=8,16")


def test_a_study_whose_runs_train_several_seeds_narrows_an_ablation_cell_to_one():
    """performer_vit's runs train seeds train.seed, train.seed + 1, ...: an ablation's seeds s
    and s + 1 shared a run, and the paired test counted it twice."""
    from configs import performer_vit as performer_vit_config
    from experiments import performer_vit

    config = performer_vit_config.get_config("quick")
    cell = performer_vit.one_seed(config)
    assert set(cell.num_seeds.values()) == {1} and cell.num_reference_seeds == 1
    assert config.num_seeds != cell.num_seeds  # the given config is left alone
    performer_vit.validate_config(cell)
    refused = [
        # A field that one_seed sets cannot be swept: every arm would train one seed alike.
        ("num_reference_seeds=2,3", r"cannot vary num_reference_seeds: .*one_seed"),
        # An arm's trainer options are checked before any cell runs too.
        ("train.learning_rate=0.001,-1", r"config\.train\.learning_rate must be finite and > 0"),
    ]
    for sweep_text, message in refused:
        with pytest.raises(ValueError, match=message):
            ablation.run(
                config,
                "/nonexistent/ablation",
                sweep_text=sweep_text,
                seeds_text="0:2",
                metric="accuracy_own",
            )


def test_an_ablation_reports_the_second_arm_minus_the_first_paired_by_seed(tmp_path, monkeypatch):
    """The effect is B - A over the seeds' pairs: the seeds differ by 0.05 each, the arms by
    0.002, 0.003 and 0.0025, so the paired mean is +0.0025 with SE 0.0005 / sqrt(3)."""
    from configs import performer_vit as vit_config
    from experiments import performer_vit
    from experiments.core.verdicts import Outcome

    def measure(config, workdir):
        del workdir
        seed = config.train.seed
        gain = (0.002, 0.003, 0.0025)[seed] if config.model.num_features == 16 else 0.0
        # An arm that fails the training check is no better than uniform attention.
        fails = config.model.num_features == failing[0]
        own = 0.8 + 0.05 * seed + gain
        return {"accuracy_own": own, "accuracy_uniform_attention": own - (0 if fails else 0.1)}

    monkeypatch.setattr(performer_vit, "measure", measure)
    monkeypatch.setattr(performer_vit, "validate_config", lambda config: None)
    monkeypatch.setattr(performer_vit, "headline", lambda records: records)
    options = dict(sweep_text="model.num_features=8,16", seeds_text="0:3", metric="accuracy_own")
    failing = [None]
    # "16 below 8", refuted beyond a margin of 0.001 (95% CI [+0.00126, +0.00374]) but by a
    # quick variant, which cannot refute.
    verdict = ablation.run(
        vit_config.get_config("quick"),
        str(tmp_path / "paired"),
        test="less",
        margin=0.001,
        **options,
    )
    assert "accuracy_own: 16 - 8, paired by seed = +0.0025 ± 0.0002887" in verdict.evidence
    assert verdict.outcome == Outcome.NOT_RESOLVED and "not sized" in verdict.evidence
    # The first arm's training check counts as much as the second's.
    failing[0] = 8
    verdict = ablation.run(vit_config.get_config("quick"), str(tmp_path / "failing"), **options)
    assert verdict.outcome == Outcome.NOT_TESTED
    assert verdict.evidence.startswith("8 failed the declared training check")


def test_workers_report_an_ablation_again_for_another_metric(tmp_path, monkeypatch):
    """The report's identity holds the metric: over the same records, a comparison on another
    headline number is a new report, not one "another worker wrote"."""
    from configs import performer_vit as vit_config
    from experiments import performer_vit
    from experiments.core import sweep

    def measure(config, workdir):
        del workdir
        own = 0.8 + 0.05 * config.train.seed + 0.001 * config.model.num_features
        return {"accuracy_own": own, "accuracy_uniform_attention": own - 0.1}

    monkeypatch.setattr(performer_vit, "measure", measure)
    monkeypatch.setattr(performer_vit, "validate_config", lambda config: None)
    monkeypatch.setattr(performer_vit, "headline", lambda records: records)
    config = vit_config.get_config("quick")
    options = dict(sweep_text="model.num_features=8,16", seeds_text="0:3")
    ablation.run(config, str(tmp_path), metric="accuracy_own", **options)  # every cell
    monkeypatch.setattr(sweep, "WORKER", (0, 2))  # now one of two workers that see them all
    assert ablation.run(config, str(tmp_path), metric="accuracy_own", **options) is not None
    assert ablation.run(config, str(tmp_path), metric="accuracy_own", **options) is None
    other = ablation.run(config, str(tmp_path), metric="accuracy_uniform_attention", **options)
    assert other is not None and "accuracy_uniform_attention" in other.evidence
