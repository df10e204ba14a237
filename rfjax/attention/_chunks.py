"""The two schedules of the causal chunk algorithm, shared by the per-key op (``_prefix``) and
the per-feature op (``_log_prefix``): each forms, per chunk of C positions, a key summary
(m, p), the chunk's output from the state of the earlier chunks' keys, and, in the backward
pass, the matching pieces in reversed time.

* ``fused_chunk_scan`` (a CPU): one ``lax.scan`` over the chunks carries the state and forms each
  chunk's output from it: each chunk's work stays in cache and no (T / C, m, p) states are
  stored.
* Otherwise (accelerators): every chunk's summary at once (batched products), the states by a
  scan over the summaries only (``chunk_states``: T / C steps of (m, p) elementwise work), and
  the outputs of ``CHUNKS_PER_STEP`` chunks at a time (``map_chunks``): the chunk algorithm of
  flash-linear-attention (``fla/ops/common/chunk_h.py``, ``chunk_o.py``).
"""

from __future__ import annotations

import jax

from rfjax.attention._checks import vary_like

# Chunks whose outputs the accelerators' schedule forms at once (``lax.map``'s batch; no loop
# when the sequence has no more).
CHUNKS_PER_STEP = 16


def fused_chunk_scan(platform: str) -> bool:
    """Whether the chunk passes run as one scan over the chunks that carries the state (a CPU:
    forming every chunk's summary first, then the states, then the outputs cost 1.4-2x the
    time at T = 1k-4k), rather than batched summaries, a scan over them only and batched
    outputs (accelerators). The per-chunk computation is the same."""
    return platform == "cpu"


def chunk_states(
    summaries: jax.Array, decays: jax.Array, initial: jax.Array, *, reverse: bool = False
) -> tuple[jax.Array, jax.Array]:
    """The linear recurrence over chunks, H_{c+1} = decays_c H_c + summaries_c, by a scan over
    the chunk summaries only (reversed time with ``reverse``: H_{c-1} from H_c).

    Args:
      summaries: ``(n, ..., m, p)``, one per chunk.
      decays: ``(n, ..., m)`` per-feature or ``(n, ..., 1)`` per-chunk factors <= 1 (a change
        of reference).
      initial: ``(..., m, p)``, the state before the first chunk (after the last with
        ``reverse``).

    Returns:
      ``(states, final)``: the state before each chunk's summary enters ``(n, m, p)``, and the
      state after all of them ``(m, p)``.
    """

    def step(state, inputs):
        summary, decay = inputs
        return decay[..., None] * state + summary, state

    initial = vary_like(initial, summaries, decays)
    final, states = jax.lax.scan(step, initial, (summaries, decays), reverse=reverse)
    return states, final


def map_chunks(function, *chunks):
    """``function`` of one chunk's arrays mapped over the leading (chunk) axis of ``chunks``,
    ``CHUNKS_PER_STEP`` chunks at a time (no loop when that is all of them)."""
    if chunks[0].shape[0] <= CHUNKS_PER_STEP:
        return jax.vmap(function)(*chunks)
    return jax.lax.map(lambda args: function(*args), chunks, batch_size=CHUNKS_PER_STEP)
