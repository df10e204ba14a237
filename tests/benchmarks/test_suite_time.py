"""``benchmarks.suite_time``: the pieces that do not run a suite (the summary line it reads, the
tests it keeps, the order of the runs, the pooled verdict)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.suite_time import (
    ROOT,
    TESTS_ENV,
    main,
    name_and_params,
    parse_summary,
    pooled_rounds,
    pooled_verdict,
    rotated,
    split_by_names,
)


def test_the_summary_line_gives_counts_and_seconds():
    output = (
        "....\nSKIPPED [1] x.py:3: slow\ncompiled in 2.00s\n"
        "2488 passed, 737 skipped, 25 warnings in 373.59s (0:06:13)\n"
    )
    assert parse_summary(output) == {
        "passed": 2488,
        "failed": 0,
        "skipped": 737,
        "errors": 0,
        "pytest_s": 373.59,
    }
    assert parse_summary("1 failed, 3 passed, 1 error in 2.50s\n") == {
        "passed": 3,
        "failed": 1,
        "skipped": 0,
        "errors": 1,
        "pytest_s": 2.5,
    }
    with pytest.raises(ValueError, match="no pytest summary line"):
        parse_summary("interrupted\n")


def test_tests_match_by_name_and_parameters_whatever_their_file():
    assert name_and_params("tests/rfjax/ops/test_fwht.py::test_float64[xla]") == "test_float64[xla]"
    assert name_and_params("tests/a/test_b.py::TestC::test_d[x]") == "TestC::test_d[x]"
    peer = {name_and_params("tests/test_fwht.py::test_float64[xla]"), "test_gone"}
    kept, dropped = split_by_names(
        [
            "tests/rfjax/ops/test_fwht.py::test_float64[xla]",  # moved since: still the test
            "tests/rfjax/ops/test_fwht.py::test_float64[cpu]",  # other parameters: new
            "tests/rfjax/ops/test_fwht.py::test_new",
        ],
        peer,
    )
    assert kept == ["tests/rfjax/ops/test_fwht.py::test_float64[xla]"]
    assert dropped == [
        "tests/rfjax/ops/test_fwht.py::test_float64[cpu]",
        "tests/rfjax/ops/test_fwht.py::test_new",
    ]


def test_each_repeat_starts_one_contender_later():
    names = ("peer", "this", "this_peer_tests")
    assert [rotated(names, r)[0] for r in range(4)] == ["peer", "this", "this_peer_tests", "peer"]
    assert sorted(rotated(names, 2)) == sorted(names)


def test_as_a_plugin_it_runs_only_the_named_tests(tmp_path):
    # This file under the plugin, naming one of its tests as if it lived in another file.
    if os.environ.get(TESTS_ENV):  # run by itself under a plugin that kept it: no recursion
        pytest.skip("inside the plugin's own run")
    names = tmp_path / "peer_tests.txt"
    names.write_text("tests/test_elsewhere.py::test_each_repeat_starts_one_contender_later\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_time", __file__],
        cwd=ROOT,
        env={**os.environ, TESTS_ENV: str(names)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    summary = parse_summary(done.stdout)
    assert (summary["passed"], summary["skipped"]) == (1, 0)
    assert " deselected in " in done.stdout  # the others deselected, not skipped


def _result(peer_s, this_s, *, against="f" * 40, this_passed=2499, failed=0, returncode=None):
    """A ``measure`` result with one round per pair of wall seconds."""

    def run(wall, passed):
        return {
            "wall_s": wall,
            "passed": passed,
            "skipped": 7,
            "failed": failed,
            "errors": 0,
            "returncode": int(bool(failed)) if returncode is None else returncode,
            "failures": ["t::x"] if failed else [],
        }

    return {
        "against_commit": against,
        "this_commit": "a" * 40,
        "repeats": len(peer_s),
        "runs": {
            "peer": [run(wall, 2211) for wall in peer_s],
            "this": [run(wall, this_passed) for wall in this_s],
        },
    }


@pytest.mark.parametrize(
    "this_s, outcome",
    [
        ((405.0, 412.0, 401.0, 409.0), "holds"),  # 0.90-0.92x: below the 2% margin
        ((495.0, 501.0, 492.0, 498.0), "does not hold"),  # 1.10-1.12x: beyond it
        ((392.0, 466.0, 401.0, 470.0), "not resolved"),  # 0.87-1.04x: straddles it
    ],
)
def test_pooled_rounds_are_judged_against_the_declared_margin(this_s, outcome):
    peer_s = (450.0, 452.0, 447.0, 449.0)
    pooled = pooled_verdict([_result(peer_s[:2], this_s[:2]), _result(peer_s[2:], this_s[2:])])
    assert pooled["verdict"]["outcome"] == outcome
    assert pooled["estimate"]["n"] == 4
    assert pooled["ratio"] == pytest.approx(np.exp(np.mean(np.log(np.divide(this_s, peer_s)))))
    assert [r["first"] for r in pooled["rounds"]] == ["peer", "this", "peer", "this"]


def test_pooling_refuses_other_peers_other_suites_and_failed_runs():
    one = _result((450.0,), (460.0,))
    with pytest.raises(ValueError, match="one peer commit"):
        pooled_rounds([one, _result((450.0,), (460.0,), against="e" * 40)])
    with pytest.raises(ValueError, match=r"'this' ran different suites .*\(2542, 7\)"):
        pooled_rounds([one, _result((450.0,), (460.0,), this_passed=2542)])
    with pytest.raises(ValueError, match="a run of 'peer' failed"):
        pooled_rounds([_result((450.0,), (460.0,), failed=1)])
    with pytest.raises(ValueError, match="a run of 'peer' failed"):  # no count, exit 1
        pooled_rounds([_result((450.0,), (460.0,), returncode=1)])
    with pytest.raises(ValueError, match=r"excluded rounds .* \[\(1, 0\)\] are not there"):
        pooled_rounds([one], excluded={(1, 0)})


def test_an_excluded_round_is_listed_but_left_out_of_the_estimate():
    peer_s, this_s = (450.0, 452.0, 447.0), (405.0, 700.0, 401.0)
    pooled = pooled_verdict([_result(peer_s, this_s)], excluded={(0, 1)})
    assert [r["excluded"] for r in pooled["rounds"]] == [False, True, False]
    assert pooled["estimate"]["n"] == 2
    kept = np.log([405.0 / 450.0, 401.0 / 447.0])
    assert pooled["estimate"]["mean"] == pytest.approx(kept.mean())
    assert pooled["ratio"] == pytest.approx(np.exp(kept.mean()))


def test_the_pool_command_writes_the_verdict_and_names_bad_exclusions(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(_result((450.0, 452.0), (405.0, 700.0))))
    second.write_text(json.dumps(_result((447.0,), (401.0,))))
    out = tmp_path / "pooled.json"
    pool = ["--pool", str(first), str(second), "--json", str(out)]
    main([*pool, "--exclude", "a.json:1", "--why", "a job ran beside it"])
    record = json.loads(out.read_text())
    assert record["excluded_why"] == "a job ran beside it"
    assert [r["excluded"] for r in record["rounds"]] == [False, True, False]
    # The two kept rounds read 0.900 and 0.897: below the margin even at 1 df.
    assert record["verdict"]["outcome"] == "holds" and record["estimate"]["n"] == 2
    assert "a.json:1" in capsys.readouterr().out
    for bad in ("c.json:0", "a.json:x"):
        with pytest.raises(SystemExit):
            main([*pool, "--exclude", bad, "--why", "w"])
        assert "--exclude takes FILE:REPEAT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*pool, "--exclude", "a.json:1"])
    assert "--exclude needs --pool and --why" in capsys.readouterr().err
    # Two results of one name (in two folders): which of them a round of that name is, is
    # ambiguous (it was the first one's, silently).
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.json").write_text(json.dumps(_result((447.0,), (900.0,))))
    twice = ["--pool", str(first), str(tmp_path / "other" / "a.json"), "--json", str(out)]
    with pytest.raises(SystemExit):
        main([*twice, "--exclude", "a.json:0", "--why", "w"])
    assert "2 results are named 'a.json'" in capsys.readouterr().err


def test_measure_alternates_the_suites_and_divides_this_by_the_peer(monkeypatch, tmp_path):
    """The suites' processes replaced by made-up runs: each round starts one contender later,
    the peer's suite runs in the peer's worktree, the restricted suite gets the peer's test ids,
    and the ratios are this (and this_peer_tests) over the peer, round by round (the ratio of
    sorted walls would read 1.01 here, where the rounds' median is 1.00)."""
    import contextlib

    from benchmarks import suite_time

    peer_root = tmp_path / "peer"
    walls = {"peer": [400.0, 500.0, 450.0], "this": [480.0, 500.0, 405.0]}
    walls["this_peer_tests"] = [200.0, 250.0, 225.0]
    order = []

    @contextlib.contextmanager
    def worktree(rev):
        yield peer_root

    def run_suite(root, env, extra=()):
        if root == peer_root:
            name = "peer"
        elif TESTS_ENV in env:
            ids = pathlib.Path(env[TESTS_ENV]).read_text().split()
            assert ids == ["tests/test_a.py::test_x"] and extra == ("-p", "benchmarks.suite_time")
            name = "this_peer_tests"
        else:
            name = "this"
        assert "RFJAX_TEST_SOMETHING" not in env
        order.append(name)
        return {"wall_s": walls[name][sum(n == name for n in order) - 1], "passed": 1}

    monkeypatch.setattr(suite_time, "worktree", worktree)
    monkeypatch.setattr(suite_time, "run_suite", run_suite)
    monkeypatch.setattr(
        suite_time,
        "default_test_ids",
        lambda root: ["tests/test_a.py::test_x"] * (root == peer_root),
    )
    # a suite restricted, or a test setting, in the caller's environment reaches no suite
    monkeypatch.setenv(TESTS_ENV, str(tmp_path / "elsewhere.txt"))
    monkeypatch.setenv("RFJAX_TEST_SOMETHING", "1")
    monkeypatch.setattr(suite_time, "_row", lambda run: "")
    monkeypatch.setattr(suite_time, "commit_of", lambda rev: rev)
    result = suite_time.measure("peer_rev", 3)
    assert order == [
        *("peer", "this", "this_peer_tests"),
        *("this", "this_peer_tests", "peer"),
        *("this_peer_tests", "peer", "this"),
    ]
    assert [run["wall_s"] for run in result["runs"]["this"]] == walls["this"]
    for name in ("this", "this_peer_tests"):
        ratios = np.divide(walls[name], walls["peer"])
        assert result["ratios"][f"{name} / peer"]["median"] == pytest.approx(np.median(ratios))
    assert (result["against_commit"], result["repeats"]) == ("peer_rev", 3)
