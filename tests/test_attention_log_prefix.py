"""The per-feature causal prefix op (``_log_prefix.causal_log_prefix``) against its float64
quadratic form, values and gradients, at log-features that span far more than float32's range,
and its causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention._log_prefix import (
    causal_log_prefix,
    causal_log_prefix_and_state,
    causal_log_prefix_quadratic,
    log_outer_sum,
)

LENGTH, WIDTH, VALUES = 13, 5, 3


def operands(key=0):
    """(la, lb, v, g) float64: log-features with a spread of ~300 (e^300 overflows float32;
    keys offset by -500, as at |k'| ~ 32), values and a cotangent."""
    k = jax.random.split(jax.random.key(key), 4)
    with jax.enable_x64(True):
        la = 100.0 * jax.random.normal(k[0], (LENGTH, WIDTH), jnp.float64)
        lb = 100.0 * jax.random.normal(k[1], (LENGTH, WIDTH), jnp.float64) - 500.0
        v = jax.random.normal(k[2], (LENGTH, VALUES), jnp.float64)
        g = jax.random.normal(k[3], (LENGTH, VALUES), jnp.float64)
    return la, lb, v, g


@pytest.mark.parametrize("chunk", [1, 4, 64])  # 64: one chunk, clipped to T
def test_matches_quadratic_form_in_float64_values_and_gradients(chunk):
    la, lb, v, g = operands()
    with jax.enable_x64(True):
        out, shift = causal_log_prefix(la, lb, v, chunk)
        expected = causal_log_prefix_quadratic(la, lb, v, shift)
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())

        def loss(op):
            return lambda *x: jnp.sum(op(*x) * g)

        grads = jax.grad(loss(lambda *x: causal_log_prefix(*x, chunk)[0]), (0, 1, 2))(la, lb, v)
        fixed = jax.grad(loss(lambda *x: causal_log_prefix_quadratic(*x, shift)), (0, 1, 2))(
            la, lb, v
        )
        for got, want in zip(grads, fixed, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_largest_term_of_every_row_is_one_in_float32():
    """M_t is the row's largest exponent: the ones column sums to >= 1 (no row underflows) and
    every term <= 1 (nothing overflows), though the terms span e^-1000..e^0; float32 values
    match float64 to the rounding of exponents of size ~800."""
    la, lb, v, _ = operands(1)
    ones = np.concatenate([np.asarray(v), np.ones((LENGTH, 1))], axis=-1)
    out, shift = causal_log_prefix(*(jnp.asarray(x, jnp.float32) for x in (la, lb, ones)), 4)
    assert np.all(np.asarray(out[:, -1]) >= 1.0)
    assert np.all(np.asarray(out[:, -1]) <= np.arange(1, LENGTH + 1) * WIDTH)
    with jax.enable_x64(True):
        expected = causal_log_prefix_quadratic(la, lb, ones, jnp.asarray(shift, jnp.float64))
    # Each exponent la + lb - M (|.| <= ~1000) is rounded with error ~4 eps32 * 1000 = 5e-4.
    tolerance = 4 * float(np.finfo(np.float32).eps) * 1000 * np.abs(expected).max()
    np.testing.assert_allclose(out, expected, rtol=0, atol=tolerance)


def test_later_positions_cannot_reach_earlier_rows():
    """Rows t < 7 are bit-identical, and the gradients finite, whatever positions >= 7 hold
    (here key log-features of 3e38, whose sums with earlier rows' la would overflow to inf)."""
    la, lb, v, g = (jnp.asarray(x, jnp.float32) for x in operands(2))
    later = jnp.arange(LENGTH)[:, None] >= 7
    wild_la, wild_lb = jnp.where(later, la + 1e3, la), jnp.where(later, 3e38, lb)
    wild_v = jnp.where(later, 1e30, v)
    out, shift = causal_log_prefix(la, lb, v, 4)
    wild_out, wild_shift = causal_log_prefix(wild_la, wild_lb, wild_v, 4)
    np.testing.assert_array_equal(wild_out[:7], out[:7])
    np.testing.assert_array_equal(wild_shift[:7], shift[:7])

    def loss(*x):
        return jnp.sum(causal_log_prefix(*x, 4)[0][:7] * g[:7])

    for grad in jax.grad(loss, (0, 1, 2))(wild_la, wild_lb, wild_v):
        assert np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.parametrize("chunk", [3, 20, 64])  # 20: two blocks of 16, T = 13 padded
def test_blocked_state_sums_match_their_direct_forms_values_and_gradients(chunk):
    """The pieces of sequence parallelism's VJP (issue 32): ``log_outer_sum`` (a state or an
    initial state's cotangent, block by block) and ``causal_log_prefix_and_state`` (the prefix
    and the keys' own state in one scan) against their direct float64 forms."""
    la, lb, v, g = operands(3)
    with jax.enable_x64(True):
        row_shift = jnp.max(la, axis=1) + 7.0
        feature_shift = jnp.max(lb, axis=0) - 3.0  # exponents la + c - M <= 0 for these
        own_shift = jnp.max(lb, axis=0)

        def direct(x, y, rows, features):
            return jnp.exp(x + features[None, :] - rows[:, None]).T @ y

        got = log_outer_sum(la, g, row_shift, feature_shift, chunk)
        want = direct(la, g, row_shift, feature_shift)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
        initial = (jnp.asarray(np.ones((WIDTH, VALUES))), jnp.max(lb, axis=0) - 1.0)

        def fused(la, lb, v):
            out, _, state = causal_log_prefix_and_state(la, lb, v, chunk, initial, own_shift)
            return out, state

        def separate(la, lb, v):
            out, _ = causal_log_prefix(la, lb, v, chunk, initial)
            return out, direct(lb, v, jnp.zeros(LENGTH), -own_shift)

        state_cotangent = jnp.asarray(np.arange(WIDTH * VALUES).reshape(WIDTH, VALUES) / 7.0)
        for got, want in zip(
            jax.vjp(fused, la, lb, v)[1]((g, state_cotangent)),
            jax.vjp(separate, la, lb, v)[1]((g, state_cotangent)),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
        np.testing.assert_allclose(fused(la, lb, v)[1], separate(la, lb, v)[1], rtol=1e-12)
