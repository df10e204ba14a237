"""``benchmarks.suite_time``: the pieces that do not run a suite (the summary line it reads, the
tests it keeps, the order of the runs)."""

import os
import subprocess
import sys

import pytest

from benchmarks.suite_time import (
    ROOT,
    TESTS_ENV,
    name_and_params,
    parse_summary,
    rotated,
    split_by_names,
)


def test_the_summary_line_gives_counts_and_seconds():
    output = (
        "....\nSKIPPED [1] x.py:3: slow\n"
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
    assert parse_summary(done.stdout)["passed"] == 1
    assert "3 deselected" in done.stdout
