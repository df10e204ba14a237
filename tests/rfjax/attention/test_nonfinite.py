"""FAVOR attention with non-finite inputs: a NaN or inf reaches exactly the outputs that attend
to it (causality holds for non-finite values too), never masked or earlier ones, in outputs and
in gradients (issue 18, defect 1)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, features, projections
from tests.support.compiled import jitted
from tests.support.interpret_mode import interpret_mode_case
from tests.support.representatives import representatives

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 12, 2, 8
T0 = 7  # first perturbed position
MASKED = 3  # position masked out in batch element 1
NON_FINITE = (jnp.nan, jnp.inf, -jnp.inf)


def inputs():
    return tuple(jax.random.normal(jax.random.key(0), (3, BATCH, LENGTH, HEADS, HEAD_DIM)))


@functools.cache
def projection():
    return projections.orthogonal(jax.random.key(1), HEAD_DIM, 16)


def mask():
    return jnp.ones((BATCH, LENGTH), bool).at[1, MASKED].set(False)


def run_for(name, **kwargs):
    fmap = features.get(name)().init(jax.random.key(2), HEAD_DIM)
    if any(getattr(fmap, field) is None for field in fmap.fitted_fields):
        # A data-fitted map (OPRF, DERF) must be fitted before causal use: on the clean inputs,
        # a calibration sample that no perturbation reaches.
        query, key, _ = inputs()
        fit = jax.jit(fmap.fit)  # one program (eagerly, each primitive compiles apart)
        fmap = fit(jax.random.key(3), query.reshape(-1, HEAD_DIM), key.reshape(-1, HEAD_DIM))
    eps = 1e-3 if fmap.needs_denominator_floor else None
    return functools.partial(
        jitted(attention.favor_attention),
        projection=projection(),
        feature_map=fmap,
        eps=eps,
        **kwargs,
    )


def perturbed_batch():
    """The clean inputs followed by 9 copies with every position >= T0 of the query, key or
    value set to NaN, +inf or -inf, stacked along the batch axis (one compilation); the mask
    repeated."""
    clean = inputs()
    variants = [clean]
    for which in range(3):
        for bad in NON_FINITE:
            perturbed = list(clean)
            perturbed[which] = perturbed[which].at[:, T0:].set(bad)
            variants.append(perturbed)
    stacked = [jnp.concatenate(xs) for xs in zip(*variants, strict=True)]
    return stacked, jnp.tile(mask(), (len(variants), 1))


@pytest.mark.parametrize(  # every map in CI's suite; an exponential, a hybrid, a signed one here
    ("name", "chunk_sizes"),
    representatives(
        [("positive", (1, 5, LENGTH)), ("angular_hybrid", (1, LENGTH))]
        + [(name, (5,)) for name in features.available() if name != "positive"],
        (("positive", (1, 5, LENGTH)), ("angular_hybrid", (1, LENGTH)), ("trigonometric", (5,))),
        unpack=True,
    ),
)
def test_causal_non_finite_future_leaves_past_bit_identical(name, chunk_sizes):
    # Every position >= T0 of the query, key or value set to NaN, +inf or -inf: outputs before
    # T0 are bit-identical to the clean run, for chunks of 1, of 5 (T0 inside the second chunk,
    # with padding) and one chunk of the whole sequence, with a masked key. A key or value makes
    # every output from T0 on NaN (they attend to it), a query its own row.
    (query, key, value), masks = perturbed_batch()
    for chunk_size in chunk_sizes:
        out = np.asarray(
            run_for(name, causal=True, chunk_size=chunk_size, mask=masks)(query, key, value)
        )
        out = out.reshape(-1, BATCH, *out.shape[1:])
        before, after = out[0], out[1:]
        assert np.all(np.isfinite(before))
        np.testing.assert_array_equal(
            after[:, :, :T0], np.broadcast_to(before[:, :T0], after[:, :, :T0].shape)
        )
        assert np.all(np.isnan(after[:, :, T0:]))


@pytest.mark.parametrize("name", ["positive", "relu", "derf_asymmetric"])
def test_causal_gradients_of_the_past_ignore_non_finite_future(name):
    # A loss on the outputs before T0: its gradients are finite and equal to the clean ones
    # (to float32 rounding: the backward pass's reversed sums rescale the carried state by the
    # running maximum of the later keys) when later queries, keys and values are NaN.
    clean = inputs()
    run = run_for(name, causal=True, chunk_size=5, mask=mask())

    @jax.jit
    def grads(q, k, v):
        return jax.grad(lambda *x: jnp.sum(run(*x)[:, :T0] ** 2), argnums=(0, 1, 2))(q, k, v)

    expected = grads(*clean)
    got = grads(*(x.at[:, T0 + i].set(jnp.nan) for i, x in enumerate(clean)))
    for g, e in zip(got, expected, strict=True):
        assert np.all(np.isfinite(g))
        # ~(m + T) float32 roundings of the largest gradient entry.
        tolerance = (16 + LENGTH) * np.finfo(np.float32).eps * float(np.max(np.abs(e)))
        np.testing.assert_allclose(g[:, :T0], e[:, :T0], rtol=0, atol=tolerance)


@pytest.mark.parametrize("which", ["query", "key"])
@pytest.mark.parametrize("name", ["positive", "trigonometric"])  # key shifts per feature, per key
def test_finite_rows_with_non_finite_features_reach_what_attends_to_them(name, which):
    """A finite query or key row of 1e20 (|x'|^2 overflows: log-features -inf, or the
    trigonometric map's log-scale inf) at T0 alone, flagged like a non-finite row: a query's
    own output is NaN, a key's every output from T0 on; the other rows' are the clean ones',
    and a loss on them has finite gradients equal to the clean ones. With per-feature shifts,
    a query's log-features entered as -inf made its row shift -inf and its factors
    exp(-inf + inf) NaN, and 0 * NaN reached every key's gradient; a key's, weight 0, left
    its outputs finite. With per-key shifts, a key left out made only its own row NaN (the
    tests above perturb every later position, so each later row had a bad key of its own)."""
    clean = inputs()
    row = 0 if which == "query" else 1
    perturbed = list(clean)
    perturbed[row] = clean[row].at[:, T0].set(1e20)
    run = run_for(name, causal=True, chunk_size=5, mask=mask())
    positions = np.arange(LENGTH)
    others = positions != T0 if which == "query" else positions < T0

    @jax.jit
    def outputs_and_grads(q, k, v):
        def loss(q, k, v):
            out = run(q, k, v)
            return jnp.sum(jnp.where(others[:, None, None], out, 0) ** 2), out

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    expected_grads, expected = outputs_and_grads(*clean)
    grads, out = outputs_and_grads(*perturbed)
    assert np.all(np.isnan(out[:, ~others])) and np.all(np.isfinite(out[:, others]))
    np.testing.assert_array_equal(out[:, others], expected[:, others])
    for g, e in zip(grads, expected_grads, strict=True):
        # The rows perturbed reach nothing the loss reads (their own gradient, as a NaN row's
        # above, is not checked: the per-key maps' is NaN); ~(m + T) float32 roundings of the
        # largest gradient entry (as above).
        assert np.all(np.isfinite(g[:, others]))
        tolerance = (16 + LENGTH) * np.finfo(np.float32).eps * float(np.max(np.abs(e)))
        np.testing.assert_allclose(g[:, others], e[:, others], rtol=0, atol=tolerance)


@pytest.mark.parametrize("name", ["positive", "trigonometric", "gaussian_hybrid"])
def test_bidirectional_non_finite_masked_keys_and_queries(name):
    query, key, value = inputs()
    run = run_for(name, causal=False, mask=mask())
    before = np.asarray(run(query, key, value))
    # NaN/inf in a masked key and value: nothing changes.
    for bad in NON_FINITE:
        after = run(query, key.at[1, MASKED].set(bad), value.at[1, MASKED].set(bad))
        np.testing.assert_array_equal(after, before)
    # A NaN query: its row only (the other rows are bit-identical).
    after = np.asarray(run(query.at[0, 2].set(jnp.nan), key, value))
    assert np.all(np.isnan(after[0, 2]))
    rows = np.arange(LENGTH) != 2
    np.testing.assert_array_equal(after[0, rows], before[0, rows])
    np.testing.assert_array_equal(after[1], before[1])
    # An unmasked NaN key: every row of that batch element attends to it.
    after = np.asarray(run(query, key.at[0, 5].set(jnp.nan), value))
    assert np.all(np.isnan(after[0]))
    np.testing.assert_array_equal(after[1], before[1])


def test_attention_weights_keep_non_finite_future_keys_out():
    query, key, _ = inputs()
    weights = functools.partial(
        jitted(attention.favor_attention_weights), projection=projection(), causal=True, mask=mask()
    )
    before = np.asarray(weights(query, key))
    after = np.asarray(weights(query, key.at[:, T0:].set(jnp.nan).at[1, MASKED].set(jnp.inf)))
    np.testing.assert_array_equal(after[:, :, :T0], before[:, :, :T0])


def test_exact_reference_isolates_non_finite_inputs_as_favor_does():
    # Issue 32 item 6: softmax_attention ("same conventions as favor_attention") let a NaN value
    # at T0 reach every earlier causal row (0 * NaN in the weighted sum) and a NaN in a masked
    # value reach every row. Non-finite queries, keys and values now reach exactly the rows that
    # attend to them, in outputs and gradients, as in FAVOR.
    query, key, value = inputs()
    reference = functools.partial(jitted(attention.softmax_attention), mask=mask())
    for causal in (True, False):
        before = np.asarray(reference(query, key, value, causal=causal))
        assert np.all(np.isfinite(before))
        for bad in NON_FINITE:
            # Masked key and value (batch element 1): nothing changes.
            hidden = (key.at[1, MASKED].set(bad), value.at[1, MASKED].set(bad))
            np.testing.assert_array_equal(reference(query, *hidden, causal=causal), before)
            for which in (1, 2):  # an unmasked key or value at T0
                perturbed = [query, key, value]
                perturbed[which] = perturbed[which].at[:, T0].set(bad)
                after = np.asarray(reference(*perturbed, causal=causal))
                attending = slice(T0, None) if causal else slice(None)
                assert np.all(np.isnan(after[:, attending])), (causal, which, bad)
                if causal:
                    np.testing.assert_array_equal(after[:, :T0], before[:, :T0])
        # A NaN query: its own row only.
        after = np.asarray(reference(query.at[0, 2].set(jnp.nan), key, value, causal=causal))
        assert np.all(np.isnan(after[0, 2]))
        np.testing.assert_array_equal(np.delete(after, 2, axis=1)[0], np.delete(before, 2, 1)[0])

    # Gradients of the causal rows before T0 ignore a NaN value at T0 and in a masked position.
    @jax.jit
    def grads(v):
        loss = lambda q, k, v: jnp.sum(reference(q, k, v, causal=True)[:, :T0] ** 2)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1, 2))(query, key, v)

    expected = grads(value)
    got = grads(value.at[:, T0].set(jnp.nan).at[1, MASKED].set(jnp.nan))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(g)[:, :T0], np.asarray(e)[:, :T0])
        assert np.all(np.isfinite(np.asarray(g)))


def test_exact_attention_modules_isolate_non_finite_tokens():
    # Issue 32 item 6: rfjax.nn.PerformerAttention(attention_kind="exact") (linen and NNX, both
    # through Flax's dot_product_attention) let a NaN in a masked token reach every row, and a
    # NaN token at T0 every earlier causal row. Now as in FAVOR: masked tokens are never read,
    # and a non-finite token reaches exactly the rows that attend to it.
    from flax import nnx as flax_nnx

    from rfjax import nn as rnn
    from rfjax.nn import nnx as rnnx

    tokens = jax.random.normal(jax.random.key(4), (BATCH, LENGTH, 16))
    linen = rnn.PerformerAttention(num_heads=HEADS, attention_kind="exact")
    params = jax.jit(linen.init)(jax.random.key(5), tokens)
    nnx_layer = flax_nnx.jit(
        lambda: rnnx.PerformerAttention(HEADS, 16, attention_kind="exact", rngs=flax_nnx.Rngs(6))
    )()
    padding = mask()[:, None, None, :]  # (B, 1, 1, S), as Flax masks broadcast

    layers = {
        "linen": jax.jit(lambda x, **kw: linen.apply(params, x, **kw)),
        "nnx": flax_nnx.jit(lambda x, **kw: nnx_layer(x, **kw)),
    }
    for name, layer in layers.items():
        for causal_mask in (None, jnp.tril(jnp.ones((LENGTH, LENGTH), bool))[None, None]):
            full = padding if causal_mask is None else padding & causal_mask
            before = np.asarray(layer(tokens, mask=full))
            assert np.all(np.isfinite(before)), name
            # NaN in the masked token of batch element 1: only its own (query) row changes.
            after = np.array(layer(tokens.at[1, MASKED].set(jnp.nan), mask=full))
            assert np.all(np.isnan(after[1, MASKED])), name
            after[1, MASKED] = before[1, MASKED]
            np.testing.assert_array_equal(after, before, err_msg=name)
            # NaN token at T0: causal rows before it unchanged, the rows that attend to it NaN.
            after = np.asarray(layer(tokens.at[:, T0].set(jnp.nan), mask=full))
            if causal_mask is None:
                assert np.all(np.isnan(after)), name
            else:
                np.testing.assert_array_equal(after[:, :T0], before[:, :T0], err_msg=name)
                assert np.all(np.isnan(after[:, T0:])), name


def test_exact_nnx_attention_isolates_with_is_causal_and_grouped_kv_heads():
    # The NNX exact kind under Flax's own causal flag (is_causal=True, no mask) and with grouped
    # key/value heads (num_kv_heads < num_heads): a NaN token at T0 reaches rows >= T0 only.
    from flax import nnx as flax_nnx

    from rfjax.nn import nnx as rnnx

    tokens = jax.random.normal(jax.random.key(7), (BATCH, LENGTH, 16))
    for kv_heads in (HEADS, HEADS // 2):
        layer = flax_nnx.jit(
            lambda kv_heads=kv_heads: rnnx.PerformerAttention(
                HEADS, 16, num_kv_heads=kv_heads, attention_kind="exact", rngs=flax_nnx.Rngs(8)
            )
        )()
        causal = flax_nnx.jit(lambda x, layer=layer: layer(x, is_causal=True))
        before = np.asarray(causal(tokens))
        after = np.asarray(causal(tokens.at[:, T0].set(jnp.nan)))
        np.testing.assert_array_equal(after[:, :T0], before[:, :T0])
        assert np.all(np.isnan(after[:, T0:]))


@pytest.mark.parametrize(
    ("implementation", "causal"),
    [
        *representatives([("xla", c) for c in (True, False)], [("xla", True)], unpack=True),
        *(interpret_mode_case("pallas_triton_interpret", c) for c in (True, False)),
    ],
)
def test_a_fully_masked_sequence_adds_nothing_to_the_gradients(implementation, causal):
    """A batch whose first sequence is fully masked (its rows attend to no key, their outputs
    are 0) and a loss that weights the outputs by 10: the masked sequence's rows get zero
    gradients and the projection's gradient is the other sequence's alone. Before, d num / eps
    at the positive maps' floor (the smallest normal number) was inf for a cotangent of 4 or
    more, and inf times the masked keys' zero factors put NaN in the projection's gradient, in
    the XLA form and the kernels alike."""
    query, key, value = inputs()
    weights = 10.0 * jax.random.normal(jax.random.key(3), value.shape)
    fmap = features.get("positive")().init(jax.random.key(2), HEAD_DIM)

    def loss(q, k, v, w, mask, weights):
        out = attention.favor_attention(
            q, k, v, w, feature_map=fmap, causal=causal, mask=mask, implementation=implementation
        )
        return jnp.sum(out * weights)

    gradients = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    masked = jnp.ones((BATCH, LENGTH), bool).at[0].set(False)
    matrix = projection().matrix()
    grad_q, grad_k, grad_v, grad_w = gradients(query, key, value, matrix, masked, weights)
    for grad in (grad_q, grad_k, grad_v):
        np.testing.assert_array_equal(grad[0], 0.0)
    second = [x[1:] for x in (query, key, value)]
    grad_w_alone = gradients(*second, matrix, masked[1:], weights[1:])[3]
    np.testing.assert_allclose(grad_w, grad_w_alone, rtol=1e-5, atol=1e-6)
