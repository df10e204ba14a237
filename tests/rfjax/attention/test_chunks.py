"""Tests of ``rfjax.attention._chunks``: the schedule chosen per platform, the recurrence over
chunk summaries (forward and in reversed time) against a loop, and the chunk map with and
without a loop. The chunk algorithm itself is checked through the ops that use it
(test_prefix.py, test_log_prefix.py), in both schedules."""

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention import _chunks


def test_only_a_cpu_runs_the_fused_scan():
    assert _chunks.fused_chunk_scan("cpu")
    assert not _chunks.fused_chunk_scan("gpu") and not _chunks.fused_chunk_scan("tpu")


@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_states_are_the_linear_recurrence(reverse):
    rng = np.random.default_rng(0)
    summaries = rng.standard_normal((5, 3, 2)).astype(np.float32)
    decays = rng.uniform(0.2, 1.0, (5, 3)).astype(np.float32)
    initial = rng.standard_normal((3, 2)).astype(np.float32)
    states, final = _chunks.chunk_states(
        jnp.asarray(summaries), jnp.asarray(decays), jnp.asarray(initial), reverse=reverse
    )
    state, expected = initial, np.zeros_like(summaries)
    for c in reversed(range(5)) if reverse else range(5):
        expected[c] = state  # the state before chunk c's summary enters
        state = decays[c][:, None] * state + summaries[c]
    np.testing.assert_allclose(states, expected, rtol=1e-6)
    np.testing.assert_allclose(final, state, rtol=1e-6)


def test_map_chunks_maps_over_the_leading_axis_in_steps(monkeypatch):
    chunks = jnp.arange(24.0).reshape(6, 4)
    expected = np.asarray(chunks).sum(-1) * 2
    np.testing.assert_array_equal(_chunks.map_chunks(lambda a: 2 * a.sum(), chunks), expected)
    monkeypatch.setattr(_chunks, "CHUNKS_PER_STEP", 4)  # 6 chunks: a loop with a remainder
    np.testing.assert_array_equal(_chunks.map_chunks(lambda a: 2 * a.sum(), chunks), expected)
