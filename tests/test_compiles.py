"""What a first call compiles (issue 33): each coupling's draw is a few XLA programs, and a draw
with a new key compiles nothing. Counted with ``jax.monitoring`` (XLA backend compilations), so
the checks do not depend on the machine's speed; the times are in ``benchmarks/cold_start.py``.
"""

from __future__ import annotations

import contextlib

import jax
import pytest

from rfjax import projections

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
# A coupling's draw: its program, and for the P-model families the check of the family (its
# reference parameters and its P_i, once per family and size).
MAX_FIRST_DRAW_PROGRAMS = 3


@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations inside the block (``counts[0]``)."""
    counts = [0]

    def listener(event: str, duration: float, **kwargs) -> None:
        del duration, kwargs
        if event == BACKEND_COMPILE:
            counts[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize("coupling", projections.available())
def test_a_draw_compiles_once_per_coupling(coupling):
    sampler = projections.get(coupling)
    keys = jax.random.split(jax.random.key(0), 2)  # the key machinery compiled outside
    dim, num_features = 5, 12  # shapes no other test draws: the first draw compiles here
    with count_compiles() as first:
        jax.block_until_ready(sampler(keys[0], dim, num_features))
    with count_compiles() as second:
        jax.block_until_ready(sampler(keys[1], dim, num_features))
    assert first[0] <= MAX_FIRST_DRAW_PROGRAMS
    assert second[0] == 0
