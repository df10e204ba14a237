"""``benchmarks.timing``: quartiles within the samples, as NumPy's default interpolates them."""

import numpy as np
import pytest

from benchmarks import timing


@pytest.mark.parametrize("samples", [[1.0, 2.0], [1.0, 2.0, 3.0], [3.0, 1.0, 5.0, 2.0, 4.0]])
def test_quartiles_interpolate_between_the_samples(samples):
    """statistics.quantiles' default method extrapolated: [1, 2] gave 0.75 and 2.25, and a
    ridge run printed a negative quartile of a ratio of positive times."""
    np.testing.assert_allclose(timing.quartiles(samples), np.percentile(samples, [25, 75]))
    summary = timing.summary(samples)
    assert min(samples) <= summary["q25_s"] <= summary["median_s"] <= summary["q75_s"]
    ratio = timing.paired_ratio(samples, [1.0] * len(samples))
    assert min(samples) <= ratio["q25"] and ratio["q75"] <= max(samples)
    assert timing.quartiles([2.0]) == (2.0, 2.0)


def test_the_ridge_table_takes_a_peer_that_failed(tmp_path):
    """measure writes an error row for a peer that failed (a MemoryError); the table read its
    fit time and raised KeyError."""
    import json

    from benchmarks import ridge

    rows = [
        {"alpha": 1.0, "gamma": 0.1, "alpha_grid": [1.0], "validation": "5,000 rows"},
        {"method": "sklearn RBFSampler + RidgeClassifier", "m": 64, "train_rows": 10,
         "error": "MemoryError"},
        {"method": "rfjax", "m": 64, "train_rows": 10, "test_accuracy": 0.5,
         "accuracy_se": 0.01, "fit_s": 1.0},
    ]  # fmt: skip
    (tmp_path / "ridge.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = ridge.table(str(tmp_path))
    assert (
        "failed: MemoryError" in text and "| rfjax | 64 | 10 | 0.5000 +- 0.0100 | 1.0 |  |" in text
    )


def test_results_are_written_whole_with_how_they_were_made(tmp_path):
    """Every benchmark's JSON through one save_json: atomic (they were written in place), with
    the run's settings, the load and JAX's version (several recorded none of them)."""
    import json
    import pathlib

    import jax

    path = tmp_path / "out" / "rows.json"
    timing.save_json(path, [{"m": 8}], settings={"json": pathlib.Path("x.json"), "sizes": (8,)})
    written = json.loads(path.read_text())
    assert written["rows"] == [{"m": 8}]
    assert written["written_with"]["settings"] == {"json": "x.json", "sizes": [8]}
    assert written["written_with"]["jax"] == jax.__version__
    assert len(written["written_with"]["load_average"]) == 3
    assert sorted(p.name for p in path.parent.iterdir()) == ["rows.json"]  # no temporary left


class _Clock:
    """A stand-in for ``time.perf_counter`` that only the calls below advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_interleaved_samples_are_paired_by_round_and_leave_the_setups_out(monkeypatch):
    """Sample i of each function is its call in round i (paired_ratio divides them round by
    round), the setup before every call (warm-up included) is not timed, and with a seed the
    rounds run in varying orders."""
    clock = _Clock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    seconds = {"a": [3.0, 1.0, 2.0, 5.0, 4.0, 2.0], "b": [1.0, 2.0, 4.0, 1.0, 8.0, 3.0]}
    seconds["c"] = [1.0] * 6
    warmup = 2
    calls = {name: 0 for name in seconds}
    ready = {name: False for name in seconds}
    order: list[str] = []

    def call(name):
        assert ready[name], f"{name} called without its setup"
        ready[name] = False
        index = calls[name] - warmup
        calls[name] += 1
        if index >= 0:
            order.append(name)
            clock.now += seconds[name][index]
        return name

    def setup(name):
        ready[name] = True
        clock.now += 100.0  # the setup's own time, which no sample may hold

    functions = {name: lambda name=name: call(name) for name in seconds}
    setups = {name: lambda name=name: setup(name) for name in seconds}
    timed = timing.time_interleaved(
        functions, repeats=6, warmup=warmup, setups=setups, shuffle_seed=0
    )
    for name, times in seconds.items():
        assert timed[name]["samples_s"] == times
        assert timed[name]["median_s"] == pytest.approx(np.median(times))
        assert timed[name]["min_s"] == min(times)
    rounds = [tuple(order[3 * i : 3 * i + 3]) for i in range(6)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds) and len(set(rounds)) > 1
    ratio = timing.paired_ratio(timed["a"]["samples_s"], timed["b"]["samples_s"])
    ratios = np.divide(seconds["a"], seconds["b"])
    assert ratio["median"] == pytest.approx(np.median(ratios))
    assert (ratio["q25"], ratio["q75"]) == pytest.approx(tuple(np.percentile(ratios, [25, 75])))
    with pytest.raises(ValueError, match="equal, non-zero lengths, got 2 and 3"):
        timing.paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0])


def test_streamed_samples_are_seconds_per_call(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    per_call = {"a": 2.0, "b": 0.5}

    def call(name):
        clock.now += per_call[name]
        return name

    timed = timing.time_streamed(
        {name: lambda name=name: call(name) for name in per_call}, calls=4, repeats=3, warmup=1
    )
    for name, seconds in per_call.items():
        assert timed[name]["median_s"] == pytest.approx(seconds)


def test_no_repeats_are_refused_before_anything_runs():
    """``--repeats 0`` (benchmarks.fwht, sklearn_transform) compiled and warmed every contender,
    then raised statistics' "must have at least two data points"."""
    calls = []
    functions = {"a": lambda: calls.append(1)}
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        timing.time_interleaved(functions, repeats=0)
    with pytest.raises(ValueError, match="calls must be >= 1, got 0"):
        timing.time_streamed(functions, calls=0)
    with pytest.raises(ValueError, match="repeats must be >= 1, got -1"):
        timing.time_streamed(functions, repeats=-1)
    assert calls == []
