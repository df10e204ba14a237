"""``benchmarks.attention``'s verdicts from its rows: the chunk size it reports, the crossover
lengths, the growth from 4,096 to 16,384 and the ratios against performer-pytorch, each formed
from the rows of the same mode, length and pass (the timings are made up; nothing is timed)."""

import json
import sys

import pytest

from benchmarks import attention

LENGTHS = (1024, 4096, 16384)
CHUNK_SLOWDOWN = {64: 3.0, 128: 1.0, 256: 2.0}  # causal FAVOR at 128 is the fastest
# exact attention's seconds are EXACT[mode, pass] * (T / 1024)^2 ms (not run at 16,384)
EXACT = {
    ("bidirectional", "forward"): 0.5,  # FAVOR first faster at 4,096
    ("bidirectional", "forward_backward"): 0.1,  # never faster where exact ran: 16,384
    ("causal", "forward"): 2.0,  # faster from 1,024
    ("causal", "forward_backward"): 1.0,  # from 4,096
}
PEER_SLOWDOWN = {
    ("bidirectional", "forward"): 2.0,
    ("bidirectional", "forward_backward"): 4.0,
    ("causal", "forward"): 5.0,
    ("causal", "forward_backward"): 8.0,
}


def favor_s(length, mode, name, chunk_size=128):
    scale = 1.5 * CHUNK_SLOWDOWN[chunk_size] if mode == "causal" else 1.0
    return 1e-3 * (length / 1024) * (1 + attention.PASSES.index(name)) * scale


def fake_rows(length, batch, chunk_sizes, repeats, exact_limit_bytes):
    rows = []
    for mode in attention.MODES:
        for name in attention.PASSES:
            exact = {"method": "exact", "chunk_size": None, "median_s": None, "skipped": None}
            if length < 16384:
                exact["median_s"] = 1e-3 * EXACT[mode, name] * (length / 1024) ** 2
            else:
                exact["skipped"] = "not run: temporaries over the limit"
            favors = [
                {"method": "favor", "chunk_size": c, "median_s": favor_s(length, mode, name, c)}
                for c in (chunk_sizes if mode == "causal" else (None,))
            ]
            for row in (exact, *favors):
                rows.append({"length": length, "mode": mode, "pass": name, "temp_bytes": 1, **row})
    return rows


def fake_peer(torch_python, lengths, batch, repeats):
    rows = [
        {
            "length": length,
            "mode": mode,
            "pass": name,
            "median_s": favor_s(length, mode, name) * PEER_SLOWDOWN[mode, name],
        }
        for length in lengths
        for mode in attention.MODES
        for name in attention.PASSES
    ]
    return {"rows": rows, "torch": "2", "threads": 1, "causal_path": "fast"}


def test_the_summary_compares_rows_of_the_same_mode_length_and_pass(monkeypatch, tmp_path):
    monkeypatch.setattr(attention, "benchmark_length", fake_rows)
    monkeypatch.setattr(attention, "run_peer", fake_peer)
    path = tmp_path / "attention.json"
    argv = ["attention", "--lengths", *map(str, LENGTHS), "--chunk-sizes", "64", "128", "256"]
    monkeypatch.setattr(sys, "argv", [*argv, "--torch-python", "python", "--json", str(path)])
    attention.main()
    summary = json.loads(path.read_text())["summary"]
    assert summary["chunk_size"] == 128
    assert summary["crossover"] == {
        "bidirectional forward": 4096,
        "bidirectional forward_backward": 16384,
        "causal forward": 1024,
        "causal forward_backward": 4096,
    }
    assert summary["growth_16384_4096"] == pytest.approx(dict.fromkeys(summary["crossover"], 4.0))
    expected = {
        f"{mode} {length} {name}": 1 / slowdown
        for (mode, name), slowdown in PEER_SLOWDOWN.items()
        for length in LENGTHS
    }
    assert summary["peer_ratio"] == pytest.approx(expected)


def test_the_chunk_size_reported_has_the_smallest_geometric_mean_time():
    # Arithmetic means would pick 128 (0.255 s against 0.5005 s); geometric ones pick 64.
    times = {64: (1e-3, 1.0), 128: (1e-2, 0.5)}
    rows = [
        {"method": "favor", "mode": "causal", "chunk_size": c, "median_s": t}
        for c, pair in times.items()
        for t in pair
    ]
    rows.append({"method": "favor", "mode": "bidirectional", "chunk_size": None, "median_s": 9.0})
    assert attention.best_chunk_size(rows, (64, 128)) == 64


def test_repeats_fall_with_the_length_above_1024_to_at_least_five():
    assert [attention.repeats_for(t, 10) for t in (256, 1024, 2048, 4096)] == [10, 10, 5, 5]
    assert [attention.repeats_for(t, 40) for t in (256, 2048, 4096)] == [40, 20, 10]


def test_each_length_times_favor_at_every_chunk_size_and_exact_within_its_limit():
    rows = attention.benchmark_length(32, 1, (16, 32), repeats=2, exact_limit_bytes=0)
    timed = {(r["mode"], r["method"], r["chunk_size"], r["pass"]) for r in rows if r["median_s"]}
    expected = {("bidirectional", "favor", None, name) for name in attention.PASSES}
    expected |= {("causal", "favor", c, name) for c in (16, 32) for name in attention.PASSES}
    assert timed == expected  # exact's temporaries exceed a limit of 0 bytes: compiled, not run
    exact = [r for r in rows if r["method"] == "exact"]
    assert len(exact) == 4 and all(r["skipped"].startswith("not run") for r in exact)
    assert all(r["repeats"] == 5 for r in rows if r["median_s"])
