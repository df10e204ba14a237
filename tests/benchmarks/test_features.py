"""``benchmarks.features``: each coupling's ratio is over ORF's times of the same rounds, and the
timed call draws with the named coupling (made-up times; tiny sizes)."""

import jax
import numpy as np
import pytest

from benchmarks import features as benchmark
from benchmarks.timing import paired_ratio
from rfjax import features, projections
from tests.support.made_up_timings import MadeUpTimings


def test_each_ratio_is_over_orthogonals_samples_of_the_same_rounds(monkeypatch):
    timed = MadeUpTimings()
    monkeypatch.setattr(benchmark, "time_interleaved", timed)
    rows = benchmark.benchmark(16, 8, (8, 16), repeats=5)
    assert [(r["num_features"], r["coupling"]) for r in rows] == [
        (m, c) for m in (8, 16) for c in benchmark.COUPLINGS
    ]
    for row, call in zip(rows, [c for c in timed.calls for _ in benchmark.COUPLINGS], strict=True):
        samples = call[row["coupling"]]["samples_s"]
        assert row["over_orthogonal"] == paired_ratio(samples, call["orthogonal"]["samples_s"])
        assert row["median_ms"] == pytest.approx(1e3 * np.median(samples))
        assert len(row["load_average_before"]) == len(row["load_average_after"]) == 3


@pytest.mark.parametrize("coupling", benchmark.COUPLINGS)
def test_the_timed_call_draws_with_its_coupling(coupling):
    key, x = jax.random.key(3), jax.random.normal(jax.random.key(4), (5, 8))
    projection = projections.get(coupling)(key, 8, 16)
    want = features.positive_features(x, projection, kernel="softmax")
    got = benchmark.draw_and_featurize(coupling, 16)(key, x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
