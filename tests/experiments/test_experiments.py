"""Smoke tests of the experiments at their quick sizes, through the public entry point."""

import importlib
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import kernel_mse as kernel_mse_config
from configs import performer_vit as performer_vit_config
from experiments import kernel_mse
from experiments.core import sweep
from experiments.core.outputs import read_csv
from experiments.core.validate import check_types
from experiments.main import run_experiment, validate_config
from rfjax import theory
from tests.support import ROOT


@pytest.mark.integration
def test_kernel_mse_quick_run_writes_results_that_agree_with_theory(tmp_path):
    workdir = tmp_path / "kernel_mse"
    command = [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=configs/kernel_mse.py:quick",
        f"--workdir={workdir}",
    ]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"summary: {workdir}/summary.md" in completed.stdout.splitlines()[-1]
    for name in ("results.csv", "mse_ratio.png", "summary.md", "config.json", "records.json"):
        assert (workdir / name).stat().st_size > 0, name
    rows = read_csv(workdir / "results.csv")
    config = kernel_mse_config.get_config("quick")
    assert len(rows) == len(config.norms_of_sum) * len(config.couplings)
    for row in rows:
        if row["coupling"] != "simplex_plus":  # no closed form for SimRF+
            assert abs(float(row["z_score"])) <= 4.0, row
    smallest_v = {
        row["coupling"]: float(row["mse_mc"])
        for row in rows
        if float(row["v"]) == min(config.norms_of_sum)
    }
    assert smallest_v["simplex"] < smallest_v["orthogonal"] < smallest_v["gaussian"]
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    assert f"{config.claims.exact.statement}**: **holds**: Monte Carlo - closed form" in summary
    # The quick variant is not sized to test the claims: nothing it finds refutes one.
    stored = json.loads((workdir / "verdicts.json").read_text())
    assert set(stored) == set(config.claims)
    assert all(v["outcome"] != "does not hold" for v in stored.values())


def test_kernel_mse_small_v_limit_is_the_sec_5_1_prefactor():
    config = kernel_mse_config.get_config()
    assert kernel_mse.small_v_limit(config) == pytest.approx(0.007782, abs=5e-6)  # d = m = 64
    assert kernel_mse.small_v_limit(kernel_mse_config.get_config("quick")) is None  # m > d


def test_config_variants():
    full, quick = kernel_mse_config.get_config(), kernel_mse_config.get_config("quick")
    assert full.dim == 64
    assert quick.num_draws < full.num_draws
    with pytest.raises(ValueError, match="config variant"):
        kernel_mse_config.get_config("huge")


def test_config_argument_takes_a_variant_and_key_value_overrides():
    config = kernel_mse_config.get_config("quick,num_draws=50,couplings=(gaussian,simplex)")
    assert config.num_draws == 50 and config.couplings == ("gaussian", "simplex")
    assert config.dim == kernel_mse_config.get_config("quick").dim  # the variant still applies
    vit = performer_vit_config.get_config("quick,train.num_train_steps=8,attentions=simplex")
    assert vit.train.num_train_steps == 8 and vit.attentions == ("simplex",)
    assert kernel_mse_config.get_config("seed=3,norms_of_sum=(0.5,1)").norms_of_sum == (0.5, 1.0)


# "--config=configs/NAME.py[:ARG]" as the README, the docs and the configs', experiments' and
# benchmarks' docstrings quote it; an ARG with a placeholder in capitals (",train.batch_size=N")
# is left out.
_QUOTED_CONFIG = re.compile(r"--config=configs/(\w+)\.py(?::([^\s`'\"\\]*))?")


def _quoted_config_arguments() -> dict[tuple[str, str], list[str]]:
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for folder in ("configs", "experiments", "benchmarks"):
        paths += [p for p in (ROOT / folder).rglob("*.py") if not p.name.startswith("test_")]
    quoted: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        for match in _QUOTED_CONFIG.finditer(path.read_text(encoding="utf-8")):
            name, arg = match.group(1), match.group(2) or ""
            if (ROOT / "configs" / f"{name}.py").exists() and not re.search(r"=[A-Z]+(,|$)", arg):
                quoted.setdefault((name, arg), []).append(str(path.relative_to(ROOT)))
    return quoted


def test_every_config_argument_the_docs_quote_parses():
    # configs.common's docstring gave kernel_mse.py:...,train.seed=3, a field kernel_mse lacks.
    quoted = _quoted_config_arguments()
    assert ("kernel_mse", "quick,num_draws=500,couplings=(gaussian,simplex)") in quoted, quoted
    failures = []
    for (name, arg), paths in sorted(quoted.items()):
        module = importlib.import_module(f"configs.{name}")
        try:
            check_types(module.get_config(arg), module.get_config())
        except (ValueError, TypeError) as error:
            failures.append(f"{name}.py:{arg} in {sorted(set(paths))}: {error}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("quick,num_draw=5", r"no field 'num_draw'.*did you mean \['num_draws'\]"),
        ("quick,num_draws=1.5", "num_draws='1.5': expected int like 1000"),
        ("quick,couplings=gaussian,simplex", r"couplings=\(gaussian,simplex\)"),
        ("huge", r"variant must be one of \('quick',\)"),
        ("quick,couplings=(gaussian", "unbalanced"),
    ],
)
def test_a_bad_config_argument_names_the_problem_and_the_syntax(arg, message):
    with pytest.raises(ValueError, match=message):
        kernel_mse_config.get_config(arg)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("quick,num_draws=abc", "config override num_draws='abc': expected int like 1000"),
        ("quick,num_draw=5", "config has no field 'num_draw'"),
    ],
)
def test_the_command_line_stops_on_a_bad_override_with_the_message_that_names_the_field(
    arg, message
):
    """``experiments.main`` prints the config's own error, not the one it replaced (int()'s
    "invalid literal for int() with base 10: 'abc'", which names no field)."""
    from absl import flags
    from ml_collections import config_flags

    from experiments import main

    parsed = flags.FlagValues()  # not absl's global flags
    config_flags.DEFINE_config_file("config", None, "", flag_values=parsed)
    argv = ["main", f"--config=configs/kernel_mse.py:{arg}"]
    with pytest.raises(flags.IllegalFlagValueError) as raised:
        parsed(argv)
    assert main._config_error(raised.value, argv).startswith(message)


@pytest.mark.integration
def test_a_comma_separated_override_stops_before_running_with_the_accepted_syntax(tmp_path):
    """``--config.couplings=gaussian,simplex`` is one string to ml_collections: the run stops
    with the syntax to use, without a traceback and without touching the workdir."""
    workdir = tmp_path / "kernel_mse"
    command = [sys.executable, "-m", "experiments.main", "--config=configs/kernel_mse.py:quick"]
    command += ["--config.couplings=gaussian,simplex", f"--workdir={workdir}"]
    completed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode != 0
    assert "holds a comma inside one string" in completed.stderr
    assert "--config.couplings=\"('a', 'b')\"" in completed.stderr
    assert "Traceback" not in completed.stderr and not workdir.exists()


def test_validation_checks_types_and_names_of_every_experiment():
    config = kernel_mse_config.get_config("quick")
    config.couplings = ("gaussian", "simplx")
    with pytest.raises(ValueError, match=r"config.couplings: 'simplx' is not one of"):
        validate_config(config)
    config = kernel_mse_config.get_config("quick")
    config.norms_of_sum = ("0.5", "1.0")
    with pytest.raises(TypeError, match=r"config\.norms_of_sum must be a tuple of float"):
        validate_config(config)
    config = performer_vit_config.get_config("quick")
    config.train.optimizer = "adamax"
    with pytest.raises(ValueError, match=r"config.train.optimizer: 'adamax' is not one of"):
        validate_config(config)
    config.train.optimizer, config.train.log_every_steps = "adam", 0
    with pytest.raises(ValueError, match=r"config\.train\.log_every_steps must be finite and > 0"):
        validate_config(config)
    # Feature-map names come from the registry (rfjax.features.available()).
    config = performer_vit_config.get_config("quick")
    config.model.feature_map = "softmax"
    with pytest.raises(ValueError, match=r"config.model.feature_map: 'softmax' is not one of"):
        validate_config(config)


def test_validation_checks_the_trainer_options_of_a_nested_config():
    """performer_vit_maps trains performer_vit's models (config.vit.train): a NaN learning rate
    or a batch of 0 there passed validation and stopped the run at its first cell."""
    from configs import performer_vit_maps as maps_config

    for field, value, message in [
        ("learning_rate", float("nan"), r"config\.vit\.train\.learning_rate must be finite"),
        ("batch_size", 0, r"config\.vit\.train\.batch_size must be finite and > 0, got 0"),
        ("optimizer", "adamax", r"config\.vit\.train\.optimizer: 'adamax' is not one of"),
    ]:
        config = maps_config.get_config("quick")
        config.vit.train[field] = value
        with pytest.raises(ValueError, match=message):
            validate_config(config)


def test_validation_runs_the_checks_a_run_would_hit():
    """kernel_mse at dim = 1 passed validation and failed mid-run in the simplex sampler."""
    config = kernel_mse_config.get_config("quick")
    config.dim = 1
    with pytest.raises(ValueError, match=r"config\.couplings: coupling 'simplex' cannot draw .*"):
        validate_config(config)
    config = kernel_mse_config.get_config("quick")
    config.dim, config.num_features = 10**9, 4
    with pytest.raises(ValueError, match=r"the cap is 2 GiB"):
        validate_config(config)


def test_validation_refuses_a_repeated_seed_in_every_config_with_seeds():
    checked = []
    for path in sorted(pathlib.Path(ROOT, "configs").glob("*.py")):
        if path.stem in ("__init__", "common", "training"):
            continue
        config = importlib.import_module(f"configs.{path.stem}").get_config("quick")
        if "seeds" not in config:
            continue
        with config.ignore_type():
            config.seeds = (0, 1, 0)
        with pytest.raises(ValueError, match=r"config\.seeds repeats seed 0 in \(0, 1, 0\)"):
            validate_config(config)
        checked.append(path.stem)
    assert {"conformer_ctc", "iap_es", "lstm_lm", "performer_lm"} <= set(checked)


def test_validation_refuses_a_negative_seed():
    """NumPy's generators (the training batches' order) take no negative seed: seed -1 passed
    validation and stopped the run at its first batch ("expected non-negative integer")."""
    from configs import conformer_ctc as conformer_ctc_config
    from configs import lstm_lm as lstm_lm_config

    config = conformer_ctc_config.get_config("quick")
    config.seeds = (0, -1)
    with pytest.raises(ValueError, match=r"config\.seeds holds seed -1 .*ints >= 0"):
        validate_config(config)
    config = lstm_lm_config.get_config("quick")
    config.baseline_seeds = (-1,)
    with pytest.raises(ValueError, match=r"config\.baseline_seeds holds seed -1 .*ints >= 0"):
        validate_config(config)
    config = performer_vit_config.get_config("quick")
    config.train.seed = -1
    with pytest.raises(ValueError, match=r"config\.train\.seed must be an int >= 0, got -1"):
        validate_config(config)


def test_every_experiment_module_validates_with_validate_config():
    for path in sorted(pathlib.Path(ROOT, "configs").glob("*.py")):
        if path.stem in ("__init__", "common", "training"):
            continue
        module = importlib.import_module(f"experiments.{path.stem}")
        assert callable(module.validate_config), path.stem
        validate_config(importlib.import_module(f"configs.{path.stem}").get_config("quick"))


def test_a_failed_run_is_marked_and_the_previous_summary_no_longer_looks_current(
    tmp_path, monkeypatch
):
    workdir = tmp_path / "kernel_mse"
    workdir.mkdir()
    (workdir / "summary.md").write_text("results of an earlier run\n")

    def broken(config, workdir):
        raise RuntimeError("disk full")

    monkeypatch.setattr(kernel_mse, "measure", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        run_experiment(kernel_mse_config.get_config("quick"), str(workdir), command=["cmd"])
    status = json.loads((workdir / "status.json").read_text())
    assert status["state"] == "failed" and "RuntimeError: disk full" in status["error"]
    assert status["pid"] == os.getpid() and {"host", "heartbeat"} <= set(status)
    assert "disk full" in (workdir / "FAILED").read_text()
    assert "Traceback" in (workdir / "FAILED").read_text()  # where it failed
    assert not (workdir / "summary.md").exists()
    assert (workdir / "summary.previous.md").read_text() == "results of an earlier run\n"

    def working(records, config, workdir):
        pathlib.Path(workdir, "summary.md").write_text("new results\n")
        return {}

    monkeypatch.setattr(kernel_mse, "measure", lambda config, workdir: [])
    monkeypatch.setattr(kernel_mse, "report", working)
    run_experiment(kernel_mse_config.get_config("quick"), str(workdir), command=["cmd"])
    assert json.loads((workdir / "status.json").read_text())["state"] == "done"
    written = ["command.txt", "records.json", "status.json", "summary.md"]
    assert sorted(p.name for p in workdir.iterdir()) == written


@pytest.mark.integration
def test_the_installed_distribution_holds_only_the_library(tmp_path):
    """configs/ and experiments/ are not installed (generic names); outside the checkout they
    are not importable, while rfjax is."""
    probe = "import importlib.util as u; print([u.find_spec(n) is not None for n in "
    probe += "('rfjax', 'configs', 'experiments', 'benchmarks')])"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert completed.stdout.strip() == "[True, False, False, False]", completed.stderr


def _write_status_repeatedly(workdir: str) -> None:
    from experiments.core import status

    writer = status.Status(workdir, ["worker"])
    for _ in range(500):
        writer.set("waiting", missing=[])


@pytest.mark.integration
def test_workers_sharing_a_workdir_write_its_status_at_once(tmp_path):
    """``--worker=I/N`` starts independent processes on one workdir: their status writes race."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_write_status_repeatedly, args=(str(tmp_path),)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "waiting"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["status.json"]


def _preempted(*args, **kwargs):
    from experiments.core.train.trainer import TrainingInterrupted

    raise TrainingInterrupted(signal.SIGTERM, 12, "workdir")


@pytest.mark.parametrize("ablating", [False, True])
def test_a_preempted_run_is_marked_interrupted_not_failed(tmp_path, monkeypatch, ablating):
    """The trainer's exit on SIGINT/SIGTERM (``TrainingInterrupted``: a ``SystemExit`` after
    its checkpoint) reads as interrupted, to be resumed, not as a failure or a live run."""
    from experiments import main

    workdir = tmp_path / "kernel_mse"
    config = kernel_mse_config.get_config("quick")
    monkeypatch.setattr(main.ablation, "run", _preempted)
    monkeypatch.setattr(kernel_mse, "measure", _preempted)
    with pytest.raises(SystemExit):
        if ablating:
            main.run_ablation(config, str(workdir), ["cmd"])
        else:
            run_experiment(config, str(workdir), command=["cmd"])
    status = json.loads((workdir / "status.json").read_text())
    assert status["state"] == "interrupted"
    assert "training interrupted by SIGTERM at step 12" in status["error"]
    note = (workdir / "FAILED").read_text()
    assert note.startswith("This run interrupted: TrainingInterrupted: training interrupted")
    assert "Traceback" not in note


def test_a_worker_that_leaves_a_shared_sweep_early_is_marked_waiting_not_done(
    tmp_path, monkeypatch
):
    def others_missing(config, workdir):
        raise sweep.Pending([("positive", 3)])

    monkeypatch.setattr(kernel_mse, "measure", others_missing)
    workdir = tmp_path / "kernel_mse"
    assert run_experiment(kernel_mse_config.get_config("quick"), str(workdir)) == {}
    status = json.loads((workdir / "status.json").read_text())
    assert status["state"] == "waiting" and status["missing"] == [["positive", 3]]
    assert not (workdir / "records.json").exists()


@pytest.mark.parametrize("text", ["2/2", "3/2", "0/0", "-1/2", "1", "a/b"])
def test_a_worker_index_outside_its_count_is_refused(text):
    from absl import app

    from experiments.main import parse_worker

    with pytest.raises(app.UsageError, match="--worker must be I/N with 0 <= I < N"):
        parse_worker(text)
    assert parse_worker("1/2") == (1, 2)


def test_kernel_mse_rows_are_in_units_of_the_iid_closed_form_and_couplings_draw_apart():
    config = kernel_mse_config.get_config(
        "quick,dim=4,num_features=4,num_draws=200,draws_per_chunk=200,norms_of_sum=(0.5,1.0),"
        "couplings=(gaussian,orthogonal,simplex)"
    )
    rows = kernel_mse.measure(config)
    by = {(r["coupling"], r["v"]): r for r in rows}
    assert set(by) == {(c, v) for c in config.couplings for v in (0.5, 1.0)}
    input_key, draw_key = jax.random.split(jax.random.key(config.seed))
    x, y = kernel_mse.make_inputs(input_key, config.dim, np.array([0.5, 1.0]))
    for index, coupling in enumerate(config.couplings):
        # Each coupling has a key of its own: independent_difference treats couplings as
        # independent samples (sharing one key would reuse the Gaussian draws under each).
        mse, se = kernel_mse.monte_carlo_mse(
            jax.random.fold_in(draw_key, index), coupling, 4, x, y, 200, 200
        )
        for i, v in enumerate((0.5, 1.0)):
            row, iid = by[coupling, v], by["gaussian", v]["mse_theory"]
            assert (row["mse_mc"], row["mse_se"]) == pytest.approx((mse[i], se[i]), rel=1e-12)
            assert row["mse_theory"] == pytest.approx(
                float(
                    theory.prf_mse(
                        np.asarray(x[i], np.float64),
                        np.asarray(x[i], np.float64),
                        4,
                        coupling=coupling,
                    )
                ),
                rel=1e-6,
            )
            assert row["ratio_mc"] == pytest.approx(row["mse_mc"] / iid, rel=1e-12)
            assert row["ratio_se"] == pytest.approx(row["mse_se"] / iid, rel=1e-12)
            assert row["ratio_theory"] == pytest.approx(row["mse_theory"] / iid, rel=1e-12)
            z = (row["mse_mc"] - row["mse_theory"]) / row["mse_se"]
            assert row["z_score"] == pytest.approx(z, rel=1e-12)
    # The ablation's metrics: each coupling's ratio averaged over its own v.
    assert kernel_mse.headline(rows) == {
        f"ratio_{c}": pytest.approx((by[c, 0.5]["ratio_mc"] + by[c, 1.0]["ratio_mc"]) / 2)
        for c in config.couplings
    }


def _kernel_mse_rows(cells):
    """Rows with the IID closed form 1 at every v: {(coupling, v): (ratio_mc, ratio_theory)},
    each with SE 0.01."""
    return [
        {
            "v": v,
            "coupling": c,
            "mse_mc": mc,
            "mse_se": 0.01,
            "mse_theory": th,
            "ratio_mc": mc,
            "ratio_se": 0.01,
            "ratio_theory": th,
            "z_score": (mc - th) / 0.01,
        }
        for (c, v), (mc, th) in cells.items()
    ]


def test_kernel_mse_judges_each_claim_on_its_own_cells():
    config = kernel_mse_config.get_config(
        "dim=8,num_features=8,num_draws=1000,norms_of_sum=(0.5,1)"
    )
    cells = {
        ("gaussian", 0.5): (1.0, 1.0),
        ("gaussian", 1.0): (1.0, 1.0),
        ("orthogonal", 0.5): (0.8, 0.8),
        ("orthogonal", 1.0): (0.8, 0.8),
        ("simplex", 0.5): (0.2, 0.2),
        ("simplex", 1.0): (0.5, 0.3),  # 20 SE off at the largest v
        ("simplex_plus", 0.5): (0.15, math.nan),
        ("simplex_plus", 1.0): (0.45, math.nan),
    }
    given = kernel_mse.judge(_kernel_mse_rows(cells), config).given
    outcome = {name: str(verdict.outcome) for name, verdict in given.items()}
    assert outcome == {
        "exact": "not resolved",  # no margin is declared: a disagreement cannot refute
        "order_theory": "holds",
        "simrf_below_orf": "holds",
        "orf_below_iid": "holds",
        "small_v": "holds",
        "simrf_plus": "holds",
    }
    assert "smallest closed-form gap over v and both steps = +0.2" in given["order_theory"].evidence
    assert "at v = 0.5" in given["small_v"].evidence and "1000 draws" in given["small_v"].evidence
    # The orderings turned around, and SimRF 5 SE (not 4) off its closed form at the smallest v.
    swapped = {
        **cells,
        ("orthogonal", 1.0): (0.8, 1.05),  # above IID by the closed form at one v
        ("simplex", 0.5): (0.25, 0.2),
        ("simplex_plus", 0.5): (0.3, math.nan),
        ("simplex_plus", 1.0): (0.6, math.nan),
    }
    given = kernel_mse.judge(_kernel_mse_rows(swapped), config).given
    assert str(given["order_theory"].outcome) == "does not hold"
    assert "= -0.05 (exact)" in given["order_theory"].evidence
    assert str(given["small_v"].outcome) == "not resolved"
    assert "5.00 SE off" in given["small_v"].evidence
    assert str(given["simrf_plus"].outcome) == "does not hold"
