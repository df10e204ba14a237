"""Records stored by a run, the config rebuilt from a results folder, and a report rewritten
from its records without measuring."""

import json

import pytest

from configs import kernel_mse as kernel_mse_config
from experiments import kernel_mse, regenerate
from experiments.core import records
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
