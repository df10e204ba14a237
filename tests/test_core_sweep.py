"""The core sweep: cells recorded with their settings, reused, resumed, extended by seeds and
shared by workers."""

import json

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
        sweep.run(str(tmp_path), ["a", "b"], [0, 1], measuring(calls), {}, worker=(0, 2))
    assert calls == [("a", 0), ("a", 1)]  # cells 0 and 2 of (a,0) (b,0) (a,1) (b,1)
    assert pending.value.missing == [("b", 0), ("b", 1)]
    done = sweep.run(str(tmp_path), ["a", "b"], [0, 1], measuring(calls), {}, worker=(1, 2))
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
