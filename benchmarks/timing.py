"""Timing helpers for benchmarks: interleaved repeats, medians, ratios in one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import jax


def time_interleaved(
    functions: Mapping[str, Callable[[], object]], *, repeats: int = 30, warmup: int = 3
) -> dict[str, dict[str, float]]:
    """Median and spread of wall time per call, running the functions round-robin.

    Each function is called ``warmup`` times first (compilation), then the functions are timed in
    turn ``repeats`` times so that drifts in machine load hit all of them alike. Results are
    blocked on (``jax.block_until_ready``) before the clock stops.
    """
    for fn in functions.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: summary(times) for name, times in samples.items()}


def summary(times: list[float]) -> dict[str, float]:
    """Median, minimum and quartiles of wall times (one sample: all four are that sample)."""
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "q25_s": quartiles[0],
        "q75_s": quartiles[2],
    }


def time_streamed(
    functions: Mapping[str, Callable[[], object]],
    *,
    calls: int = 50,
    repeats: int = 7,
    warmup: int = 3,
) -> dict[str, dict[str, float]]:
    """Median time per call of ``calls`` back-to-back asynchronous calls, round-robin.

    For device kernels shorter than a host dispatch round trip (tens of microseconds on a GPU):
    each sample dispatches ``calls`` calls without waiting and blocks on the last, so the device
    runs them back to back and the host's dispatch overlaps them; the sample is the elapsed time
    over ``calls``. As long as one call's device time exceeds its dispatch time, this is the
    device's time per call (a copy's GB/s near the memory bandwidth shows it).
    """
    for fn in functions.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            out = None
            for _ in range(calls):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: summary(times) for name, times in samples.items()}
