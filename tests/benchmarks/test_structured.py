"""``benchmarks.structured``: each fast coupling's ratio is over its dense peer's times of the
same rounds, each map's over the dense Gaussian W's, and the timed products are x W^T of the
named maps with m = d (made-up times; tiny sizes)."""

import jax
import numpy as np

from benchmarks import structured
from benchmarks.timing import paired_ratio
from rfjax import projections
from tests.support.made_up_timings import MadeUpTimings


def test_each_fast_coupling_is_over_its_dense_peer(monkeypatch):
    timed = MadeUpTimings()
    monkeypatch.setattr(structured, "time_interleaved", timed)
    rows = structured.benchmark((16, 32), 8, repeats=5)
    assert [(r["dim"], r["dense"], r["fast"]) for r in rows] == [
        (d, dense, fast) for d in (16, 32) for dense, fast in structured.PAIRS
    ]
    for row, call in zip(rows, [c for c in timed.calls for _ in structured.PAIRS], strict=True):
        fast, dense = call[row["fast"]]["samples_s"], call[row["dense"]]["samples_s"]
        assert row["fast_over_dense"] == paired_ratio(fast, dense)
        assert row["dense_ms"] == 1e3 * call[row["dense"]]["median_s"]
        assert row["fast_ms"] == 1e3 * call[row["fast"]]["median_s"]


def test_each_map_is_over_the_dense_gaussian_w(monkeypatch):
    timed = MadeUpTimings()
    monkeypatch.setattr(structured, "time_interleaved", timed)
    rows = structured.apply_benchmark((16,), 8, repeats=5)
    labels = ["dense", *(label for label, _, _ in structured.P_MODEL_FAMILIES)]
    assert [r["family"] for r in rows] == labels
    (call,) = timed.calls
    for row in rows:
        samples = call[row["family"]]["samples_s"]
        assert row["over_dense"] == paired_ratio(samples, call["dense"]["samples_s"])
        assert row["samples_ms"] == [1e3 * t for t in samples]
        assert (row["dim"], row["inputs"]) == (16, 8)


def test_the_timed_products_are_the_named_maps_with_m_equal_to_d(monkeypatch):
    """Each timed function computes x W^T (``projection(x)``, m = d) of a map of its family
    (jitted there, eagerly here: float32 rounding apart, entries of order 1)."""
    products = {}

    def keep(functions, **_):
        products.update({label: fn() for label, fn in functions.items()})
        return MadeUpTimings()(functions, repeats=2)

    monkeypatch.setattr(structured, "time_interleaved", keep)
    structured.apply_benchmark((16,), 8, repeats=2)
    x = jax.random.normal(jax.random.key(0), (8, 16))
    dense = projections.gaussian(jax.random.key(1), 16, 16)
    np.testing.assert_allclose(products["dense"], dense(x), rtol=1e-5, atol=1e-5)
    for index, (label, coupling, options) in enumerate(structured.P_MODEL_FAMILIES):
        projection = projections.get(coupling)(jax.random.key(2 + index), 16, 16, **options)
        np.testing.assert_allclose(products[label], projection(x), rtol=1e-5, atol=1e-5)
