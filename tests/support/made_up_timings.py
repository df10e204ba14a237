"""A stand-in for ``benchmarks.timing.time_interleaved`` for tests of the benchmarks' bookkeeping:
each function runs once (so the benchmark's programs are built and run), then every name gets
made-up per-round times, drawn with a fixed seed, so that a ratio of medians, a ratio the wrong
way round or a ratio against the wrong peer all differ from the paired ratio a test expects."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import numpy as np

from benchmarks.timing import summary


class MadeUpTimings:
    """Callable as ``time_interleaved``; ``calls`` holds each call's result."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.calls: list[dict[str, dict]] = []

    def __call__(
        self, functions: Mapping[str, Callable[[], object]], *, repeats: int = 30, **_
    ) -> dict[str, dict]:
        for fn in functions.values():
            jax.block_until_ready(fn())
        timed = {}
        for name in functions:
            times = [float(t) for t in self.rng.uniform(1e-3, 1e-2, size=repeats)]
            timed[name] = {**summary(times), "samples_s": times}
        self.calls.append(timed)
        return timed
