"""FAVOR attention: exactness against quadratic forms, causality, masks, decoding, dtypes,
gradients of the chunked custom VJP, and the statistics of the softmax approximation."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from rfjax import attention, features, projections
from rfjax.attention import _chunks, _prefix

BATCH, LENGTH, HEADS, HEAD_DIM, VALUE_DIM = 2, 24, 3, 16, 8
NUM_FEATURES = 32
CHUNK = 8  # LENGTH / CHUNK = 3 chunks
EPS32 = float(np.finfo(np.float32).eps)


def make_inputs(seed, *, scale=0.5, length=LENGTH, key_length=None, dtype=jnp.float32):
    """query, key, value (BTNH) from three independent keys (never q == k)."""
    key_length = length if key_length is None else key_length
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    query = scale * jax.random.normal(kq, (BATCH, length, HEADS, HEAD_DIM), dtype)
    key = scale * jax.random.normal(kk, (BATCH, key_length, HEADS, HEAD_DIM), dtype)
    value = jax.random.normal(kv, (BATCH, key_length, HEADS, VALUE_DIM), dtype)
    return query, key, value


@functools.cache
def shared_projection():
    return projections.gaussian(jax.random.key(100), HEAD_DIM, NUM_FEATURES)


@functools.cache
def per_head_projection():
    return attention.draw_projection(
        jax.random.key(101), HEAD_DIM, NUM_FEATURES, coupling="gaussian", num_heads=HEADS
    )


# ----------------------------------------------------------------- float64 NumPy references


def reference_features(name, x, weights):
    """Feature maps written out in float64 from W: x (..., H), W (m, H)."""
    x = np.asarray(x, np.float64) * HEAD_DIM**-0.25
    weights = np.asarray(weights, np.float64)
    projected = x @ weights.T
    m = weights.shape[0]
    if name == "positive":
        return np.exp(projected - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(m)
    if name == "positive_antithetic":
        both = np.concatenate([projected, -projected], -1)
        return np.exp(both - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(2 * m)
    if name == "relu":
        return (np.maximum(projected, 0) + 1e-3) / math.sqrt(m)
    raise ValueError(name)


def reference_linear_attention(phi_q, phi_k, value, *, causal, mask=None):
    """Quadratic-form linear attention per (b, n): phi_q (B,T,N,m), phi_k (B,S,N,m)."""
    scores = np.einsum("btnm,bsnm->bnts", phi_q, phi_k)
    allowed = np.ones(scores.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(scores.shape[-2:], bool))
    if mask is not None:
        allowed &= np.asarray(mask)[:, None, None, :]
    scores = np.where(allowed, scores, 0.0)
    den = scores.sum(-1, keepdims=True)
    weights = np.divide(scores, den, out=np.zeros_like(scores), where=den > 0)
    return np.einsum("bnts,bsnh->btnh", weights, np.asarray(value, np.float64))


def reference_for(name, query, key, value, weights, **kwargs):
    if weights.ndim == 2:
        phi_q = reference_features(name, query, weights)
        phi_k = reference_features(name, key, weights)
    else:  # per head: weights (N, m, H)
        phi_q = np.stack(
            [reference_features(name, query[:, :, n], weights[n]) for n in range(HEADS)], 2
        )
        phi_k = np.stack(
            [reference_features(name, key[:, :, n], weights[n]) for n in range(HEADS)], 2
        )
    return reference_linear_attention(phi_q, phi_k, value, **kwargs)


def float32_tolerance(num_terms, value):
    """Accumulated float32 rounding: ~num_terms unit roundoffs of the largest value."""
    return num_terms * EPS32 * float(np.max(np.abs(value)))


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


def test_asymmetric_feature_maps_and_weights():
    # A query map and a key map: here positive queries with ReLU keys, to check the roles.
    query, key, value = make_inputs(3, key_length=LENGTH + 5)
    projection = shared_projection()
    maps = features.FeatureMapPair(features.PositiveFeatureMap(), features.ReluFeatureMap())
    out = attention.favor_attention(query, key, value, projection, feature_map=maps)
    w = projection.matrix()
    phi_q = reference_features("positive", query, w)
    phi_k = reference_features("relu", key, w)
    expected = reference_linear_attention(phi_q, phi_k, value, causal=False)
    np.testing.assert_allclose(
        out, expected, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )
    # The explicit weights reproduce the output: A @ V.
    for causal in (False, True):
        q, k, v = make_inputs(4)
        a = attention.favor_attention_weights(q, k, projection, causal=causal)
        assert a.shape == (BATCH, HEADS, LENGTH, LENGTH)
        np.testing.assert_allclose(jnp.sum(a, -1), 1.0, atol=1e-6)
        if causal:
            assert np.all(np.triu(np.asarray(a), 1) == 0)
        out = attention.favor_attention(q, k, v, projection, causal=causal, chunk_size=CHUNK)
        np.testing.assert_allclose(
            out,
            jnp.einsum("bnts,bsnh->btnh", a, v),
            rtol=0,
            atol=float32_tolerance(NUM_FEATURES + LENGTH, v),
        )


def test_per_head_feature_map_parameters():
    # A PerHead map (here one sign projection per head) equals each head run on its own.
    query, key, value = make_inputs(27)
    projection = per_head_projection()
    template = features.AngularHybridFeatureMap(num_sign_features=2)
    keys = jax.random.split(jax.random.key(28), HEADS)
    maps = attention.PerHead(jax.vmap(lambda k: template.init(k, HEAD_DIM))(keys))
    run = functools.partial(attention.favor_attention, eps=1e-3)
    out = run(query, key, value, projection, feature_map=maps)
    for n in range(HEADS):
        head = slice(n, n + 1)
        single = run(
            query[:, :, head],
            key[:, :, head],
            value[:, :, head],
            projection.head(n),
            feature_map=maps.head(n),
        )
        np.testing.assert_allclose(out[:, :, head], single, rtol=1e-5, atol=1e-6)
    # Different heads' sign projections give different outputs than one shared map.
    shared = run(query, key, value, projection, feature_map=maps.head(0))
    assert not np.allclose(shared[:, :, 1:], out[:, :, 1:])


def test_softmax_attention_matches_jax():
    query, key, _ = make_inputs(5, scale=1.0)
    value = jax.random.normal(jax.random.key(26), key.shape)  # jax.nn needs H_v == H
    mask = jnp.arange(LENGTH)[None, :] < jnp.array([LENGTH, 17])[:, None]
    for causal in (False, True):
        ours = attention.softmax_attention(query, key, value, causal=causal, mask=mask)
        theirs = jax.nn.dot_product_attention(
            query, key, value, is_causal=causal, mask=mask[:, None, None, :]
        )
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


# ----------------------------------------------------------------- causality and stabiliser


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
    grads = jax.grad(
        lambda q, k, v: jnp.sum(
            attention.favor_attention(q, k, v, projection, causal=causal, mask=mask) ** 2
        ),
        argnums=(0, 1, 2),
    )(query, key, value)
    assert all(np.all(np.isfinite(g)) for g in grads)


def test_fully_masked_rows_are_zero():
    query, key, value = make_inputs(10)
    mask = jnp.zeros((BATCH, LENGTH), bool).at[0, 5:].set(True)
    for causal in (False, True):
        out = attention.favor_attention(
            query, key, value, shared_projection(), causal=causal, mask=mask
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
            query, key, value, shared_projection(), causal=True, mask=mask
        )
        return jnp.sum(out * cotangent)

    for grad in jax.grad(loss, argnums=(0, 1, 2))(query, key, value):
        assert np.all(np.isfinite(np.asarray(grad)))


# ----------------------------------------------------------------- decoding


@pytest.mark.parametrize("name", ["positive", "relu"])
def test_decode_matches_causal(name):
    query, key, value = make_inputs(11, scale=1.0)
    projection = per_head_projection()
    # Batch element 1 skips (masks) the keys of tokens 3 and 10.
    mask = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([3, 10])].set(False)
    full = attention.favor_attention(
        query, key, value, projection, feature_map=name, causal=True, mask=mask, chunk_size=CHUNK
    )
    state = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, feature_map=name)
    step = jax.jit(
        functools.partial(attention.favor_decode_step, feature_map=name),
    )
    outs = []
    for t in range(LENGTH):
        state, out = step(state, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
        outs.append(out)
    np.testing.assert_allclose(
        jnp.stack(outs, 1), full, rtol=0, atol=float32_tolerance(NUM_FEATURES + LENGTH, value)
    )


@pytest.mark.parametrize("name", ["positive", "relu"])  # one shift per feature, one per key
def test_prefill_gives_the_state_of_the_steps(name):
    # The prompt's output is causal FAVOR's; its state is that of a step per token (the same
    # shifts: maxima are exact), and steps after it equal causal FAVOR over the whole sequence.
    query, key, value = make_inputs(13, scale=1.0)
    projection = per_head_projection()
    mask = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([3, 17])].set(False)
    key = key.at[1, 3].set(jnp.nan)  # masked: reaches nothing
    prompt = 18  # not a whole number of chunks
    options = dict(feature_map=name, chunk_size=CHUNK)
    full = attention.favor_attention(
        query, key, value, projection, causal=True, mask=mask, **options
    )
    out, state = attention.favor_prefill(
        query[:, :prompt],
        key[:, :prompt],
        value[:, :prompt],
        projection,
        mask=mask[:, :prompt],
        **options,
    )
    np.testing.assert_array_equal(out, full[:, :prompt])
    step = jax.jit(functools.partial(attention.favor_decode_step, feature_map=name))
    stepped = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection, feature_map=name)
    for t in range(prompt):
        stepped, _ = step(stepped, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
    np.testing.assert_array_equal(state.log_offset, stepped.log_offset)
    for got, expected in zip(state[:2], stepped[:2], strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=float32_tolerance(LENGTH, got))
    outs = []
    for t in range(prompt, LENGTH):
        state, out_t = step(state, query[:, t], key[:, t], value[:, t], projection, mask=mask[:, t])
        outs.append(out_t)
    np.testing.assert_allclose(
        jnp.stack(outs, 1),
        full[:, prompt:],
        rtol=0,
        atol=float32_tolerance(NUM_FEATURES + LENGTH, value),
    )


def test_prefill_after_a_non_finite_key_decodes_nan_as_causal_favor():
    # An unmasked inf key at position 5 of sequence 0, head 1: causal FAVOR's rows >= 5 of that
    # head are NaN; the prefill's state is NaN for that head only, so the steps after it are.
    query, key, value = make_inputs(15)
    key = key.at[0, 5, 1].set(jnp.inf)
    projection = per_head_projection()
    # Positive features: the per-feature state (_log_prefix.key_state) leaves such keys out.
    out, state = attention.favor_prefill(
        query[:, :8], key[:, :8], value[:, :8], projection, chunk_size=CHUNK
    )
    _, after = attention.favor_decode_step(state, query[:, 8], key[:, 8], value[:, 8], projection)
    poisoned = np.zeros(out.shape[:3], bool)
    poisoned[0, 5:, 1] = True
    np.testing.assert_array_equal(np.isnan(out).any(-1), poisoned)
    np.testing.assert_array_equal(np.isnan(after).any(-1), poisoned[:, -1])


def test_prefill_of_no_tokens_is_the_empty_state():
    query, key, value = make_inputs(14)
    projection = shared_projection()
    out, state = attention.favor_prefill(query[:, :0], key[:, :0], value[:, :0], projection)
    assert out.shape == (BATCH, 0, HEADS, VALUE_DIM)
    empty = attention.favor_decode_init(BATCH, HEADS, VALUE_DIM, projection)
    for got, expected in zip(state, empty, strict=True):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"batched \(B, T, N, H\)"):
        attention.favor_prefill(query[0], key[0], value[0], projection)


# ----------------------------------------------------------------- dtypes, transformations


def test_bfloat16_inputs():
    query, key, value = make_inputs(12, scale=1.0)
    projection = shared_projection()
    low = [x.astype(jnp.bfloat16) for x in (query, key, value)]
    for causal in (False, True):
        out = attention.favor_attention(*low, projection, causal=causal, chunk_size=CHUNK)
        assert out.dtype == jnp.bfloat16
        same = attention.favor_attention(
            *[x.astype(jnp.float32) for x in low], projection, causal=causal, chunk_size=CHUNK
        )
        if causal:
            # The causal products take bfloat16 operands (the factors in [0, 1] and the
            # values, unit roundoff u = 2^-8), accumulated in float32: a term w_tj v_j carries
            # at most 3u (two factors and the value), the normaliser's terms 2u, so
            # |out_t - same_t| <= 5u max_j |v_j|, plus the output's rounding u |out_t|.
            tolerance = 5 * 2.0**-8 * np.abs(np.asarray(low[2], np.float32)).max(axis=1)
            error = np.abs(np.asarray(out, np.float32) - same) - 2.0**-8 * np.abs(same)
            assert np.all(error <= tolerance[:, None]), (error / tolerance[:, None]).max()
        else:
            # Accumulation and products in float32: on the same (bf16-rounded) inputs, float32
            # then rounded to bfloat16 agrees to one bfloat16 ulp (2^-7 relative).
            np.testing.assert_allclose(
                np.asarray(out, np.float32), same, rtol=2.0**-7, atol=2.0**-7 * 1e-3
            )
        # Against unrounded float32 inputs: rounding q, k (2^-9 relative) moves the O(1)
        # scores q.k/sqrt(H) by ~2 * 2^-9 relative, the output by about as much, plus the
        # output rounding 2^-9: the relative Frobenius error is below 4 * 2^-8 = 2^-6.
        full = attention.favor_attention(query, key, value, projection, causal=causal)
        error = np.linalg.norm(np.asarray(out, np.float32) - full) / np.linalg.norm(full)
        assert error < 2.0**-6


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


def prefix_inputs(seed, length=11, width=4, value_width=3):
    """Arguments of the prefix op in float64, with the stabiliser's log-scales."""
    ka, kb, kv, km = jax.random.split(jax.random.key(seed), 4)
    a = jnp.exp(jax.random.normal(ka, (length, width), jnp.float64))
    b = jnp.exp(jax.random.normal(kb, (length, width), jnp.float64))
    v = jax.random.normal(kv, (length, value_width), jnp.float64)
    alpha = 3.0 * jax.random.normal(km, (length,), jnp.float64)
    beta = jax.lax.cummax(alpha)
    return a, b, v, alpha, beta


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
        ours = jax.vjp(favor, query, key, value)[1](cotangent)
        theirs = jax.vjp(quadratic, query, key, value)[1](cotangent)
        for x, y in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-11)


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
        e = np.asarray(jax.vmap(functools.partial(relative_error, m=m))(keys), np.float64)
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

    def mean_and_se(index, coupling):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(23), index), num_draws)
        draws = jax.vmap(lambda k: projections.get(coupling)(k, head_dim, head_dim))(keys)
        weights = jax.vmap(lambda w: attention.favor_attention_weights(query, key, w))(draws)
        e = np.asarray(jnp.sum((weights - exact) ** 2, axis=(1, 2, 3, 4)), np.float64)
        return e.mean(), e.std(ddof=1) / math.sqrt(num_draws)

    iid, orf, simrf = (
        mean_and_se(i, c) for i, c in enumerate(("gaussian", "orthogonal", "simplex"))
    )
    for worse, better in ((iid, orf), (orf, simrf)):
        assert worse[0] - better[0] > 4 * math.hypot(worse[1], better[1]), (worse, better)


# ----------------------------------------------------------------- redraw, errors


def test_redraw_key_and_draw_projection():
    rng = jax.random.key(24)
    keys = [attention.redraw_key(rng, step, redraw_interval=10) for step in (0, 9, 10)]
    data = [jax.random.key_data(k) for k in keys]
    np.testing.assert_array_equal(data[0], data[1])
    assert not np.array_equal(data[1], data[2])
    traced = jax.jit(lambda s: attention.redraw_key(rng, s, redraw_interval=10))(jnp.int32(9))
    np.testing.assert_array_equal(jax.random.key_data(traced), data[0])
    shared = attention.draw_projection(keys[0], HEAD_DIM, NUM_FEATURES, coupling="gaussian")
    assert shared.matrix().shape == (NUM_FEATURES, HEAD_DIM)


def test_argument_errors():
    query, key, value = make_inputs(25)
    projection = shared_projection()
    run = attention.favor_attention
    with pytest.raises(ValueError, match="key"):
        run(query, key[..., :4], value, projection)
    with pytest.raises(ValueError, match="causal"):
        run(query, key[:, :5], value[:, :5], projection, causal=True)
    with pytest.raises(TypeError, match="mask"):
        run(query, key, value, projection, mask=jnp.ones((BATCH, LENGTH)))
    with pytest.raises(ValueError, match="mask"):
        run(query, key, value, projection, mask=jnp.ones((BATCH, 3), bool))
    with pytest.raises(ValueError, match="stabilize"):
        run(query, key, value, projection, feature_map="relu", stabilize=True)
    with pytest.raises(ValueError, match="feature_map"):
        run(query, key, value, projection, feature_map="cosine")
    with pytest.raises(ValueError, match="chunk_size"):
        run(query, key, value, projection, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="dim"):
        run(query, key, value, projections.gaussian(jax.random.key(0), 4, 8))
    with pytest.raises(TypeError, match="floating"):
        run(query.astype(jnp.int32), key, value, projection)
    with pytest.raises(TypeError, match="projection"):
        run(query, key, value, "gaussian")
    # N stacked draws must be marked PerHead, with one entry per head.
    stacked = per_head_projection().stacked
    with pytest.raises(ValueError, match="PerHead"):
        run(query, key, value, stacked)
    with pytest.raises(ValueError, match="leading axis N = 3"):
        run(query, key, value, attention.PerHead(jax.tree.map(lambda w: w[:2], stacked)))
    with pytest.raises(TypeError, match="FeatureMap"):
        run(query, key, value, projection, feature_map=lambda x, p: x)
