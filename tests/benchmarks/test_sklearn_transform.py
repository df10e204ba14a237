"""``benchmarks.sklearn_transform``: every transformer's ratio is over RBFSampler's time of
the same round, input dtype and width, and the first-call ratios are over RBFSampler's."""

import numpy as np
import pytest
from sklearn.kernel_approximation import RBFSampler

from benchmarks import sklearn_transform
from benchmarks.timing import paired_ratio, time_interleaved


def test_each_ratio_is_over_rbf_samplers_samples_of_the_same_rounds(monkeypatch):
    """The inputs have the row's dtype; each transformer is fitted once, outside the timing."""
    fits, dtypes = [], []
    fit = RBFSampler.fit
    monkeypatch.setattr(
        RBFSampler, "fit", lambda self, *a, **k: fits.append(1) or fit(self, *a, **k)
    )

    def timed(functions, **options):
        dtypes.append(functions["sklearn RBFSampler"]().dtype)  # float32 in, float32 out
        return time_interleaved(functions, **options)

    monkeypatch.setattr(sklearn_transform, "time_interleaved", timed)
    rows = sklearn_transform.benchmark(40, 3, 8, repeats=3, dtypes=("float64", "float32"))
    assert dtypes == [np.float64, np.float32] and len(fits) == 2
    names = ("sklearn RBFSampler", *sklearn_transform.VARIANTS)
    assert [(r["input_dtype"], r["transformer"]) for r in rows] == [
        (dtype, name) for dtype in ("float64", "float32") for name in names
    ]
    for row in rows:
        reference = next(
            r
            for r in rows
            if (r["input_dtype"], r["transformer"]) == (row["input_dtype"], names[0])
        )
        expected = paired_ratio(row["samples_ms"], reference["samples_ms"])
        assert row["ratio_to_rbf_sampler"] == pytest.approx(expected)
        assert (row["components"], row["inputs"]) == (8, 40)
    assert rows[0]["ratio_to_rbf_sampler"]["median"] == 1.0


def test_first_call_ratios_are_over_rbf_samplers_times(monkeypatch):
    """Made-up times, RBFSampler's in each size the smallest: every ratio is a transformer's
    time over RBFSampler's of the same size and kind, and each size has a width not used
    before (a cold first fit)."""
    widths = []

    def times(make, x, repeats, rng):
        width = make.keywords["n_components"]
        widths.append(width)
        slow = 1.0 if make.func is RBFSampler else 3.0
        return {"cold_s": slow * len(x), "warm_s": 2 * slow, "new_n_s": slow / len(x)}

    monkeypatch.setattr(sklearn_transform, "_first_call_times", times)
    rows = sklearn_transform.first_call(4, 16, repeats=2)
    assert len(rows) == 3 * len(sklearn_transform.FIRST_CALL_SIZES)
    for row in rows:
        expected = 1.0 if row["transformer"] == "sklearn RBFSampler" else 3.0
        ratios = (row["cold_ratio"], row["warm_ratio"], row["new_n_ratio"])
        assert ratios == pytest.approx((expected,) * 3), row
    assert sorted(set(widths)) == [18, 20] and 16 not in widths
