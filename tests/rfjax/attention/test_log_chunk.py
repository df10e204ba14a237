"""Tests of ``rfjax.attention._log_chunk``: one chunk's output and cotangents (its blocks' own
keys, its earlier blocks, the earlier chunks' state, the later queries' state) against the dense
sums they stand for, in float64; and ``dot``'s float32 accumulation of bfloat16 operands."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.attention._checks import log_floor
from rfjax.attention._log_chunk import (
    _keys,
    _row_shift,
    chunk_cotangents,
    chunk_factors,
    chunk_output,
    dot,
)

BLOCKS, BLOCK, FEATURES, VALUES = 3, 4, 5, 2


def operands():
    """One chunk of 3 blocks of 4 positions: log-features la, lb ``(s, b, m)`` spread over
    ~30 (e^30 is far outside float32's range of ratios but exact in float64), values, the
    earlier chunks' state relative to the chunk's start, the later queries' state relative to
    its end, and a cotangent."""
    k = jax.random.split(jax.random.key(0), 6)
    with jax.enable_x64(True):
        shape = (BLOCKS, BLOCK, FEATURES)
        la = 10.0 * jax.random.normal(k[0], shape, jnp.float64)
        lb = 10.0 * jax.random.normal(k[1], shape, jnp.float64) - 5.0
        v = jax.random.normal(k[2], (BLOCKS, BLOCK, VALUES), jnp.float64)
        start = 10.0 * jax.random.normal(k[3], (FEATURES,), jnp.float64)
        end = jnp.maximum(start, jnp.max(lb, axis=(0, 1)))
        state, later = (jax.random.normal(x, (FEATURES, VALUES), jnp.float64) for x in k[4:6])
        grad = jax.random.normal(k[5], (BLOCKS, BLOCK, VALUES), jnp.float64)
    return la, lb, v, start, end, state, later, grad


def dense_output(la, lb, v, start, state, row_shift):
    """Y_t = sum_{j <= t} sum_i e^(la_ti + lb_ji - M_t) v_j + sum_i e^(la_ti + C^s_i - M_t) S_i
    over the chunk's positions in order, as a (C, C, m) masked sum."""
    rows = BLOCKS * BLOCK
    la, lb, v = la.reshape(rows, -1), lb.reshape(rows, -1), v.reshape(rows, -1)
    shift = row_shift.reshape(rows)
    causal = jnp.tril(jnp.ones((rows, rows), bool))[:, :, None]
    pairs = la[:, None, :] + lb[None, :, :] - shift[:, None, None]
    weights = jnp.sum(jnp.exp(jnp.where(causal, pairs, -jnp.inf)), axis=-1)
    earlier = jnp.exp(la + start - shift[:, None]) @ state
    return (weights @ v + earlier).reshape(BLOCKS, BLOCK, -1)


def test_output_is_the_dense_sum_and_the_row_shift_its_largest_exponent():
    la, lb, v, start, _, state, _, _ = operands()
    with jax.enable_x64(True):

        @jax.jit  # one program
        def outputs(la, lb, v, start, state):
            chunk, row_shift = chunk_factors(la, lb, start)
            got = chunk_output(chunk, v, start, state, jnp.float64)
            return got, dense_output(la, lb, v, start, state, row_shift), row_shift

        got, want, row_shift = outputs(la, lb, v, start, state)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        # M_t: the largest of la_ti + lb_ji (j <= t in the chunk) and la_ti + C^s_i.
        flat_la, flat_lb = la.reshape(-1, FEATURES), lb.reshape(-1, FEATURES)
        for t in range(BLOCKS * BLOCK):
            own = np.max(flat_la[t] + flat_lb[: t + 1])
            # Keys of earlier blocks enter through the block starts, E >= their lb.
            assert row_shift.reshape(-1)[t] >= max(own, np.max(flat_la[t] + start))


def test_the_row_shift_is_its_pairs_largest_exponent_bit_for_bit():
    """M_t from the running maximum of the keys (b m values per block) is the maximum over the
    (b, b, m) pairs la_ti + lb_ji, j <= t, and la_ti + E_i exactly, in float32, with keys left
    out at the log floor (rounding is monotone: fl(a + max_j b_j) = max_j fl(a + b_j))."""
    rng = np.random.default_rng(3)
    shape = (BLOCKS, BLOCK, FEATURES)
    la = (30 * rng.standard_normal(shape)).astype(np.float32)
    lb = (30 * rng.standard_normal(shape)).astype(np.float32)
    lb[0, :2] = log_floor(jnp.float32)  # the first keys are left out
    start = np.full(FEATURES, log_floor(jnp.float32), np.float32)  # no earlier keys
    keys = _keys(jnp.asarray(lb), jnp.asarray(start))
    got = np.asarray(_row_shift(jnp.asarray(la), jnp.asarray(lb), keys))
    block_start = np.asarray(keys.block_start)
    for s in range(BLOCKS):
        for t in range(BLOCK):
            pairs = la[s, t][None, :] + lb[s, : t + 1]  # float32 sums, as the pairs' form
            earlier = la[s, t] + block_start[s]
            assert got[s, t] == max(pairs.max(), earlier.max()), (s, t)


def test_cotangents_are_the_derivatives_of_the_dense_sums():
    """dla, dlb, dv of sum(G * Y) + sum_j sum_i e^(lb_ji - C^e_i) (v_j . R_i): the output's
    pieces and the later queries' state R, with the row shifts held constant."""
    la, lb, v, start, end, state, later, grad = operands()
    with jax.enable_x64(True):

        @jax.jit  # one program
        def cotangents(la, lb, v):
            chunk, row_shift = chunk_factors(la, lb, start)
            got = chunk_cotangents(chunk, v, start, end, state, later, grad, jnp.float64)

            def loss(la, lb, v):
                out = dense_output(la, lb, v, start, state, row_shift)
                later_read = jnp.einsum("sbm,sbp,mp->", jnp.exp(lb - end), v, later)
                return jnp.sum(grad * out) + later_read

            return got, jax.grad(loss, argnums=(0, 1, 2))(la, lb, v)

        got, want = cotangents(la, lb, v)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11 * np.abs(b).max())


def test_dot_accumulates_bfloat16_operands_in_float32():
    """1 + 2^-7 (exact in bfloat16) summed 256 times is 258 in float32; bfloat16 partial sums
    (spacing 2 from 256 on) would lose the 2^-7 parts."""
    ones = jnp.ones((1, 256), jnp.float32)
    values = jnp.full((256, 1), 1 + 2.0**-7, jnp.float32)  # exact in bfloat16
    got = dot("ik,kj->ij", ones, values, jnp.bfloat16)
    assert got.dtype == jnp.float32
    assert float(got[0, 0]) == 256 * (1 + 2.0**-7)
