"""Records stored by a run, the config rebuilt from a results folder, and a report rewritten
from its records without measuring."""

import json

import ml_collections
import pytest

from configs import kernel_mse as kernel_mse_config
from experiments import kernel_mse, regenerate
from experiments.core import records, status
from tests.support.studies import quick_run_fixture

quick_run = quick_run_fixture(kernel_mse_config, "quick,seed=3")


def test_a_run_stores_its_records_and_the_config_is_rebuilt_from_the_folder(quick_run):
    config, workdir, _ = quick_run
    assert records.read(str(workdir)) == json.loads(json.dumps(kernel_mse.measure(config)))
    assert records.config_argument(str(workdir)) == "configs/kernel_mse.py:quick,seed=3"
    assert records.load_config(str(workdir)).to_dict() == config.to_dict()


def test_the_stored_settings_win_over_the_config_file(quick_run, tmp_path):
    _, workdir, _ = quick_run
    for name in ("command.txt", "config.json", "records.json"):
        (tmp_path / name).write_text((workdir / name).read_text())
    stored = json.loads((tmp_path / "config.json").read_text())
    stored["num_draws"] = 777
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert records.load_config(str(tmp_path)).num_draws == 777
    stored["no_such_field"] = 1
    (tmp_path / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=r"config\.no_such_field is in the stored config"):
        records.load_config(str(tmp_path))


def test_regenerating_rewrites_the_same_report_without_measuring(quick_run, monkeypatch):
    _, workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    (workdir / "summary.md").write_text("stale\n")

    def no_measurement(*args, **kwargs):
        raise AssertionError("regenerate measured")

    monkeypatch.setattr(kernel_mse, "measure", no_measurement)
    monkeypatch.setattr(kernel_mse, "monte_carlo_mse", no_measurement)
    regenerate.regenerate(str(workdir))
    assert (workdir / "summary.md").read_text() == summary


def test_a_folder_without_records_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no records\.json"):
        records.read(str(tmp_path))


def test_a_folder_whose_last_run_did_not_finish_is_not_regenerated(quick_run, tmp_path):
    """A run killed after it began wrote its command.txt (performer_vit its config.json too)
    over the finished run's, whose records.json stays: regenerating reported the old records
    under the new run's settings ("24 steps" for 12-step runs)."""
    _, workdir, _ = quick_run
    for name in ("command.txt", "config.json", "records.json"):
        (tmp_path / name).write_text((workdir / name).read_text())
    regenerate.regenerate(str(tmp_path))  # no status: a committed folder
    (tmp_path / "summary.md").write_text("the finished run's\n")
    for state in ("failed", "interrupted", "waiting"):
        status.Status(str(tmp_path), ["python", "-m", "experiments.main"]).set(state)
        with pytest.raises(ValueError, match=rf"last run is '{state}', not done"):
            regenerate.regenerate(str(tmp_path))
    killed = json.loads((tmp_path / "status.json").read_text())
    killed.update(state="running", pid=2**22 + 1)  # no such process on this host
    (tmp_path / "status.json").write_text(json.dumps(killed))
    with pytest.raises(ValueError, match=r"last run is 'dead', not done"):
        regenerate.regenerate(str(tmp_path))
    assert (tmp_path / "summary.md").read_text() == "the finished run's\n"
    status.Status(str(tmp_path), None).set("done")
    regenerate.regenerate(str(tmp_path))
    assert (tmp_path / "summary.md").read_text() == (workdir / "summary.md").read_text()


def test_the_settings_keep_every_measured_field_and_differences_see_inside_lists():
    config = ml_collections.ConfigDict(
        {"seed": 3, "widths": (64, 128), "model": {"m": 8}, "claims": {}, "powered": True}
        | {"target_difference": 0.01, "compilation_cache_dir": "jax_cache"}
    )
    stored = records.settings(config)
    # report fields and where the compiled programs are cached left out
    assert stored == {"seed": 3, "widths": [64, 128], "model": {"m": 8}}
    assert records.settings(config, exclude=("seed",)) == {"widths": [64, 128], "model": {"m": 8}}
    # A record made at other widths or another seed is not the current one's.
    current = {**stored, "seed": 4, "widths": [64, 256]}
    assert records.differences(stored, current) == [
        "seed: 3 -> 4",
        "widths: [64, 128] -> [64, 256]",
    ]


def test_a_rebuilt_config_judges_by_the_files_claims_and_training_check(tmp_path):
    # A folder stored under an older training check (margin 0.5) and claim: the report is
    # rewritten by the check and claims the config file declares now.
    from configs import performer_vit as vit_config

    config = vit_config.get_config("quick")
    stored = json.loads(config.to_json_best_effort())
    stored["trained_check"]["margin"] = 0.5
    first = next(iter(stored["claims"]))
    stored["claims"][first]["margin"] = 0.5
    (tmp_path / "config.json").write_text(json.dumps(stored))
    (tmp_path / "command.txt").write_text(
        "python -m experiments.main --config=configs/performer_vit.py:quick\n"
    )
    rebuilt = records.load_config(str(tmp_path))
    assert rebuilt.trained_check.margin == config.trained_check.margin == 0.005
    assert rebuilt.claims[first].margin == config.claims[first].margin
