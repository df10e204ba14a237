"""FAVOR attention across ``rfjax.attention``: exactness against quadratic forms, the stabiliser,
masks, dtypes and transformations, gradients, and the statistics of the softmax approximation.
Each module's own tests (decoding, the prefix op, causality, ...) are in the file named for it."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, projections
from tests.support.favor_inputs import (
    BATCH,
    CHUNK,
    HEAD_DIM,
    HEADS,
    LENGTH,
    NUM_FEATURES,
    VALUE_DIM,
    float32_tolerance,
    make_inputs,
    reference_for,
    shared_projection,
)
from tests.support.primitives import equations

# ----------------------------------------------------------------- exactness


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["positive", "positive_antithetic", "relu"])
def test_matches_quadratic_linear_attention(name, causal):
    query, key, value = make_inputs(1, scale=1.0)
    projection = shared_projection()
    out = attention.favor_attention(
        query, key, value, projection, feature_map=name, causal=causal, chunk_size=CHUNK
    )
    expected = reference_for(name, query, key, value, projection.matrix(), causal=causal)
    assert out.shape == (BATCH, LENGTH, HEADS, VALUE_DIM)
    np.testing.assert_allclose(
        out, expected, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )


# ----------------------------------------------------------------- causality and stabiliser


def test_stabiliser_keeps_large_inputs_exact():
    # |q'| ~ 14: the log-features l = W q' - |q'|^2 / 2 - log(m) / 2 sit near -70, so the
    # unstabilised float32 products exp(l(q) + l(k)) ~ e^-140 underflow (the smallest float32 is
    # ~e^-103) and the output collapses; the stabilised one reproduces the float64 reference.
    query, key, value = make_inputs(8, scale=7.0)
    projection = shared_projection()
    expected = reference_for("positive", query, key, value, projection.matrix(), causal=True)
    assert np.all(np.isfinite(expected))
    out = attention.favor_attention(query, key, value, projection, causal=True, chunk_size=CHUNK)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-4 * np.max(np.abs(value)))
    raw = attention.favor_attention(query, key, value, projection, causal=True, stabilize=False)
    assert np.linalg.norm(raw - expected) > 0.5 * np.linalg.norm(expected)


# ----------------------------------------------------------------- masks


@pytest.mark.parametrize("causal", [False, True])
def test_padding_mask_equals_truncated_sequence(causal):
    query, key, value = make_inputs(9)
    lengths = jnp.array([LENGTH, 15])
    mask = jnp.arange(LENGTH)[None, :] < lengths[:, None]
    # Padding holds garbage, including NaN: it must not reach the output.
    pad = ~mask[:, :, None, None]
    key = jnp.where(pad, jnp.nan, key)
    value = jnp.where(pad, 1e30, value)
    projection = shared_projection()
    out = attention.favor_attention(
        query, key, value, projection, causal=causal, mask=mask, chunk_size=CHUNK
    )
    assert np.all(np.isfinite(out))
    b, n = 1, int(lengths[1])
    truncated = attention.favor_attention(
        query[b : b + 1, : n if causal else None],
        key[b : b + 1, :n],
        value[b : b + 1, :n],
        projection,
        causal=causal,
        chunk_size=CHUNK,
    )
    rows = slice(None, n) if causal else slice(None)
    np.testing.assert_allclose(
        out[b : b + 1, rows],
        truncated,
        rtol=0,
        atol=float32_tolerance(NUM_FEATURES + LENGTH, value[b, :n]),
    )
    if not causal:
        return
    # Gradients stay finite with NaN padding.
    grads = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(
                attention.favor_attention(q, k, v, projection, causal=causal, mask=mask) ** 2
            ),
            argnums=(0, 1, 2),
        )
    )(query, key, value)
    assert all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("name", ["positive", "relu"])  # one key shift per feature, per key
def test_fully_masked_rows_are_zero(name):
    # Sequence 0's first 5 keys masked, sequence 1's all; chunks of 8. With one key shift per
    # key (relu), the state before the first chunk is zeros relative to the first row's
    # running maximum, here the floor: relative to 0, its rows read it as exp(0 - floor) * 0,
    # NaN.
    query, key, value = make_inputs(10)
    mask = jnp.zeros((BATCH, LENGTH), bool).at[0, 5:].set(True)
    for causal in (False, True):
        out = attention.favor_attention(
            query,
            key,
            value,
            shared_projection(),
            feature_map=name,
            causal=causal,
            mask=mask,
            chunk_size=CHUNK,
        )
        assert np.all(np.asarray(out[1]) == 0)
        if causal:
            assert np.all(np.asarray(out[0, :5]) == 0)
            assert np.all(np.isfinite(out))
    # Gradients stay finite: the rows without keys get the floored normaliser's cotangent
    # G / eps (about 1e38), which must never meet a later key's zero weight as a product (it
    # did in the chunk-parallel op's first version: NaN for the keys after them).
    cotangent = jax.random.normal(jax.random.key(11), value.shape)

    def loss(query, key, value):
        out = attention.favor_attention(
            query, key, value, shared_projection(), feature_map=name, causal=True, mask=mask
        )
        return jnp.sum(out * cotangent)

    for grad in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(query, key, value):
        assert np.all(np.isfinite(np.asarray(grad)))


# ----------------------------------------------------------------- dtypes, transformations


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs(dtype):
    """bfloat16 and float16 inputs, scale 2 (|q'|, |k'| ~ 2.8). Float16's range of ratios
    (e^11) is too narrow for the causal op's tame keys (``_log_chunk.factored_bound``: -inf),
    whose factors exp(lb_j - r) reach e^30 here: every key is formed by blocks, relative to its
    block's maximum (taking float32's bound gave inf factors and NaN rows)."""
    query, key, value = make_inputs(12, scale=2.0)
    projection = shared_projection()
    low = [x.astype(dtype) for x in (query, key, value)]
    unit = float(jnp.finfo(dtype).eps) / 2  # unit roundoff: 2^-8 (bfloat16), 2^-11 (float16)
    for causal in (False, True):
        out = attention.favor_attention(*low, projection, causal=causal, chunk_size=CHUNK)
        assert out.dtype == dtype
        same = attention.favor_attention(
            *[x.astype(jnp.float32) for x in low], projection, causal=causal, chunk_size=CHUNK
        )
        if causal:
            # The causal products take operands in the inputs' dtype (the factors in [0, 1] and
            # the values, unit roundoff u), accumulated in float32: a term w_tj v_j carries
            # at most 3u (two factors and the value), the normaliser's terms 2u, so
            # |out_t - same_t| <= 5u max_j |v_j|, plus the output's rounding u |out_t|.
            tolerance = 5 * unit * np.abs(np.asarray(low[2], np.float32)).max(axis=1)
            error = np.abs(np.asarray(out, np.float32) - same) - unit * np.abs(same)
            assert np.all(error <= tolerance[:, None]), (error / tolerance[:, None]).max()
        else:
            # Accumulation and products in float32: on the same (rounded) inputs, float32
            # then rounded to the inputs' dtype agrees to one ulp (2u relative).
            np.testing.assert_allclose(
                np.asarray(out, np.float32), same, rtol=2 * unit, atol=2 * unit * 1e-3
            )
        # Against unrounded float32 inputs: rounding q, k (u relative) moves the scores
        # q.k/sqrt(H) by ~2u relative, the output by about as much, plus the output rounding
        # u: the relative Frobenius error is below 4u (1.0-1.3u measured).
        full = attention.favor_attention(query, key, value, projection, causal=causal)
        error = np.linalg.norm(np.asarray(out, np.float32) - full) / np.linalg.norm(full)
        assert error < 4 * unit, (error, unit)


def test_causal_products_of_bfloat16_inputs_take_bfloat16_operands_into_float32():
    """The causal op's products (forward and backward) take the inputs' bfloat16 operands,
    accumulated in float32 (``_log_chunk.dot``): in the traced program, the chunk's products
    and states' products are bfloat16 x bfloat16 with a float32 result, and no product of
    bfloat16 operands accumulates in bfloat16. (Float32 operands give more accurate values,
    so the tests of values cannot see them: the accelerators' fast path would be lost.)"""
    query, key, value = (x.astype(jnp.bfloat16) for x in make_inputs(12))
    projection = shared_projection()

    def loss(q, k, v):
        out = attention.favor_attention(q, k, v, projection, causal=True, chunk_size=CHUNK)
        return jnp.sum(out.astype(jnp.float32))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(query, key, value).jaxpr
    products = [e for e in equations(jaxpr) if e.primitive.name == "dot_general"]
    low = [e for e in products if {v.aval.dtype for v in e.invars} == {jnp.dtype(jnp.bfloat16)}]
    assert len(low) >= 8, len(low)  # forward: tame keys, state; backward: more
    assert {e.params["preferred_element_type"] for e in low} == {jnp.dtype(jnp.float32)}


def test_jit_and_vmap():
    query, key, value = make_inputs(13)
    run = functools.partial(attention.favor_attention, causal=True, chunk_size=CHUNK)
    # vmap jointly over an extra leading axis of the inputs (e.g. ensemble members) and over
    # projection draws, under jit; compare with separate calls.
    keys = jax.random.split(jax.random.key(14), 2)
    draws = [projections.gaussian(k, HEAD_DIM, NUM_FEATURES) for k in keys]
    stacked_draws = jax.vmap(lambda k: projections.gaussian(k, HEAD_DIM, NUM_FEATURES))(keys)
    stacked = [jnp.stack([x, 2 * x]) for x in (query, key, value)]
    batched = jax.jit(jax.vmap(run))(*stacked, stacked_draws)
    tolerance = float32_tolerance(NUM_FEATURES + LENGTH, 2 * value)
    for i in range(2):
        expected = run(*[x[i] for x in stacked], draws[i])
        np.testing.assert_allclose(batched[i], expected, rtol=0, atol=tolerance)
    # Unbatched TNH inputs.
    single = attention.favor_attention(query[0], key[0], value[0], draws[0])
    batch = attention.favor_attention(query[:1], key[:1], value[:1], draws[0])
    np.testing.assert_allclose(single, batch[0], rtol=0, atol=tolerance)


# ----------------------------------------------------------------- gradients


def test_attention_gradients_float64():
    # Gradients of the full causal attention (custom VJP, stabilised, masked) equal those of
    # the explicit quadratic form A @ V with the same features.
    with jax.enable_x64(True):
        query, key, value = make_inputs(17, scale=1.0, dtype=jnp.float64)
        projection = projections.gaussian(jax.random.key(18), HEAD_DIM, 8, dtype=jnp.float64)
        mask = jnp.ones((BATCH, LENGTH), bool).at[1, 4].set(False)

        def favor(q, k, v):
            return attention.favor_attention(
                q, k, v, projection, causal=True, mask=mask, chunk_size=5
            )

        def quadratic(q, k, v):
            a = attention.favor_attention_weights(q, k, projection, causal=True, mask=mask)
            return jnp.einsum("bnts,bsnh->btnh", a, v)

        cotangent = jax.random.normal(jax.random.key(19), (BATCH, LENGTH, HEADS, VALUE_DIM))

        @functools.partial(jax.jit, static_argnums=0)  # one program each
        def pullback(function, query, key, value, cotangent):
            return jax.vjp(function, query, key, value)[1](cotangent)

        ours = pullback(favor, query, key, value, cotangent)
        theirs = pullback(quadratic, query, key, value, cotangent)
        for x, y in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("causal", [False, True])
def test_a_float64_projection_computes_in_float64(causal):
    """float32 inputs with a float64 projection (x64 on): computed in float64 and returned in
    the inputs' dtype, for maps with and without a log-space form (a scan carry's dtype
    error in every bidirectional call and the causal non-exponential maps before)."""
    with jax.enable_x64(True):
        query, key, value = make_inputs(20, scale=1.0, dtype=jnp.float32)
        wide = tuple(x.astype(jnp.float64) for x in (query, key, value))
        projection = projections.gaussian(jax.random.key(21), HEAD_DIM, 8, dtype=jnp.float64)
        for name in ("positive", "relu"):
            out = attention.favor_attention(
                query, key, value, projection, causal=causal, feature_map=name
            )
            assert out.dtype == jnp.float32
            expected = attention.favor_attention(*wide, projection, causal=causal, feature_map=name)
            np.testing.assert_allclose(out, expected.astype(jnp.float32), rtol=0, atol=0)


# ----------------------------------------------------------------- statistics


def test_converges_to_softmax_attention_like_inverse_sqrt_m():
    # Relative error |O_m - O| / |O| against exact softmax attention, averaged over K i.i.d.
    # draws at m = 64, 256, 1024. For i.i.d. features the error is ~ c / sqrt(m), so each ratio
    # err(4m) / err(m) should be 1/2; tolerance 4 standard errors of the ratio (delta method,
    # independent draws). The ratio estimator's O(1/m) bias shifts the expected ratios to about
    # 0.511 and 0.506 here (measured with 2000 draws), far inside 4 SE (~0.09 with K = 32).
    num_draws, head_dim, length = 32, 16, 32
    kq, kk, kv = jax.random.split(jax.random.key(20), 3)
    # Moderate norms as in trained Performers: |q H^{-1/4}| ~ 0.7.
    query = 0.35 * jax.random.normal(kq, (1, length, 1, head_dim))
    key = 0.35 * jax.random.normal(kk, (1, length, 1, head_dim))
    value = jax.random.normal(kv, (1, length, 1, head_dim))
    exact = attention.softmax_attention(query, key, value)

    def relative_error(draw_key, m):
        projection = projections.gaussian(draw_key, head_dim, m)
        out = attention.favor_attention(query, key, value, projection)
        return jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)

    means, errors = [], []
    for i, m in enumerate((64, 256, 1024)):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(21), i), num_draws)
        errors_of = jax.jit(jax.vmap(functools.partial(relative_error, m=m)))
        e = np.asarray(errors_of(keys), np.float64)
        means.append(e.mean())
        errors.append(e.std(ddof=1) / math.sqrt(num_draws))
    for i in range(2):
        ratio = means[i + 1] / means[i]
        se = ratio * math.hypot(errors[i] / means[i], errors[i + 1] / means[i + 1])
        assert abs(ratio - 0.5) <= 4 * se, (ratio, se)
    # And the error is small in absolute terms at m = 1024 (c / sqrt(m) with c from m = 64).
    assert means[2] < means[0] / 2


def test_simplex_beats_orthogonal_beats_iid():
    # Squared Frobenius error of the attention matrix against exact softmax weights, averaged
    # over K independent draws per coupling on the same inputs (moderate norms, m = H, one
    # block). SimRF < ORF < IID (SimRF Sec. 5.4) with every difference above 4 standard errors.
    num_draws, head_dim, length = 1000, 16, 32
    kq, kk = jax.random.split(jax.random.key(22), 2)
    query = 0.35 * jax.random.normal(kq, (1, length, 1, head_dim))
    key = 0.35 * jax.random.normal(kk, (1, length, 1, head_dim))
    logits = jnp.einsum("btnh,bsnh->bnts", query, key) / math.sqrt(head_dim)
    exact = jax.nn.softmax(logits, axis=-1)

    @functools.partial(jax.jit, static_argnums=1)  # one program per coupling
    def squared_errors(index, coupling):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(23), index), num_draws)
        draws = jax.vmap(lambda k: projections.get(coupling)(k, head_dim, head_dim))(keys)
        weights = jax.vmap(lambda w: attention.favor_attention_weights(query, key, w))(draws)
        return jnp.sum((weights - exact) ** 2, axis=(1, 2, 3, 4))

    def mean_and_se(index, coupling):
        e = np.asarray(squared_errors(index, coupling), np.float64)
        return e.mean(), e.std(ddof=1) / math.sqrt(num_draws)

    iid, orf, simrf = (
        mean_and_se(i, c) for i, c in enumerate(("gaussian", "orthogonal", "simplex"))
    )
    for worse, better in ((iid, orf), (orf, simrf)):
        assert worse[0] - better[0] > 4 * math.hypot(worse[1], better[1]), (worse, better)
