"""Counting the XLA programs a block of code needs, for the tests that check what a call
compiles. JAX records ``/jax/core/compile/backend_compile_duration`` once per program, whether
XLA compiles it or it is loaded from the persistent compilation cache (which the suite enables,
``conftest.py``), so a count is the same on a cold and a warm cache."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_programs() -> Iterator[list[int]]:
    """Counts the programs compiled or loaded from the cache inside the block (``counts[0]``)."""
    counts = [0]

    def listener(event: str, duration: float, **kwargs) -> None:
        del duration, kwargs
        counts[0] += event == BACKEND_COMPILE

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
