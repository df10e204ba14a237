"""What a first call compiles (issue 33): each coupling's draw is a few XLA programs, and a draw
with a new key compiles nothing. Counted with ``jax.monitoring`` (XLA backend compilations and
loads from the persistent cache: ``tests/support/compile_counts.py``), so the checks do not depend
on the machine's speed nor on the cache; the times are in ``benchmarks/cold_start.py``.
"""

from __future__ import annotations

import jax
import pytest

from rfjax import projections
from tests.support.compile_counts import count_programs

# A coupling's draw: its program, and for the P-model families the check of the family (its
# reference parameters and its P_i, once per family and size).
MAX_FIRST_DRAW_PROGRAMS = 3


@pytest.mark.parametrize("coupling", projections.available())
def test_a_draw_compiles_once_per_coupling(coupling):
    sampler = projections.get(coupling)
    keys = jax.random.split(jax.random.key(0), 2)  # the key machinery compiled outside
    dim, num_features = 5, 12  # shapes no other test draws: the first draw compiles here
    with count_programs() as first:
        jax.block_until_ready(sampler(keys[0], dim, num_features))
    with count_programs() as second:
        jax.block_until_ready(sampler(keys[1], dim, num_features))
    assert first[0] <= MAX_FIRST_DRAW_PROGRAMS
    assert second[0] == 0
