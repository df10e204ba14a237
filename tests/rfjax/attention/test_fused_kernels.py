"""Tests of ``rfjax.attention._fused_kernels``: the in-kernel pieces of the causal block (the
mask, the block weights exp(la_ti + lb_ji - M_t) for j <= t and their row shift M_t, their
factored form and the bound within which it is taken) as plain JAX against direct forms, and,
in interpret mode, that the causal kernels' tiles of features
add up to the whole (values and gradients). The kernels themselves are checked against the XLA
form in test_fused.py (interpret mode on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.attention import _fused, _fused_kernels, _kernel_settings
from rfjax.attention._log_chunk import factored_bound
from tests.rfjax.attention.test_fused import (
    EPS32,
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


def test_factored_weights_are_the_pairs_of_every_row_that_has_a_key():
    """Within the bound the factored weights exp(la + e - M) exp(lb - e)^T (``_factors``),
    selected for j <= t, are ``_block_weights`` summed over the features (each a product of
    two float32 exponentials: a few ulps), also where a later key of the block raises a
    feature's maximum by 40 (x up to 40) and where the first keys are left out (lb at the log
    floor: those rows' exponents are -inf, their weights 0, the pairs' are left-out keys',
    whose values are 0)."""
    rng = np.random.default_rng(1)
    block, m = 16, 24
    la = rng.standard_normal((block, m)).astype(np.float32)
    lb = rng.standard_normal((block, m)).astype(np.float32)
    lb[12, :4] += 40.0  # a later key far above the earlier ones in four features
    floor = _fused_kernels.log_floor(jnp.float32)
    lb[:3] = floor  # the block's first keys are left out, and no key comes before it
    la, lb = jnp.asarray(la), jnp.asarray(lb)
    start = jnp.full((1, m), floor, jnp.float32)
    shift = _fused_kernels._row_shift(_fused_kernels._pair_maximum(la, lb), la, start)
    exponent = _fused_kernels._query_exponent(la, jnp.max(lb, axis=0, keepdims=True), shift)
    query, key = _fused_kernels._factors(la, lb, shift)
    factored = _fused_kernels._causal_part(query @ key.T)
    pairs = jnp.sum(_fused_kernels._block_weights(la, lb, shift), axis=2)
    assert 35.0 < float(jnp.max(exponent)) <= factored_bound(m, 16, jnp.float32)
    assert np.all(np.asarray(exponent[:3]) == -np.inf)
    np.testing.assert_array_equal(factored[:3], 0.0)
    np.testing.assert_allclose(factored[3:], pairs[3:], rtol=16 * EPS32, atol=0)
    np.testing.assert_array_equal(np.triu(np.asarray(factored), 1), 0.0)  # the future


def test_the_factored_form_is_taken_only_within_its_bound(monkeypatch):
    """``_factored_or_pairs`` under ``diagonal_form="factored"``: the factored branch where
    the largest exponent is within ``factored_bound``; per pair above it, for a NaN, for
    float16 operands, and under ``diagonal_form="pairs"`` (the default)."""
    bound = factored_bound(4, 16, jnp.float32)
    factored = _kernel_settings.KernelSettings(diagonal_form="factored")
    monkeypatch.setattr(_kernel_settings, "IN_FORCE", factored)

    def taken(largest, dtype=jnp.float32):
        exponent = jnp.zeros((16, 4), jnp.float32).at[3, 2].set(largest)
        branch = _fused_kernels._factored_or_pairs(
            exponent, lambda: jnp.int32(1), lambda: jnp.int32(2), dtype
        )
        return {1: "factored", 2: "pairs"}[int(branch)]

    assert taken(bound) == "factored"
    assert taken(-np.inf) == "factored"  # rows without a key
    assert taken(np.nextafter(np.float32(bound), np.float32(np.inf))) == "pairs"
    assert taken(np.nan) == "pairs"
    assert taken(0.0, jnp.float16) == "pairs"
    monkeypatch.setattr(_kernel_settings, "IN_FORCE", _kernel_settings.KernelSettings())
    assert taken(0.0) == "pairs"


@pytest.mark.parametrize("diagonal_form", _kernel_settings.DIAGONAL_FORMS)
@INTERPRET_MODE
def test_the_causal_kernels_form_their_diagonal_blocks_a_tile_of_features_at_a_time(
    diagonal_form, monkeypatch
):
    """Each block's pairs with its own keys are formed a tile of features at a time (all m at
    once would not fit in a GPU's registers): ``FEATURE_TILE`` in the output kernel
    (``_diagonal``), ``COTANGENT_TILE`` in the cotangent kernel (``_diagonal_cotangents``,
    which places each tile's cotangents in their columns of the m features). 16 features in
    tiles of 8 give the numerators, denominators and gradients of one tile of 16, each row
    relative to its largest term (interpret mode; a tile left out, counted twice or placed in
    other columns changes them). Every form: per pair, as products of factors (these inputs
    are within ``factored_bound``), each tile's keys relative to its own maxima, and the chunk
    form's products (``PRODUCT_TILE`` in ``_tame_sums``, where its keys are tame).

    Tolerance: both sides are float32 sums of the same terms in different orders; recursive
    summation of n terms in two orders differs by at most about n eps of the terms' sum of
    magnitudes, and the longest sums here run over a chunk's keys and the features, n =
    ``CHUNK`` x m = 1,024 terms (relative to each output's largest entry: 1.2e-4). A tile left
    out, counted twice or placed in other columns changes the outputs by a sizeable fraction
    of that entry. (64 eps, the file's shared tolerance, was exceeded by dq on an AMD EPYC at
    XLA's optimisation level 0: 71 eps, where the gradient of one row cancels.)"""
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

    tiles = ("FEATURE_TILE", "COTANGENT_TILE", "PRODUCT_TILE")
    assert min(getattr(_fused_kernels, tile) for tile in tiles) >= NUM_FEATURES
    settings = _kernel_settings.KernelSettings(diagonal_form=diagonal_form)
    monkeypatch.setattr(_kernel_settings, "IN_FORCE", settings)
    whole = sums_and_gradients()
    for tile in tiles:
        monkeypatch.setattr(_fused_kernels, tile, 8)
    tiled = sums_and_gradients()
    for got, want in zip(tiled, whole, strict=True):
        assert_close(got, want, tolerance=_fused_kernels.CHUNK * NUM_FEATURES * EPS32)


def direct_attention(form, q, k, v, valid, causal):
    """The attention output of the affine map ``form`` written out: scores
    sum_i exp(l(q_t)_i + l(k_j)_i) over the keys that count (and j <= t if ``causal``),
    normalised per row (no shift: moderate norms only)."""
    scores = jnp.exp(form.log_features(q)) @ jnp.exp(form.log_features(k)).T
    allowed = valid[None, :] & (jnp.tril(jnp.ones(scores.shape, bool)) if causal else True)
    scores = jnp.where(allowed, scores, 0.0)
    return scores @ v / jnp.sum(scores, axis=1, keepdims=True)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@INTERPRET_MODE
def test_the_kernels_give_the_direct_outputs_and_gradients_of_every_parameter(causal):
    """``fused_attention_sums``' num / den and the gradients of the rows and of both of the
    affine map's parameters, W and a bias b that differs per feature (OPRF's, b_i = A |w_i|^2
    + ...: the other tests' maps have one b for all features, so a bias gradient dropped or a
    tile's bias read from other columns changed nothing there), against the direct form, over
    three chunks (150 rows, the last partial) whose keys grow along the sequence (every chunk's
    running maximum and state carried into the next: two chunks never rescale a summary), the
    first key counted. m = 40: tiles of 8 features. Tolerance: the file's (both sum the same
    non-negative terms in float32)."""
    length, m = 150, 40
    k = jax.random.split(jax.random.key(21), 6)
    growth = jnp.linspace(0.3, 1.2, length)[:, None]
    q = 0.8 * jax.random.normal(k[0], (length, HEAD_DIM))
    keys = growth * jax.random.normal(k[1], (length, HEAD_DIM))
    v = jax.random.normal(k[2], (length, 3))
    valid = (jax.random.uniform(k[3], (length,)) > 0.25).at[0].set(True)
    w = 0.5 * jax.random.normal(k[4], (m, HEAD_DIM))
    b = 0.5 * jax.random.normal(k[5], (m,))
    weights = jax.random.normal(jax.random.key(22), v.shape)

    def fused(form, q, k, v):
        num, den = _fused.fused_attention_sums(
            form, q, k, v, valid, causal=causal, backend=_fused.Backend(None)
        )
        return num / den[:, None]

    def direct(form, q, k, v):
        return direct_attention(form, q, k, v, valid, causal)

    def value_and_gradients(attend):
        def loss(w, b, q, k, v):
            out = attend(features.AffineLogForm(w, b, -0.5), q, k, v)
            return jnp.sum(out * weights), out

        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        (_, out), gradients = jax.jit(grad)(w, b, q, keys, v)
        return [out, *gradients]

    for got, want in zip(value_and_gradients(fused), value_and_gradients(direct), strict=True):
        assert_close(got, want)
