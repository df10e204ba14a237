"""Timing helpers for benchmarks: interleaved repeats, medians, paired ratios in one run."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Mapping

import jax


def time_interleaved(
    functions: Mapping[str, Callable[[], object]],
    *,
    repeats: int = 30,
    warmup: int = 3,
    setups: Mapping[str, Callable[[], object]] | None = None,
    shuffle_seed: int | None = None,
) -> dict[str, dict]:
    """Median and spread of wall time per call, running the functions round-robin.

    Each function is called ``warmup`` times first (compilation), then the functions are timed in
    turn ``repeats`` times so that drifts in machine load hit all of them alike. Results are
    blocked on (``jax.block_until_ready``) before the clock stops. ``setups[name]()``, when
    given, runs untimed before each call of ``functions[name]`` (e.g. to restore the buffer of an
    in-place transform). A result is freed after its time is taken (freeing a large array can
    take milliseconds, which are not the call's). With ``shuffle_seed``, each round runs the
    functions in a fresh random order, so that no function always follows the same one (one that
    leaves the caches cold, say). Each entry holds ``summary`` of its times and the times
    themselves (``samples_s``, one per round, for ``paired_ratio``).
    """
    _check_counts(repeats=repeats)
    setups = setups or {}
    for name, fn in functions.items():
        for _ in range(warmup):
            _run_setup(setups, name)
            jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {name: [] for name in functions}
    order = list(functions)
    rng = random.Random(shuffle_seed)
    for _ in range(repeats):
        if shuffle_seed is not None:
            rng.shuffle(order)
        for name in order:
            fn = functions[name]
            _run_setup(setups, name)
            start = time.perf_counter()
            result = jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
            del result  # freed after the clock stops, like a caller that keeps its result
    return {name: {**summary(times), "samples_s": times} for name, times in samples.items()}


def _check_counts(**counts: int) -> None:
    """Refuses a count below 1 before anything is compiled (no samples: ``statistics`` raised
    "must have at least two data points" after every warm-up)."""
    for name, count in counts.items():
        if count < 1:
            raise ValueError(f"{name} must be >= 1, got {count}")


def _run_setup(setups: Mapping[str, Callable[[], object]], name: str) -> None:
    if name in setups:
        jax.block_until_ready(setups[name]())


def quartiles(samples: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``samples``, interpolated between them as NumPy's
    default does (``statistics.quantiles``' default method extrapolates past the samples: a
    negative quartile of positive ratios from two repeats); one sample: itself twice."""
    if len(samples) == 1:
        return samples[0], samples[0]
    first, _, third = statistics.quantiles(samples, n=4, method="inclusive")
    return first, third


def summary(times: list[float]) -> dict[str, float]:
    """Median, minimum and quartiles of wall times (one sample: all four are that sample)."""
    low, high = quartiles(times)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "q25_s": low,
        "q75_s": high,
    }


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """The ratios of paired samples (repeat i of one contender over repeat i of the other, taken
    back to back by ``time_interleaved``): their median and quartiles. A load spike that hits one
    round hits both sides of its ratio, so this is steadier than a ratio of medians."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(
            f"paired samples need equal, non-zero lengths, got {len(numerator)} and "
            f"{len(denominator)}"
        )
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    low, high = quartiles(ratios)
    return {"median": statistics.median(ratios), "q25": low, "q75": high}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (other jobs on the machine), rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def save_json(path: str | os.PathLike, payload: object, *, settings: Mapping | None) -> None:
    """A benchmark's results as JSON, written atomically (``experiments.core.outputs``: a
    killed run leaves the previous file or the whole new one), with how they were made under
    ``"written_with"``: the run's ``settings`` (its command line's arguments), the machine's
    load averages when it was written and JAX's version. A list ``payload`` goes under
    ``"rows"``."""
    from experiments.core.outputs import write_json  # here: only writers need the core

    record = dict(payload) if isinstance(payload, Mapping) else {"rows": payload}
    record["written_with"] = {
        "settings": {key: _plain(value) for key, value in (settings or {}).items()},
        "load_average": load_average(),
        "jax": jax.__version__,
    }
    write_json(os.fspath(path), record)


def _plain(value: object) -> object:
    """A setting as JSON takes it (paths and other objects as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


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
    _check_counts(calls=calls, repeats=repeats)
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
