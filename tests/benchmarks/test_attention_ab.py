"""``benchmarks.attention_ab``: another commit's ``rfjax`` imported beside this one, and a row of
paired ratios measured end to end (this checkout against its own HEAD, at a toy length)."""

import json
import math
import subprocess
import sys

import pytest

from benchmarks.attention_ab import NOT_SLOWER_CLAIM, PASSES, ROOT, judged_runs


@pytest.mark.integration  # a benchmark run end to end (a second copy of rfjax compiled)
def test_this_checkout_against_its_head_gives_a_row_per_pass(tmp_path):
    out = tmp_path / "ab.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.attention_ab",
        "--against",
        "HEAD",
        "--lengths",
        "128",
        "--modes",
        "causal",
        "--pairs",
        "3",
        "--json",
        str(out),
    ]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["against"] == "HEAD"
    rows = record["rows"]
    assert [(r["mode"], r["length"], r["pass_name"]) for r in rows] == [
        ("causal", 128, "forward"),
        ("causal", 128, "forward_backward"),
    ]
    for row in rows:
        assert row["ratio_q1"] <= row["ratio_median"] <= row["ratio_q3"]
        assert row["pairs"] == 3 and row["ratio_median"] > 0
        # The same code on both sides (HEAD's rfjax, unless the checkout changed it): the same
        # compiled temporaries.
        if not _attention_changed():
            assert row["temp_this_MiB"] == row["temp_other_MiB"]


def _attention_changed() -> bool:
    diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "rfjax"], cwd=ROOT, check=False)
    return diff.returncode != 0


@pytest.mark.integration
def test_no_pairs_compiles_the_chosen_map_and_implementation_without_timing(tmp_path):
    out = tmp_path / "ab.json"
    command = [sys.executable, "-m", "benchmarks.attention_ab", "--against", "HEAD"]
    command += ["--lengths", "64", "--modes", "bidirectional", "--pairs", "0"]
    command += ["--feature-map", "angular_hybrid", "--implementation", "pallas_triton_interpret"]
    completed = subprocess.run(
        [*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    for row in json.loads(out.read_text())["rows"]:
        assert (row["feature_map"], row["implementation"]) == (
            "angular_hybrid",
            "pallas_triton_interpret",
        )
        assert row["ratio_median"] is row["ratio_q1"] is row["ratio_q3"] is None
        assert row["pairs"] == 0 and row["temp_this_MiB"] > 0 and row["temp_other_MiB"] > 0


def _records(medians_per_run):
    """Records of runs with one causal row per pass, the given median ratios."""
    return [
        {
            "against": "HEAD",
            "rows": [
                {"mode": "causal", "length": 256, "pass_name": name, "ratio_median": median}
                for name, median in zip(PASSES, medians, strict=True)
            ],
        }
        for medians in medians_per_run
    ]


def test_runs_are_judged_per_row_and_pooled_against_the_declared_margin():
    """Each run's median ratio is one unit. The forward row reads 1.00 +- 0.005 over 20 runs
    (inside the 2% margin: holds), the forward + backward row 1.10 +- 0.005 (beyond it: does
    not hold); their pool, 1.05, lies beyond the margin too. With two runs far apart the
    interval straddles it: not resolved."""
    spread = [0.995, 1.005] * 10
    judged = judged_runs(_records([(s, 1.1 * s) for s in spread]))
    forward, both = judged["rows"]
    assert (forward["pass_name"], both["pass_name"]) == PASSES
    assert forward["verdict"]["outcome"] == "holds"
    assert both["verdict"]["outcome"] == "does not hold"
    assert judged["pooled"]["verdict"]["outcome"] == "does not hold"
    assert (
        forward["ratio_low"]
        < forward["ratio"]
        < forward["ratio_high"]
        < math.exp(NOT_SLOWER_CLAIM["margin"])
    )
    assert both["ratio"] == pytest.approx(1.1, rel=1e-4)
    assert judged["pooled"]["ratio"] == pytest.approx(math.sqrt(1.1), rel=1e-4)
    wide = judged_runs(_records([(0.95, 0.95), (1.08, 1.08)]))
    assert {row["verdict"]["outcome"] for row in wide["rows"]} == {"not resolved"}


@pytest.mark.integration
def test_runs_above_one_run_in_fresh_processes_and_are_judged(tmp_path):
    out = tmp_path / "ab.json"
    command = [sys.executable, "-m", "benchmarks.attention_ab", "--against", "HEAD"]
    command += ["--lengths", "64", "--modes", "bidirectional", "--pairs", "3", "--runs", "2"]
    completed = subprocess.run(
        [*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    record = json.loads(out.read_text())
    assert len(record["runs"]) == 2 and record["claim"] == NOT_SLOWER_CLAIM
    assert [(r["mode"], r["length"], r["pass_name"]) for r in record["rows"]] == [
        ("bidirectional", 64, name) for name in PASSES
    ]
    for judged in [*record["rows"], record["pooled"]]:
        assert judged["ratio_low"] <= judged["ratio"] <= judged["ratio_high"]
        assert judged["estimate"]["n"] == 2
        assert judged["verdict"]["outcome"] in ("holds", "does not hold", "not resolved")


def test_runs_refuse_untimed_runs_and_a_count_below_one():
    for flags, message in (
        (["--runs", "2", "--pairs", "0"], "--pairs 0"),
        (["--runs", "0"], ">= 1"),
    ):
        command = [sys.executable, "-m", "benchmarks.attention_ab", "--against", "HEAD", *flags]
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        assert completed.returncode == 2 and message in completed.stderr, completed.stderr


def test_runs_of_different_code_are_not_pooled(monkeypatch):
    """A run that measured other code than the checkout's (a commit made while the runs went
    on, or another ``--against``) stops the judgement."""
    import argparse

    from benchmarks import attention_ab

    setting = argparse.Namespace(against="HEAD", json=None)
    for this, against in (("abc1234-dirty", "HEAD"), ("abc1234", "HEAD~1")):
        records = [{**record, "this": "abc1234"} for record in _records([(1.0, 1.0)] * 2)]
        records[1] |= {"this": this, "against": against}
        monkeypatch.setattr(attention_ab, "repeated_runs", lambda *_, r=records: r)
        with pytest.raises(RuntimeError, match="runs of different code are not pooled"):
            attention_ab.main_runs(setting, "abc1234")
