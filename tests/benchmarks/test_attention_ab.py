"""``benchmarks.attention_ab``: another commit's ``rfjax`` imported beside this one, and a row of
paired ratios measured end to end (this checkout against its own HEAD, at a toy length)."""

import json
import subprocess
import sys

import pytest

from benchmarks.attention_ab import ROOT


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
