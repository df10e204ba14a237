"""Tests of ``rfjax.attention._prefix``: the chunked causal prefix and its custom VJP (gradients,
bounded memory)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rfjax.attention import _chunks, _prefix
from tests.support.favor_inputs import float32_tolerance, prefix_inputs


@pytest.mark.parametrize("schedule", ["fused_scan", "batched"])
def test_custom_vjp_gradients(schedule, monkeypatch):
    # float64; chunk 3 pads T = 11 to 12 and carries state over 4 chunks, chunk 11 is one chunk.
    # Both schedules of the chunk algorithm run on this CPU (_chunks: the accelerators' batched
    # passes with 2 chunks a step, so the grouped map's remainder runs too).
    if schedule == "batched":
        monkeypatch.setattr(_chunks, "fused_chunk_scan", lambda platform: False)
        monkeypatch.setattr(_chunks, "CHUNKS_PER_STEP", 2)
    with jax.enable_x64(True):
        a, b, v, alpha, beta = prefix_inputs(15)
        cotangent = jax.random.normal(jax.random.key(16), (a.shape[0], v.shape[1]))
        quadratic = jax.jit(lambda a, b, v: _prefix.causal_prefix_quadratic(a, b, v, alpha, beta))
        for chunk in (3, 11):
            custom = jax.jit(
                lambda a, b, v, c=chunk: _prefix.causal_prefix(a, b, v, alpha, beta, c)
            )
            plain = jax.jit(
                lambda a, b, v, c=chunk: _prefix.causal_prefix_scan(a, b, v, alpha, beta, c)
            )
            np.testing.assert_allclose(custom(a, b, v), quadratic(a, b, v), rtol=1e-12)
            check_grads(custom, (a, b, v), order=1, modes=["rev"])
            ours = jax.vjp(custom, a, b, v)[1](cotangent)
            for reference in (plain, quadratic):
                theirs = jax.vjp(reference, a, b, v)[1](cotangent)
                for x, y in zip(ours, theirs, strict=True):
                    np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("schedule", ["fused_scan", "batched"])
def test_an_initial_state_enters_relative_to_its_own_shift(schedule, monkeypatch):
    """The state of keys before position 0, S_0 relative to c_0 < beta_0 (a sequence-parallel
    shard's earlier devices): Y_t gains (a_t . S_0) exp(c_0 - beta_t), values and cotangents
    (S_0's included) as the dense sums', in both schedules. The batched one (accelerators)
    read S_0 relative to the first chunk's last beta instead of c_0 and no test saw it."""
    if schedule == "batched":
        monkeypatch.setattr(_chunks, "fused_chunk_scan", lambda platform: False)
        monkeypatch.setattr(_chunks, "CHUNKS_PER_STEP", 2)
    with jax.enable_x64(True):
        a, b, v, alpha, beta = prefix_inputs(17)
        state = jax.random.normal(jax.random.key(18), (a.shape[1], v.shape[1]), jnp.float64)
        shift = beta[0] - 2.0
        cotangent = jax.random.normal(jax.random.key(19), (a.shape[0], v.shape[1]))

        def dense(a, b, v, state):
            earlier = (a @ state) * jnp.exp(shift - beta)[:, None]
            return _prefix.causal_prefix_quadratic(a, b, v, alpha, beta) + earlier

        for chunk in (3, 11):
            custom = jax.jit(
                lambda a, b, v, s, c=chunk: _prefix.causal_prefix(
                    a, b, v, alpha, beta, c, (s, shift)
                )
            )
            np.testing.assert_allclose(custom(a, b, v, state), dense(a, b, v, state), rtol=1e-12)
            ours = jax.vjp(custom, a, b, v, state)[1](cotangent)
            theirs = jax.vjp(dense, a, b, v, state)[1](cotangent)
            for x, y in zip(ours, theirs, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def test_custom_vjp_memory_is_bounded():
    # The plain scan's backward stores one (m, p) state per chunk, O(T m p / C); the custom VJP
    # keeps only the O(T (m + p)) inputs. Compare XLA's temporary buffers (compilation only).
    length, width, value_width, chunk = 4096, 256, 64, 16
    a, b = (jnp.ones((length, width)) for _ in range(2))
    v = jnp.ones((length, value_width))
    alpha = beta = jnp.zeros((length,))

    def temp_bytes(op):
        loss = jax.grad(lambda a, b, v: jnp.sum(op(a, b, v, alpha, beta, chunk)), (0, 1, 2))
        return jax.jit(loss).lower(a, b, v).compile().memory_analysis().temp_size_in_bytes

    per_chunk_states = (length // chunk) * width * value_width * 4
    inputs = length * (width + value_width) * 4
    plain = temp_bytes(_prefix.causal_prefix_scan)
    custom = temp_bytes(_prefix.causal_prefix)
    assert plain >= per_chunk_states > inputs
    # The custom VJP saves (at least half of) the per-chunk states, and needs a few copies of
    # the inputs: the inputs, their time-reversed copies, cotangents and gradients.
    assert custom < plain - per_chunk_states / 2
    assert custom < 4 * inputs


def test_a_later_keys_large_log_scale_never_reaches_the_plain_scans_gradients():
    """A key whose log-scale jumps 200 above the running maximum (float32, chunk 11: one
    chunk, so earlier rows meet it in the masked C x C form): its exponent alpha_j - beta_t,
    j > t, is selected away before the exponential, so the plain scan's autodiff gradients
    stay finite (exp(200) = inf times their zero cotangent was NaN in da, db) and equal the
    custom VJP's."""
    with jax.enable_x64(True):
        a, b, v, alpha, _ = prefix_inputs(20)
    a, b, v = (jnp.asarray(x, jnp.float32) for x in (a, b, v))
    alpha = jnp.asarray(alpha, jnp.float32).at[6].add(200.0)
    beta = jax.lax.cummax(alpha)
    cotangent = jax.random.normal(jax.random.key(21), (a.shape[0], v.shape[1]))

    def pullback(op):
        return jax.jit(lambda *x: jax.vjp(lambda *y: op(*y, alpha, beta, 11), *x)[1](cotangent))

    plain = pullback(_prefix.causal_prefix_scan)(a, b, v)
    custom = pullback(_prefix.causal_prefix)(a, b, v)
    for x, y in zip(plain, custom, strict=True):
        assert np.all(np.isfinite(np.asarray(x)))
        # ~(T + m) float32 roundings of the largest entry.
        np.testing.assert_allclose(x, y, rtol=0, atol=float32_tolerance(15, y))
