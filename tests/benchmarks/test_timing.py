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
