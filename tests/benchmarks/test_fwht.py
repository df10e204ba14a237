"""``benchmarks.fwht``: which contender's time is divided by which, and the ratios, rates and
rows of a run at a small size (the C++ kernel on this machine's CPU)."""

import numpy as np
import pytest

from benchmarks import fwht
from benchmarks.timing import paired_ratio
from rfjax.ops import fwht_backend


def test_ratios_pair_in_place_with_in_place_and_out_of_place_with_out_of_place():
    """The module docstring's pairs: every contender over copy_xla; rfjax, rfjax_inplace and
    rfjax_1thread over the in-place peers; rfjax over the out-of-place ones; each rfjax call over
    the baseline build's call of its kind; the other implementations over rfjax."""
    names = ["rfjax", "rfjax_1thread", "xla_butterfly", "matmul", "copy_numpy", "copy_xla"]
    names += ["rfjax_inplace", "baseline", "baseline_inplace", "fht_cpu_t1", "fht_cpu_out_t1"]
    names += ["fht_cpu_t4", "fht_cpu_out_t4", "ffht"]
    expected = {(name, "copy_xla") for name in names if name != "copy_xla"}
    expected |= {
        (ours, peer)
        for ours in ("rfjax", "rfjax_inplace", "rfjax_1thread")
        for peer in ("fht_cpu_t1", "fht_cpu_t4", "ffht")
    }
    expected |= {("rfjax", "fht_cpu_out_t1"), ("rfjax", "fht_cpu_out_t4")}
    expected |= {("rfjax", "baseline"), ("rfjax_inplace", "baseline_inplace")}
    expected |= {("xla_butterfly", "rfjax"), ("matmul", "rfjax")}
    pairs = fwht._ratio_pairs(names)
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected
    # a contender that was not timed (no baseline, no fht_cpu) is in no pair
    assert ("rfjax", "baseline") not in fwht._ratio_pairs(["rfjax", "copy_xla"])


@pytest.mark.skipif(not fwht_backend("cpu").available(), reason="the C++ kernel is not built")
def test_a_run_divides_each_contenders_samples_by_its_peers_round_by_round():
    total, n = 1 << 10, 16
    report = fwht.run(total=total, sizes=(n,), repeats=3, threads=2)
    result = report["results"][n]
    assert result["rows"] == total // n
    timings = result["timings"]
    assert {"rfjax", "rfjax_inplace", "rfjax_1thread", "copy_xla"} <= set(timings)
    for timing in timings.values():
        assert timing["median_ms"] == pytest.approx(np.median(timing["samples_ms"]))
        assert timing["gb_per_s"] == pytest.approx(2 * 4 * total / timing["median_ms"] / 1e6)
    assert set(result["ratios"]) == {f"{a}/{b}" for a, b in fwht._ratio_pairs(list(timings))}
    for key, ratio in result["ratios"].items():
        a, b = key.split("/")
        expected = paired_ratio(timings[a]["samples_ms"], timings[b]["samples_ms"])
        assert ratio == pytest.approx(expected), key


@pytest.mark.parametrize("sizes", [["48"], ["16", "512"], ["0"]])
def test_sizes_that_do_not_split_the_batch_are_refused_by_name(sizes, monkeypatch, capsys):
    """--sizes 16 512 with --log2-total 8 timed n = 16, then raised numpy's "cannot reshape
    array of size 256 into shape (0,512)" before any JSON was written (48: "(5,48)")."""
    monkeypatch.setattr(fwht, "run", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr("sys.argv", ["fwht", "--log2-total", "8", "--sizes", *sizes])
    with pytest.raises(SystemExit) as stopped:
        fwht.main()
    assert stopped.value.code == 2
    assert "--sizes must be powers of two <= 2^--log2-total = 256" in capsys.readouterr().err
