"""The core sweep: cells recorded with their settings, reused, resumed, extended by seeds and
shared by workers."""

import functools
import json
import os
import shutil
import threading
import time

import pytest

from experiments.core import sweep


def measuring(calls):
    def measure(arm, seed, run_dir):
        calls.append((arm, seed))
        return {"value": 10 * seed + len(arm)}

    return measure


def test_cells_are_measured_once_and_reused_under_the_same_settings(tmp_path):
    calls = []
    first = sweep.run(str(tmp_path), ["a", "bb"], [0, 1], measuring(calls), {"lr": 0.1})
    assert calls == [("a", 0), ("bb", 0), ("a", 1), ("bb", 1)]  # seeds outside
    assert [r["value"] for r in first] == [1, 2, 11, 12]
    assert all({"arm", "seed", "seconds"} <= set(r) for r in first)
    stored = json.loads((tmp_path / "runs" / "bb_seed1" / "result.json").read_text())
    assert stored["settings"] == {"lr": 0.1} and stored["run"]["value"] == 12
    # Extended by a seed: only the new cells are measured.
    calls.clear()
    extended = sweep.run(str(tmp_path), ["a", "bb"], [0, 1, 2], measuring(calls), {"lr": 0.1})
    assert calls == [("a", 2), ("bb", 2)] and extended[:4] == first
    # Other settings (per arm here): that arm's cells are measured again.
    calls.clear()
    sweep.run(str(tmp_path), ["a", "bb"], [0], measuring(calls), lambda arm: {"lr": len(arm)})
    assert calls == [("a", 0), ("bb", 0)]
    stored = json.loads((tmp_path / "runs" / "bb_seed0" / "result.json").read_text())
    assert stored["settings"] == {"lr": 2}  # its own arm's settings
    calls.clear()
    sweep.run(str(tmp_path), ["a", "bb"], [0], measuring(calls), lambda arm: {"lr": len(arm)})
    assert calls == []


def test_settings_holding_tuples_are_reused_as_json_stores_them(tmp_path):
    calls = []
    settings = {"widths": (64, 128), "model": {"kinds": ("a", "b")}}
    sweep.run(str(tmp_path), ["a"], [0], measuring(calls), settings)
    sweep.run(str(tmp_path), ["a"], [0], measuring(calls), settings)
    assert calls == [("a", 0)] and not (tmp_path / "superseded").exists()


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    calls = []

    def failing(arm, seed, run_dir):
        if (arm, seed) == ("b", 1):
            raise KeyboardInterrupt
        return measuring(calls)(arm, seed, run_dir)

    with pytest.raises(KeyboardInterrupt):
        sweep.run(str(tmp_path), ["a", "b"], [0, 1], failing, {})
    assert calls == [("a", 0), ("b", 0), ("a", 1)]
    calls.clear()
    done = sweep.run(str(tmp_path), ["a", "b"], [0, 1], measuring(calls), {})
    assert calls == [("b", 1)] and len(done) == 4


def test_workers_share_the_cells_and_the_last_one_sees_them_all(tmp_path):
    calls = []
    with pytest.raises(sweep.Pending) as pending:
        sweep.run(str(tmp_path), ["a", "b"], [0, 1], measuring(calls), {}, worker=(0, 2), wait_s=0)
    assert calls == [("a", 0), ("a", 1)]  # cells 0 and 2 of (a,0) (b,0) (a,1) (b,1)
    assert pending.value.missing == [("b", 0), ("b", 1)]
    done = sweep.run(
        str(tmp_path), ["a", "b"], [0, 1], measuring(calls), {}, worker=(1, 2), wait_s=0
    )
    assert calls[2:] == [("b", 0), ("b", 1)] and len(done) == 4
    with pytest.raises(ValueError, match="worker"):
        sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {}, worker=(2, 2))


def test_a_repeated_seed_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"seeds repeats seed 3 in \(3, 4, 3\)"):
        sweep.run(str(tmp_path), ["a"], [3, 4, 3], measuring([]), {})
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content", ['{"settings": {"lr": 0.1}, "run": {"val', "{}", "[1]"])
def test_an_unreadable_record_is_named_and_measured_again(tmp_path, capsys, content):
    calls = []
    sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {"lr": 0.1})
    path = tmp_path / "runs" / "a_seed0" / "result.json"
    path.write_text(content)  # cut short by a kill, or not a record
    done = sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {"lr": 0.1})
    assert calls == [("a", 0), ("a", 0)] and done[0]["value"] == 1
    assert f"{path}: unreadable record" in capsys.readouterr().out
    assert json.loads(path.read_text())["run"]["value"] == 1


def test_a_record_made_at_another_seed_is_measured_again_not_relabelled(tmp_path, capsys):
    calls = []
    sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {"lr": 0.1})
    runs = tmp_path / "runs"
    shutil.copytree(runs / "a_seed0", runs / "a_seed1")  # a run folder copied to another seed
    done = sweep.run(str(tmp_path), ["a"], [0, 1], measuring(calls), {"lr": 0.1})
    assert calls == [("a", 0), ("a", 1)]
    assert [(r["seed"], r["value"]) for r in done] == [(0, 1), (1, 11)]
    assert "recorded under another identity (seed: 0 -> 1)" in capsys.readouterr().out
    assert json.loads((runs / "a_seed1" / "result.json").read_text())["seed"] == 1


def _training(calls):
    """A measure that leaves a checkpoint-like file, as a trainer would, and sees the folder."""

    def measure(arm, seed, run_dir):
        calls.append(sorted(os.listdir(run_dir)))
        with open(os.path.join(run_dir, "checkpoint"), "a") as handle:
            handle.write("step\n")
        return {"value": seed}

    return measure


def test_a_cell_measured_again_under_other_settings_starts_from_scratch(tmp_path, capsys):
    calls = []
    sweep.run(str(tmp_path), ["a"], [0], _training(calls), {"lr": 0.05})
    identity = json.loads((tmp_path / "runs" / "a_seed0" / "cell.json").read_text())
    assert identity == {"settings": {"lr": 0.05}, "arm": "a", "seed": 0}
    sweep.run(str(tmp_path), ["a"], [0], _training(calls), {"lr": 1e-6})
    # The second measurement saw a folder holding only its identity: nothing to resume.
    assert calls == [["cell.json"], ["cell.json"]]
    moved = tmp_path / "superseded" / "a_seed0.1"
    assert (moved / "checkpoint").read_text() == "step\n"  # kept, named
    assert json.loads((moved / "result.json").read_text())["settings"] == {"lr": 0.05}
    assert "settings.lr: 0.05 -> 1e-06" in capsys.readouterr().out
    assert (tmp_path / "runs" / "a_seed0" / "checkpoint").read_text() == "step\n"


def test_an_interrupted_cell_is_resumed_under_its_own_identity_only(tmp_path):
    calls = []

    def interrupted(arm, seed, run_dir):
        _training(calls)(arm, seed, run_dir)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run(str(tmp_path), ["a"], [0], interrupted, {"lr": 0.05})
    sweep.run(str(tmp_path), ["a"], [0], _training(calls), {"lr": 0.05})
    assert calls == [["cell.json"], ["cell.json", "checkpoint"]]  # resumed from its checkpoint
    # A folder from before cells recorded their identity is not resumed: moved aside.
    os.remove(tmp_path / "runs" / "a_seed0" / "cell.json")
    os.remove(tmp_path / "runs" / "a_seed0" / "result.json")
    sweep.run(str(tmp_path), ["a"], [0], _training(calls), {"lr": 0.05})
    assert calls[-1] == ["cell.json"] and (tmp_path / "superseded" / "a_seed0.1").is_dir()


def test_a_worker_waits_for_the_other_workers_cells_after_its_own(tmp_path):
    def slow(arm, seed, run_dir):
        time.sleep(0.5)
        return {"value": seed}

    other = threading.Thread(
        target=sweep.run,
        args=(str(tmp_path), ["a", "b"], [0, 1], slow, {}),
        kwargs={"worker": (1, 2), "wait_s": 60},
    )
    other.start()
    try:
        done = sweep.run(
            str(tmp_path), ["a", "b"], [0, 1], measuring([]), {}, worker=(0, 2), wait_s=60
        )
    finally:
        other.join()
    assert [(r["arm"], r["seed"]) for r in done] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_a_cell_another_process_is_measuring_is_waited_for_not_measured_again(tmp_path):
    """Two processes on one workdir (a worker started twice) trained one cell into one folder
    at once: Orbax's commits of the same step failed in both. The second now waits for the
    record of the first (the lock is per open file, so two threads stand for two processes)."""
    started, calls = threading.Event(), []

    def slow(arm, seed, run_dir):
        started.set()
        time.sleep(1.0)
        return {"value": 42}

    first = threading.Thread(target=sweep.run, args=(str(tmp_path), ["a"], [0], slow, {}))
    first.start()
    try:
        assert started.wait(60)
        done = sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {}, wait_s=60)
    finally:
        first.join()
    assert calls == [] and done[0]["value"] == 42
    held = sweep._cell_lock(str(tmp_path), "b", 0)
    with held, pytest.raises(sweep.Pending):  # a holder that does not finish: the wait ends
        sweep.run(str(tmp_path), ["b"], [0], measuring(calls), {}, wait_s=0)
    assert calls == []
    sweep.run(str(tmp_path), ["b"], [0], measuring(calls), {}, wait_s=0)  # released
    assert calls == [("b", 0)]
    # runs/ holds the cells' folders only (readers list it: a lock file there was read as one)
    assert sorted(os.listdir(tmp_path / "runs")) == ["a_seed0", "b_seed0"]


def test_a_record_written_while_the_lock_was_awaited_is_not_measured_again(tmp_path, monkeypatch):
    """Another process finished the cell between this one's read and its lock: the record is
    read again under the lock, not measured (and overwritten) a second time."""
    sweep.write(str(tmp_path / "runs" / "a_seed0"), {}, {"value": 42}, arm="a", seed=0)
    monkeypatch.setattr(sweep, "read", lambda *args, **kwargs: None)  # read before the record
    calls = []
    done = sweep.run(str(tmp_path), ["a"], [0], measuring(calls), {})
    assert calls == [] and done[0]["value"] == 42


def test_each_superseded_folder_is_kept_under_its_own_number(tmp_path):
    for lr in (0.1, 0.2, 0.3):
        sweep.run(str(tmp_path), ["a"], [0], measuring([]), {"lr": lr})
    kept = sorted(p.name for p in (tmp_path / "superseded").iterdir())
    assert kept == ["a_seed0.1", "a_seed0.2"]
    settings = [
        json.loads((tmp_path / "superseded" / name / "result.json").read_text())["settings"]
        for name in kept
    ]
    assert settings == [{"lr": 0.1}, {"lr": 0.2}]


def test_a_sweep_nested_in_a_cell_is_measured_whole_by_its_worker(tmp_path, monkeypatch):
    """An ablation's cell runs a study, whose own sweep is not shared among the workers."""
    monkeypatch.setattr(sweep, "WORKER", (1, 2))  # experiments.main --worker=1/2
    nested_calls = []

    def study(arm, seed, run_dir):
        inner = sweep.run(run_dir, ["x", "y"], [0, 1], measuring(nested_calls), {}, wait_s=0)
        return {"value": len(inner)}

    with pytest.raises(sweep.Pending) as pending:
        sweep.run(str(tmp_path), ["a", "b"], [0], study, {}, wait_s=0)
    assert pending.value.missing == [("a", 0)] and len(nested_calls) == 4
    assert sweep.WORKER == (1, 2)


def test_exactly_one_worker_reports_each_complete_set_of_records(tmp_path):
    sweep.run(str(tmp_path), ["a"], [0], measuring([]), {})
    reporting = functools.partial(sweep.reporting, str(tmp_path), identity="claim A")
    with reporting(worker=(0, 1)) as alone:
        assert alone  # a single process always reports
    elected = []
    for index in range(3):
        with reporting(worker=(index, 3)) as reporter:
            elected.append(reporter)
    assert elected == [True, False, False]
    # The same records under another identity (a new claim, other settings): a new report
    # (the marker named the records alone, so a study without sweep records never reported
    # again).
    with sweep.reporting(str(tmp_path), identity="claim B", worker=(1, 3)) as reporter:
        assert reporter
    with sweep.reporting(str(tmp_path), identity="claim B", worker=(2, 3)) as reporter:
        assert not reporter
    sweep.run(str(tmp_path), ["a"], [0, 1], measuring([]), {})  # new records: a new report
    with reporting(worker=(2, 3)) as reporter:
        assert reporter
    # A reporter that fails names nothing: the next worker reports.
    sweep.run(str(tmp_path), ["a"], [0, 1, 2], measuring([]), {})
    with pytest.raises(RuntimeError), reporting(worker=(0, 3)) as reporter:
        assert reporter
        raise RuntimeError("report failed")
    with reporting(worker=(1, 3)) as reporter:
        assert reporter


def test_a_worker_does_not_take_another_workers_cell_recorded_under_other_settings(tmp_path):
    # Worker 0's cell (a, 0) holds a record of an earlier sweep at lr 0.05: worker 1, at lr
    # 0.1, waits for it to be measured again instead of reporting the old record.
    sweep.write(str(tmp_path / "runs" / "a_seed0"), {"lr": 0.05}, {"value": 1}, arm="a", seed=0)
    calls = []
    with pytest.raises(sweep.Pending) as pending:
        sweep.run(
            str(tmp_path), ["a", "b"], [0], measuring(calls), {"lr": 0.1}, worker=(1, 2), wait_s=0
        )
    assert calls == [("b", 0)] and pending.value.missing == [("a", 0)]
