"""Tests of ``rfjax.attention._fused_kernels``: the in-kernel pieces of the causal block (the
mask, the block weights exp(la_ti + lb_ji - M_t) for j <= t and their row shift M_t) as plain
JAX against direct forms, and, in interpret mode, that the causal kernels' tiles of features
add up to the whole (values and gradients). The kernels themselves are checked against the XLA
form in test_fused.py (interpret mode on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import features, projections
from rfjax.attention import _fused, _fused_kernels
from tests.rfjax.attention.test_fused import (
    HEAD_DIM,
    NUM_FEATURES,
    assert_close,
    operands,
)
from tests.support.interpret_mode import INTERPRET_MODE


def test_causal_block_weights_are_shifted_by_the_largest_term_of_each_row():
    rng = np.random.default_rng(0)
    block, m = 4, 3
    la = rng.standard_normal((block, m)).astype(np.float32)
    lb = rng.standard_normal((block, m)).astype(np.float32)
    earlier = rng.standard_normal((1, m)).astype(np.float32)  # E_i: the earlier blocks' logs
    la, lb = jnp.asarray(la), jnp.asarray(lb)
    shift = _fused_kernels._row_shift(
        _fused_kernels._pair_maximum(la, lb), la, jnp.asarray(earlier)
    )
    weights = _fused_kernels._block_weights(la, lb, shift)
    for t in range(block):
        terms = la[t][None, :] + lb[: t + 1]  # j <= t
        expected_shift = max(terms.max(), (la[t] + earlier[0]).max())
        np.testing.assert_allclose(shift[t, 0], expected_shift, rtol=1e-6)
        np.testing.assert_allclose(weights[t, : t + 1], np.exp(terms - expected_shift), rtol=1e-5)
        np.testing.assert_array_equal(weights[t, t + 1 :], 0.0)  # the future is masked
    assert float(jnp.max(weights)) <= 1.0
    mask = np.asarray(_fused_kernels._causal_mask(block))[..., 0]
    np.testing.assert_array_equal(mask, np.tril(np.ones((block, block), bool)))


@INTERPRET_MODE
def test_the_causal_kernels_form_their_diagonal_blocks_a_tile_of_features_at_a_time(
    monkeypatch,
):
    """Each block's pairs with its own keys are formed a tile of features at a time (all m at
    once would not fit in a GPU's registers): ``FEATURE_TILE`` in the output kernel
    (``_diagonal``), ``COTANGENT_TILE`` in the cotangent kernel (``_diagonal_cotangents``,
    which places each tile's cotangents in their columns of the m features). 16 features in
    tiles of 8 give the numerators, denominators and gradients of one tile of 16, each row
    relative to its largest term (interpret mode; a tile left out, counted twice or placed in
    other columns changes them)."""
    q, k, v, mask, _ = operands(3, scale=2.0)
    projection = projections.orthogonal(jax.random.key(6), HEAD_DIM, NUM_FEATURES)
    form = _fused.kernel_form(projection, features.get("positive")())
    rows = (q[0, :, 0], k[0, :, 0], v[0, :, 0], mask[0])
    weights = jax.random.normal(jax.random.key(5), rows[2].shape)

    def loss(w, b, *rows):
        num, den = _fused.fused_attention_sums(
            features.AffineLogForm(w, b, form.norm_weight),
            *rows,
            causal=True,
            backend=_fused.Backend(None),
        )
        return jnp.sum(num * weights) + jnp.sum(jnp.sin(den)), (num, den)

    def sums_and_gradients():  # traced afresh: the tiles are read when tracing
        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        (_, sums), gradients = jax.jit(grad)(form.weights, form.bias, *rows)
        return [*sums, *gradients]

    assert min(_fused_kernels.FEATURE_TILE, _fused_kernels.COTANGENT_TILE) >= NUM_FEATURES
    whole = sums_and_gradients()
    monkeypatch.setattr(_fused_kernels, "FEATURE_TILE", 8)
    monkeypatch.setattr(_fused_kernels, "COTANGENT_TILE", 8)
    tiled = sums_and_gradients()
    for got, want in zip(tiled, whole, strict=True):
        assert_close(got, want)
