"""PerformerAttention as a drop-in for flax.linen.MultiHeadDotProductAttention: auto-names and
checkpoints, Flax's masks, call forms, decoding with the FAVOR state, sown weights."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import PerformerAttention

BATCH, LENGTH, WIDTH, HEADS = 2, 10, 16, 2
RNGS = {"projection": jax.random.key(3)}


def _inputs(seed=0):
    return jax.random.normal(jax.random.key(seed), (2, BATCH, LENGTH, WIDTH)) * 0.5


class _TwoAttentions(nn.Module):
    """A model written for Flax's attention: two unnamed attention layers."""

    attention: type[nn.Module]
    kwargs: dict

    @nn.compact
    def __call__(self, x):
        x = x + self.attention(num_heads=HEADS, **self.kwargs)(x)
        return x + self.attention(num_heads=HEADS, **self.kwargs)(x)


def test_flax_checkpoint_loads_into_unnamed_performer_attention():
    x, _ = _inputs()
    flax_model = _TwoAttentions(nn.MultiHeadDotProductAttention, {})
    params = flax_model.init(jax.random.key(1), x)
    assert set(params["params"]) == {
        "MultiHeadDotProductAttention_0",
        "MultiHeadDotProductAttention_1",
    }
    ours = _TwoAttentions(PerformerAttention, {"attention_kind": "exact"})
    assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(params)
    np.testing.assert_allclose(
        ours.apply(params, x), flax_model.apply(params, x), rtol=1e-5, atol=1e-6
    )
    performer = _TwoAttentions(PerformerAttention, {"num_features": 16})
    assert performer.apply(params, x, rngs=RNGS).shape == x.shape  # the same tree, FAVOR


def _performer(**kwargs):
    return PerformerAttention(num_heads=HEADS, num_features=16, coupling="gaussian", **kwargs)


def _params():
    x, _ = _inputs()
    return nn.MultiHeadDotProductAttention(num_heads=HEADS).init(jax.random.key(1), x)


PAD = jnp.arange(LENGTH)[None, :] < jnp.array([[7], [LENGTH]])  # (B, T): 7 and 10 tokens


@pytest.mark.parametrize(
    ("name", "mask", "causal"),
    [
        ("padding", nn.make_attention_mask(PAD, PAD), False),
        ("key padding", nn.make_attention_mask(jnp.ones_like(PAD), PAD), False),
        ("causal", nn.make_causal_mask(PAD), True),
        (
            "causal and padding",
            nn.combine_masks(nn.make_causal_mask(PAD), nn.make_attention_mask(PAD, PAD)),
            True,
        ),
        (
            "per head",
            jnp.broadcast_to(nn.make_causal_mask(PAD), (BATCH, HEADS, LENGTH, LENGTH)),
            True,
        ),
    ],
)
def test_flax_masks_become_key_padding_and_causality(name, mask, causal):
    x, _ = _inputs()
    params = _params()
    expected = _performer(causal=causal).apply(
        params, x, mask=PAD if "padding" in name else None, rngs=RNGS
    )
    valid = np.asarray(PAD)  # rows of padded queries are padding: not compared
    got = _performer().apply(params, x, mask=mask, rngs=RNGS)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(expected)[valid], atol=1e-6)
    traced = jax.jit(lambda m: _performer().apply(params, x, mask=m, rngs=RNGS))(mask)
    np.testing.assert_allclose(np.asarray(traced)[valid], np.asarray(expected)[valid], atol=1e-5)


def test_masks_favor_cannot_apply_raise():
    x, _ = _inputs()
    params = _params()
    window = jnp.abs(jnp.arange(LENGTH)[:, None] - jnp.arange(LENGTH)[None, :]) <= 2
    mask = jnp.broadcast_to(window, (BATCH, 1, LENGTH, LENGTH))
    module = _performer()
    with pytest.raises(ValueError, match="key padding mask and causality only"):
        module.apply(params, x, mask=mask, rngs=RNGS)
    with pytest.raises(Exception, match="key padding mask and causality only"):
        jax.block_until_ready(jax.jit(lambda m: module.apply(params, x, mask=m, rngs=RNGS))(mask))
    differing_heads = jnp.stack([nn.make_causal_mask(PAD)[:, 0], mask[:, 0]], axis=1)
    with pytest.raises(ValueError, match="the same for every head"):
        module.apply(params, x, mask=differing_heads, rngs=RNGS)
    with pytest.raises(ValueError, match="broadcastable"):
        module.apply(params, x, mask=jnp.ones((BATCH, 1, 3, LENGTH), bool), rngs=RNGS)


def test_exact_kind_reads_flax_masks_as_flax_does():
    """Masks of every rank Flax broadcasts (per head, per batch, two batch axes), the key
    padding mask with causal, and a 2-D mask that is not (B, S), which raises."""
    x, kv = _inputs()
    params = _params()
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=HEADS)
    ours = PerformerAttention(num_heads=HEADS, attention_kind="exact")
    lower = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))
    both = jnp.stack([x, kv])  # (2, B, T, D)
    causal = nn.make_causal_mask(PAD)
    cases = [
        (x, jnp.broadcast_to(lower, (HEADS, LENGTH, LENGTH))),
        (x, nn.combine_masks(causal, nn.make_attention_mask(PAD, PAD))),
        (both, nn.make_causal_mask(both[..., 0])),
        (both, lower[None, None]),
    ]
    for inputs, mask in cases:
        expected = flax_layer.apply(params, inputs, mask=mask)
        np.testing.assert_allclose(ours.apply(params, inputs, mask=mask), expected, atol=1e-6)
    key_padding = nn.combine_masks(causal, nn.make_attention_mask(jnp.ones_like(PAD), PAD))
    expected = flax_layer.apply(params, x, mask=key_padding)
    causal_layer = PerformerAttention(num_heads=HEADS, attention_kind="exact", causal=True)
    np.testing.assert_allclose(causal_layer.apply(params, x, mask=PAD), expected, atol=1e-6)
    for layer in (ours, _performer()):
        with pytest.raises(ValueError, match=r"key padding mask \(B, S\).*shape \(10, 10\)"):
            layer.apply(params, x, mask=lower, rngs=RNGS)


def test_call_forms_of_flax_attention():
    q, kv = _inputs()
    params = _params()
    for module in (_performer(), PerformerAttention(num_heads=HEADS, attention_kind="exact")):
        expected = module.apply(params, q, kv, kv, rngs=RNGS)
        np.testing.assert_array_equal(module.apply(params, q, inputs_kv=kv, rngs=RNGS), expected)
        np.testing.assert_array_equal(module.apply(params, q, kv, rngs=RNGS), expected)
        with pytest.raises(ValueError, match="either inputs_kv or inputs_k"):
            module.apply(params, q, kv, inputs_kv=kv, rngs=RNGS)
        with pytest.raises(ValueError, match="inputs_v needs inputs_k"):
            module.apply(params, q, inputs_v=kv, rngs=RNGS)


def test_decode_one_token_at_a_time_equals_causal_attention():
    x, _ = _inputs()
    module = _performer(decode=True)
    variables = module.init(jax.random.key(1), x)  # full-length inputs: creates the cache
    params, cache = {"params": variables["params"]}, variables["cache"]
    assert jax.tree.map(jnp.shape, cache["decode_state"]).kv_sum == (BATCH, HEADS, 16, 8)
    expected = _performer(causal=True).apply(params, x, rngs=RNGS)
    outputs = []
    for t in range(LENGTH):
        out, state = module.apply(
            {**params, "cache": cache}, x[:, t : t + 1], rngs=RNGS, mutable=["cache"]
        )
        cache = state["cache"]
        outputs.append(out)
    assert int(cache["cache_index"]) == LENGTH
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="starts a sequence: the cache must be empty"):
        module.apply({**params, "cache": cache}, x[:, :2], rngs=RNGS, mutable=["cache"])


@pytest.mark.parametrize("kind, causal", [("performer", False), ("exact", False), ("exact", True)])
def test_prefill_then_a_compiled_loop_equals_causal_attention(kind, causal):
    # A prompt at once (FAVOR's chunked form / the key-value cache filled), then a lax.scan of
    # steps without the projection stream (the cache's projection), against the causal forward
    # pass (which the steps one call at a time equal: the test above). causal: the training
    # module cloned with decode=True (its causal mask is the cache's, not the prompt's T x T).
    x, _ = _inputs()
    prompt = 4
    module = _performer(decode=True, causal=causal, attention_kind=kind)
    variables = module.init({"params": jax.random.key(1), **RNGS}, x)
    params = {"params": variables["params"]}
    expected = _performer(causal=True, attention_kind=kind).apply(params, x, rngs=RNGS)
    out, state = module.apply(
        {**params, "cache": variables["cache"]}, x[:, :prompt], rngs=RNGS, mutable=["cache"]
    )
    np.testing.assert_allclose(out, expected[:, :prompt], rtol=1e-5, atol=1e-6)

    def step(cache, token):
        out, state = module.apply({**params, "cache": cache}, token[:, None], mutable=["cache"])
        return state["cache"], out[:, 0]

    cache, looped = jax.jit(lambda c, xs: jax.lax.scan(step, c, xs))(
        state["cache"], jnp.moveaxis(x[:, prompt:], 1, 0)
    )
    assert int(cache["cache_index"]) == LENGTH
    np.testing.assert_allclose(
        jnp.moveaxis(looped, 0, 1), expected[:, prompt:], rtol=1e-5, atol=1e-5
    )
    if kind == "exact":  # a traced cache index is checked at run time
        prefill = jax.jit(
            lambda c: module.apply({**params, "cache": c}, x[:, :2], mutable=["cache"])
        )
        with pytest.raises(Exception, match="starts a sequence: the cache must be empty"):
            jax.block_until_ready(prefill(cache))


@pytest.mark.parametrize("kind", ["performer", "exact"])
def test_decoding_isolates_a_non_finite_token_as_the_forward_pass_does(kind):
    # Token 2 of sequence 0 holds a NaN: the rows that attend to it (2 and later) are NaN, the
    # others as without it, in the prefill and in the steps after it.
    x = _inputs()[0].at[0, 2, 0].set(jnp.nan)
    module = _performer(decode=True, attention_kind=kind)
    variables = module.init({"params": jax.random.key(1), **RNGS}, x)
    params = {"params": variables["params"]}
    expected = _performer(causal=True, attention_kind=kind).apply(params, x, rngs=RNGS)
    out, state = module.apply(
        {**params, "cache": variables["cache"]}, x[:, :4], rngs=RNGS, mutable=["cache"]
    )
    outputs = [out]
    for t in range(4, LENGTH):
        out, state = module.apply({**params, **state}, x[:, t : t + 1], mutable=["cache"])
        outputs.append(out)
    decoded = np.asarray(jnp.concatenate(outputs, axis=1))
    poisoned = np.zeros((BATCH, LENGTH), bool)
    poisoned[0, 2:] = True
    np.testing.assert_array_equal(np.isnan(decoded).any(-1), poisoned)
    np.testing.assert_array_equal(np.isnan(expected).any(-1), poisoned)
    np.testing.assert_allclose(decoded[~poisoned], np.asarray(expected)[~poisoned], atol=1e-5)


def test_exact_decode_keeps_flax_cache_and_outputs():
    x, _ = _inputs()
    ours = PerformerAttention(num_heads=HEADS, attention_kind="exact", decode=True)
    flax_module = nn.MultiHeadDotProductAttention(num_heads=HEADS, decode=True)
    variables = flax_module.init(jax.random.key(1), x)
    assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(variables)
    ours_cache = flax_cache = variables["cache"]
    params = {"params": variables["params"]}
    for t in range(LENGTH):
        token = x[:, t : t + 1]
        out, ours_state = ours.apply({**params, "cache": ours_cache}, token, mutable=["cache"])
        expected, flax_state = flax_module.apply(
            {**params, "cache": flax_cache}, token, mutable=["cache"]
        )
        ours_cache, flax_cache = ours_state["cache"], flax_state["cache"]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert int(ours_cache["cache_index"]) == LENGTH


@pytest.mark.parametrize("kind", ["exact", "performer"])
def test_sow_weights_as_flax_does(kind):
    x, _ = _inputs()
    params = _params()
    mask = nn.make_causal_mask(PAD)
    module = PerformerAttention(num_heads=HEADS, num_features=16, attention_kind=kind)
    _, state = module.apply(
        params, x, mask=mask, sow_weights=True, rngs=RNGS, mutable=["intermediates"]
    )
    (weights,) = state["intermediates"]["attention_weights"]
    assert weights.shape == (BATCH, HEADS, LENGTH, LENGTH)
    np.testing.assert_allclose(jnp.sum(weights, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(jnp.triu(weights, k=1), 0.0)  # causal
    if kind == "exact":
        _, flax_state = nn.MultiHeadDotProductAttention(num_heads=HEADS).apply(
            params, x, mask=mask, sow_weights=True, mutable=["intermediates"]
        )
        np.testing.assert_allclose(
            weights, flax_state["intermediates"]["attention_weights"][0], rtol=1e-6
        )
    _, quiet = module.apply(params, x, rngs=RNGS, mutable=["intermediates"])
    assert "attention_weights" not in quiet["intermediates"]


def test_exact_decoding_reads_a_key_padding_mask_over_the_cache():
    # As Flax's cache: while decoding, the exact kind's (B, L) mask covers the cache's L
    # positions (the prompt's and each step's, the later ones masked by the cache itself).
    x, _ = _inputs()
    padding = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([1, 6])].set(False)
    module = _performer(decode=True, attention_kind="exact")
    variables = module.init(jax.random.key(1), x)
    params = {"params": variables["params"]}
    expected = _performer(causal=True, attention_kind="exact").apply(params, x, mask=padding)
    prompt = 4
    out, state = module.apply(
        {**params, "cache": variables["cache"]}, x[:, :prompt], mask=padding, mutable=["cache"]
    )
    outputs = [out]
    for t in range(prompt, LENGTH):
        out, state = module.apply(
            {**params, **state}, x[:, t : t + 1], mask=padding, mutable=["cache"]
        )
        outputs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outputs, 1), expected, rtol=1e-5, atol=1e-6)
