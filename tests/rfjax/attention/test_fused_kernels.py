"""Tests of ``rfjax.attention._fused_kernels`` that run as plain JAX: the in-kernel pieces of the
causal block (the mask, the block weights exp(la_ti + lb_ji - M_t) for j <= t and their row
shift M_t) against direct forms. The kernels themselves are checked against the XLA form in
test_fused.py (interpret mode on CPU)."""

import jax.numpy as jnp
import numpy as np

from rfjax.attention import _fused_kernels


def test_causal_block_weights_are_shifted_by_the_largest_term_of_each_row():
    rng = np.random.default_rng(0)
    block, m = 4, 3
    la = rng.standard_normal((block, m)).astype(np.float32)
    lb = rng.standard_normal((block, m)).astype(np.float32)
    earlier = rng.standard_normal((1, m)).astype(np.float32)  # E_i: the earlier blocks' logs
    shift = _fused_kernels._row_shift(jnp.asarray(la), jnp.asarray(lb), jnp.asarray(earlier))
    weights = _fused_kernels._block_weights(jnp.asarray(la), jnp.asarray(lb), shift)
    for t in range(block):
        terms = la[t][None, :] + lb[: t + 1]  # j <= t
        expected_shift = max(terms.max(), (la[t] + earlier[0]).max())
        np.testing.assert_allclose(shift[t, 0], expected_shift, rtol=1e-6)
        np.testing.assert_allclose(weights[t, : t + 1], np.exp(terms - expected_shift), rtol=1e-5)
        np.testing.assert_array_equal(weights[t, t + 1 :], 0.0)  # the future is masked
    assert float(jnp.max(weights)) <= 1.0
    mask = np.asarray(_fused_kernels._causal_mask(block))[..., 0]
    np.testing.assert_array_equal(mask, np.tril(np.ones((block, block), bool)))
