"""Tests of ``rfjax.attention._causal``: causal FAVOR attention ignores the future, at any chunk
size and with per-head projections, and its temporaries stay under twice the features."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, projections
from tests.support.favor_inputs import (
    CHUNK,
    HEAD_DIM,
    HEADS,
    LENGTH,
    NUM_FEATURES,
    float32_tolerance,
    make_inputs,
    per_head_projection,
    reference_for,
    shared_projection,
)


@pytest.mark.parametrize("chunk_size", [1, 5, LENGTH, 100])
def test_causal_any_chunk_size_and_per_head_projection(chunk_size):
    query, key, value = make_inputs(2, scale=1.0)
    projection = per_head_projection()
    weights = projection.stacked.matrix()
    assert weights.shape == (HEADS, NUM_FEATURES, HEAD_DIM)
    out = attention.favor_attention(
        query, key, value, projection, causal=True, chunk_size=chunk_size
    )
    expected = reference_for("positive", query, key, value, weights, causal=True)
    np.testing.assert_allclose(
        out, expected, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )


def test_future_perturbation_leaves_past_bit_identical():
    # Perturb every query, key and value after position t0 (inside the second chunk, so the
    # chunk-local quadratic form and the running maximum are both exercised) with large keys
    # that raise the running key maximum: outputs at positions <= t0 must not change at all.
    query, key, value = make_inputs(6, scale=1.0)
    t0 = 12
    noise = make_inputs(7, scale=3.0)
    later = (jnp.arange(LENGTH) > t0)[None, :, None, None]
    perturbed = [
        jnp.where(later, x + 10.0 * n, x) for x, n in zip((query, key, value), noise, strict=True)
    ]
    for projection in (shared_projection(), per_head_projection()):
        for name in ("positive", "relu"):
            run = functools.partial(
                attention.favor_attention,
                feature_map=name,
                causal=True,
                chunk_size=CHUNK,
            )
            before = np.asarray(run(query, key, value, projection))
            after = np.asarray(run(*perturbed, projection))
            np.testing.assert_array_equal(before[:, : t0 + 1], after[:, : t0 + 1])
            assert not np.array_equal(before[:, t0 + 1 :], after[:, t0 + 1 :])


def test_forward_and_backward_temporaries_stay_under_twice_the_features():
    """XLA's temporaries of the jitted causal forward + backward at T = 16,384 (4 heads of 64,
    m = 128, positive features, chunk 64) stay under 2x one (B, T, N, m) float32 feature
    tensor, issue 42's bound (there at T = 64k). The op keeps about 2 sqrt(T / C) chunk
    states per head, writes outputs and cotangents in the rows' layout and scales the rows
    chunk by chunk; storing every chunk's state and copying the rows, outputs and cotangents
    heads-first took 3.6x (the test fails there)."""
    length = 16_384
    shape = jax.ShapeDtypeStruct((1, length, 4, 64), jnp.float32)
    projection = projections.orthogonal(jax.random.key(0), 64, 128)

    def loss(q, k, v):
        return jnp.sum(attention.favor_attention(q, k, v, projection, causal=True, chunk_size=64))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    features = length * 4 * 128 * 4
    assert compiled.memory_analysis().temp_size_in_bytes <= 2 * features
