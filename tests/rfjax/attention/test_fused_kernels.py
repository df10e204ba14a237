"""Tests of ``rfjax.attention._fused_kernels``: the in-kernel pieces of the causal block (the
mask, the block weights exp(la_ti + lb_ji - M_t) for j <= t and their row shift M_t) as plain
JAX against direct forms, and, in interpret mode, that the causal output kernel's tiles of
features add up to the whole. The kernels themselves are checked against the XLA form in
test_fused.py (interpret mode on CPU)."""

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


def test_the_causal_output_kernel_forms_its_diagonal_blocks_a_tile_of_features_at_a_time(
    monkeypatch,
):
    """Each block's pairs with its own keys (``_diagonal``) are formed ``FEATURE_TILE``
    features at a time (all m at once would not fit in a GPU's registers): 16 features in
    tiles of 8 give the numerators and denominators of one tile of 16, each row relative to
    its largest term, so its row shift too (interpret mode; a tile left out or counted twice
    changes them)."""
    q, k, v, mask, _ = operands(3, scale=2.0)
    projection = projections.orthogonal(jax.random.key(6), HEAD_DIM, NUM_FEATURES)
    form = _fused.kernel_form(projection, features.get("positive")())
    rows = (q[0, :, 0], k[0, :, 0], v[0, :, 0], mask[0])

    def sums():  # traced afresh: FEATURE_TILE is read when tracing
        return jax.jit(
            lambda w, b, *rows: _fused.fused_attention_sums(
                features.AffineLogForm(w, b, form.norm_weight),
                *rows,
                causal=True,
                backend=_fused.Backend(None),
            )
        )(form.weights, form.bias, *rows)

    assert NUM_FEATURES <= _fused_kernels.FEATURE_TILE
    whole = sums()
    monkeypatch.setattr(_fused_kernels, "FEATURE_TILE", 8)
    tiled = sums()
    for got, want in zip(tiled, whole, strict=True):
        assert_close(got, want)
