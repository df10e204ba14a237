"""``benchmarks.hybrid``: the hybrid's width formula, and each hybrid's ratio over each positive
map's times of the same rounds (made-up times; tiny sizes)."""

import jax
import pytest

from benchmarks import hybrid
from benchmarks.timing import paired_ratio
from rfjax import features, projections
from tests.support.made_up_timings import MadeUpTimings


@pytest.mark.parametrize(("m", "n"), [(16, 8), (3, 5)])
def test_the_width_is_angular_hybrid_features_width(m, n):
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (2, 6))
    signs = projections.gaussian(keys[3], 6, n)
    out = features.angular_hybrid_features(
        x,
        projections.gaussian(keys[1], 6, m),
        projections.gaussian(keys[2], 6, m),
        signs,
        side="query",
    )
    assert out.shape == (2, hybrid.hybrid_width(m, n))


def test_each_hybrid_is_over_each_positive_map_of_the_same_rounds(monkeypatch):
    timed = MadeUpTimings()
    monkeypatch.setattr(hybrid, "time_interleaved", timed)
    result = hybrid.benchmark(8, 6, 4, 2, repeats=5)
    (call,) = timed.calls
    names = list(call)
    assert result["widths"] == dict(zip(names, (48, 48, 8, 48), strict=True))
    assert list(result["ratios"]) == [(h, p) for h in names[:2] for p in names[2:]]
    for (name, positive), ratio in result["ratios"].items():
        assert ratio == paired_ratio(call[name]["samples_s"], call[positive]["samples_s"])
    assert set(result["load_average"]) == {"before", "after"}
