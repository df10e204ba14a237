"""rfjax.nn.nnx: PerformerAttention as a drop-in for flax.nnx.MultiHeadAttention, and the NNX
PerformerViT trained with nnx.Optimizer."""

import functools
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rfjax import attention
from rfjax.nn import nnx as rnnx

BATCH, LENGTH, WIDTH, HEADS = 2, 10, 16, 2
PAD = jnp.arange(LENGTH)[None, :] < jnp.array([[7], [LENGTH]])  # (B, T): 7 and 10 tokens


def _inputs(seed=0):
    return jax.random.normal(jax.random.key(seed), (BATCH, LENGTH, WIDTH)) * 0.5


def _performer(**kwargs):
    kwargs = {"num_features": 16, "coupling": "gaussian", **kwargs}
    return rnnx.PerformerAttention(HEADS, WIDTH, rngs=nnx.Rngs(0, projection=3), **kwargs)


def test_call_signature_matches_nnx_multi_head_attention():
    ours = inspect.signature(rnnx.PerformerAttention.__call__).parameters
    theirs = inspect.signature(nnx.MultiHeadAttention.__call__).parameters
    for name in (
        "inputs_q",
        "inputs_k",
        "inputs_v",
        "mask",
        "deterministic",
        "rngs",
        "sow_weights",
        "decode",
        "is_causal",
    ):
        assert ours[name].kind == theirs[name].kind, name
    ours = inspect.signature(rnnx.PerformerAttention.__init__).parameters
    theirs = list(inspect.signature(nnx.MultiHeadAttention.__init__).parameters)
    assert list(ours)[:5] == theirs[:5]  # self, num_heads, in_features, qkv_features, ...


def test_multi_head_attention_parameters_load_and_give_its_outputs():
    x, kv = _inputs(0), _inputs(1)
    mha = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=nnx.Rngs(1))
    ours = rnnx.PerformerAttention(HEADS, WIDTH, attention_kind="exact", rngs=nnx.Rngs(9))
    assert jax.tree.structure(nnx.state(ours, nnx.Param)) == jax.tree.structure(
        nnx.state(mha, nnx.Param)
    )
    nnx.update(ours, nnx.state(mha, nnx.Param))
    mask = nnx.make_attention_mask(PAD, PAD)
    np.testing.assert_allclose(ours(x, kv, mask=mask), mha(x, kv, mask=mask), atol=1e-6)
    np.testing.assert_allclose(ours(x, is_causal=True), mha(x, is_causal=True), atol=1e-6)
    performer = _performer()
    nnx.update(performer, nnx.state(mha, nnx.Param))  # the same layout for FAVOR
    assert performer(x, kv).shape == x.shape


def test_exact_kind_reads_flax_masks_as_nnx_does():
    """A mask with two batch axes, and the key padding mask with is_causal."""
    x, kv = _inputs(0), _inputs(1)
    mha = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=nnx.Rngs(1))
    ours = rnnx.PerformerAttention(HEADS, WIDTH, attention_kind="exact", rngs=nnx.Rngs(9))
    nnx.update(ours, nnx.state(mha, nnx.Param))
    both = jnp.stack([x, kv])  # (2, B, T, D)
    mask = nnx.make_causal_mask(both[..., 0])
    np.testing.assert_allclose(ours(both, mask=mask), mha(both, mask=mask), atol=1e-6)
    key_padding = nnx.make_attention_mask(jnp.ones_like(PAD), PAD)
    expected = mha(x, mask=nnx.combine_masks(nnx.make_causal_mask(PAD), key_padding))
    np.testing.assert_allclose(ours(x, mask=PAD, is_causal=True), expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"key padding mask \(B, S\)"):
        ours(x, mask=jnp.tril(jnp.ones((LENGTH, LENGTH), bool)))


def _documented_projection(layer: rnnx.PerformerAttention, step: int, redraw_interval: int):
    """split(redraw_key(base key, step, redraw_interval))[0], one draw per head."""
    stream = attention.redraw_key(layer.projection_key[...], step, redraw_interval=redraw_interval)
    return attention.draw_projection(
        jax.random.split(stream)[0], WIDTH // HEADS, 16, coupling="gaussian", num_heads=HEADS
    )


def test_performer_is_favor_attention_on_the_documented_draw():
    """Output = out(favor_attention(q, k, v, projection)) with the projection drawn from
    split(redraw_key(base key, step, redraw_interval))[0], one draw per head."""
    layer = _performer(redraw_interval=5)
    x = _inputs()
    q, k, v = layer.query(x), layer.key(x), layer.value(x)
    for step in (0, 7):
        projection = _documented_projection(layer, step, 5)
        expected = layer.out(attention.favor_attention(q, k, v, projection, causal=True))
        got = layer(x, is_causal=True, projection_step=step)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(layer(x, projection_step=5), layer(x, projection_step=9))
    assert not np.allclose(layer(x, projection_step=4), layer(x, projection_step=5))


def test_rotary_performer_is_favor_attention_on_rotated_queries_and_keys():
    rope = nnx.RoPE()
    layer = _performer(
        attention_fn=functools.partial(nnx.dot_product_attention_with_rope, rope=rope)
    )
    x, positions = _inputs(), jnp.arange(LENGTH, dtype=jnp.float32) + 3
    rotated = jax.vmap(rope, in_axes=(-2, None), out_axes=-2)  # each head at the positions
    q, k = rotated(layer.query(x), positions), rotated(layer.key(x), positions)
    favor = attention.favor_attention(q, k, layer.value(x), _documented_projection(layer, 0, 1000))
    got = layer(x, input_positions=positions)
    np.testing.assert_allclose(got, layer.out(favor), rtol=1e-5, atol=1e-6)


def test_flax_masks_become_key_padding_and_causality():
    x = _inputs()
    layer = _performer()
    mask = nnx.combine_masks(nnx.make_causal_mask(PAD), nnx.make_attention_mask(PAD, PAD))
    expected = layer(x, mask=PAD, is_causal=True)
    valid = np.asarray(PAD)
    np.testing.assert_allclose(np.asarray(layer(x, mask=mask))[valid], np.asarray(expected)[valid])
    traced = nnx.jit(lambda m, mask: m(x, mask=mask))(layer, mask)
    np.testing.assert_allclose(np.asarray(traced)[valid], np.asarray(expected)[valid], atol=1e-6)
    window = jnp.abs(jnp.arange(LENGTH)[:, None] - jnp.arange(LENGTH)[None, :]) <= 2
    with pytest.raises(ValueError, match="key padding mask and causality only"):
        layer(x, mask=window[None, None])


def test_decode_one_token_at_a_time_equals_causal_attention():
    x = _inputs()
    layer = _performer(decode=True)
    with pytest.raises(ValueError, match="call init_cache first"):
        layer(x[:, :1])
    expected = layer(x, is_causal=True, decode=False)
    layer.init_cache(x.shape)
    step = nnx.jit(lambda m, token: m(token))
    outputs = [step(layer, x[:, t : t + 1]) for t in range(LENGTH)]
    assert int(layer.cache_index[...]) == LENGTH
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)
    exact = _performer(attention_kind="exact", decode=True)
    mha = nnx.MultiHeadAttention(HEADS, WIDTH, decode=True, rngs=nnx.Rngs(1))
    nnx.update(exact, nnx.state(mha, nnx.Param))
    exact.init_cache(x.shape)
    mha.init_cache(x.shape)
    for t in range(LENGTH):
        token = x[:, t : t + 1]
        np.testing.assert_allclose(exact(token), mha(token), rtol=1e-5, atol=1e-6)


def test_decoding_reads_each_token_key_padding():
    """The Performer's mask while decoding is the new token's key padding (B, 1): the steps
    equal causal attention with the (B, T) padding (tokens 1 and 6 of the second sequence
    padded, seen by the later ones), on the valid tokens."""
    x = _inputs()
    padding = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([1, 6])].set(False)
    layer = _performer(decode=True)
    expected = layer(x, mask=padding, is_causal=True, decode=False)
    layer.init_cache(x.shape)
    steps = [layer(x[:, t : t + 1], mask=padding[:, t : t + 1]) for t in range(LENGTH)]
    valid = np.asarray(padding)
    np.testing.assert_allclose(
        np.asarray(jnp.concatenate(steps, 1))[valid],
        np.asarray(expected)[valid],
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("kind, causal", [("performer", False), ("exact", False), ("exact", True)])
def test_prefill_then_a_compiled_loop_equals_causal_attention(kind, causal):
    # A prompt at once, then a lax.scan of steps without projection_step (the cache's
    # projection: init_cache's step 7), against the causal forward pass at step 7 (which the
    # steps one call at a time equal: the test above). causal: a layer made causal=True (its
    # causal mask while decoding is the cache's, not the prompt's T x T).
    x, prompt = _inputs(), 4
    layer = _performer(attention_kind=kind, decode=True, redraw_interval=5, causal=causal)
    expected = layer(x, is_causal=True, decode=False, projection_step=7)
    layer.init_cache(x.shape, projection_step=7)
    np.testing.assert_allclose(layer(x[:, :prompt]), expected[:, :prompt], rtol=1e-5, atol=1e-6)
    graph, state = nnx.split(layer)

    @jax.jit
    def loop(state, tokens):
        def step(state, token):
            layer = nnx.merge(graph, state)
            out = layer(token[:, None])
            return nnx.state(layer), out[:, 0]

        return jax.lax.scan(step, state, tokens)

    after, looped = loop(state, jnp.moveaxis(x[:, prompt:], 1, 0))
    looped = jnp.moveaxis(looped, 0, 1)
    np.testing.assert_allclose(looped, expected[:, prompt:], rtol=1e-5, atol=1e-5)
    assert int(nnx.merge(graph, after).cache_index[...]) == LENGTH
    with pytest.raises(ValueError, match="starts a sequence: the cache must be empty"):
        layer(x[:, :2])


@pytest.mark.parametrize("kind", ["exact", "performer"])
def test_sow_weights(kind):
    x = _inputs()
    layer = _performer(attention_kind=kind)
    forward = nnx.capture(layer, nnx.Intermediate)
    out, intermediates = forward(x, mask=nn.make_causal_mask(PAD), sow_weights=True)
    (weights,) = intermediates["attention_weights"].get_value()
    assert weights.shape == (BATCH, HEADS, LENGTH, LENGTH)
    np.testing.assert_allclose(jnp.sum(weights, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(jnp.triu(weights, k=1), 0.0)
    heads = jnp.einsum("bnts,bsnh->btnh", weights, layer.value(x))
    np.testing.assert_allclose(layer.out(heads), out, rtol=1e-4, atol=1e-5)
    assert "attention_weights" not in forward(x)[1]


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1, got 0"):
        rnnx.PerformerAttention(0, WIDTH, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="dropout_rate must be 0"):
        rnnx.PerformerAttention(HEADS, WIDTH, dropout_rate=0.1, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="causal must be a bool"):  # "yes" was taken as True
        rnnx.PerformerAttention(HEADS, WIDTH, causal="yes", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="patch_size must be an integer >= 1, got 0"):
        rnnx.PerformerViT(3, image_size=(8, 8), patch_size=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="multiples of patch_size"):
        rnnx.PerformerViT(3, image_size=(8, 9), rngs=nnx.Rngs(0))
    vit = rnnx.PerformerViT(3, image_size=(8, 8), num_features=8, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="images must have shape"):
        vit(jnp.zeros((1, 12, 12)))


def test_empty_batches_and_unbatched_inputs():
    exact = _performer(attention_kind="exact")
    assert exact(jnp.ones((0, LENGTH, WIDTH))).shape == (0, LENGTH, WIDTH)
    x = _inputs()
    for layer in (exact, _performer()):  # an unbatched sequence is a batch of one
        np.testing.assert_allclose(layer(x[0], is_causal=True), layer(x[:1], is_causal=True)[0])


def test_fitted_feature_map_fields_are_state_that_the_attention_uses():
    layer = _performer(feature_map="cluster_hybrid", eps=1e-3, query_key_norm=True)
    fitted = layer.fitted_feature_map.get_value()
    assert set(fitted) == {"query_centres", "key_centres"}
    assert all(value.shape[0] == HEADS for value in fitted.values())
    assert not isinstance(layer.fitted_feature_map, nnx.Param)  # not trained
    x = _inputs()
    before = layer(x)
    centres = jax.random.normal(jax.random.key(5), fitted["query_centres"].shape)
    layer.fitted_feature_map.set_value({"query_centres": centres, "key_centres": centres})
    assert not np.allclose(layer(x), before)
    expected = layer(x, is_causal=True)  # decoding reads the fitted fields too
    layer.init_cache(x.shape)
    steps = [layer(x[:, t : t + 1], decode=True) for t in range(LENGTH)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), expected, rtol=1e-5, atol=1e-5)


def test_the_layer_runs_the_implementation_it_is_given():
    """``implementation=`` reaches ``favor_attention``: the fused kernels (in interpret mode
    here) where asked for, the XLA form otherwise (programs traced only)."""
    x = _inputs()

    def fused(implementation: str) -> bool:
        layer = _performer(implementation=implementation)
        return "pallas_call" in str(jax.make_jaxpr(lambda x: layer(x, x, x, decode=False))(x))

    assert fused("pallas_triton_interpret") and not fused("xla")


def test_the_causal_attribute_makes_the_layer_causal():
    x = _inputs()
    causal = _performer(causal=True)(x)
    np.testing.assert_array_equal(causal, _performer()(x, is_causal=True))
    assert not np.allclose(causal, _performer()(x), atol=1e-3)


def test_the_projection_key_comes_from_the_projection_stream():
    def key_data(rngs: nnx.Rngs) -> np.ndarray:
        layer = rnnx.PerformerAttention(HEADS, WIDTH, num_features=16, rngs=rngs)
        return np.asarray(jax.random.key_data(layer.projection_key[...]))

    np.testing.assert_array_equal(
        key_data(nnx.Rngs(0, projection=3)), key_data(nnx.Rngs(1, projection=3))
    )
    assert not np.array_equal(key_data(nnx.Rngs(0, projection=3)), key_data(nnx.Rngs(0)))


def test_query_key_norm_starts_at_the_initial_temperature():
    layer = _performer(query_key_norm=True, initial_temperature=2.0)
    np.testing.assert_allclose(jnp.exp(layer.log_temperature[...]), [2.0] * HEADS, rtol=1e-6)


def test_eps_floors_favor_and_its_sown_weights_alike():
    """A floor above every denominator (eps=1e3) changes the output; the sown weights are
    those the output applies."""
    x = _inputs()
    layer = _performer(eps=1e3)
    out, intermediates = nnx.capture(layer, nnx.Intermediate)(x, sow_weights=True)
    (weights,) = intermediates["attention_weights"].get_value()
    heads = jnp.einsum("bnts,bsnh->btnh", weights, layer.value(x))
    np.testing.assert_allclose(layer.out(heads), out, rtol=1e-4, atol=1e-6)
    assert not np.allclose(out, _performer()(x), atol=1e-3)


def test_fitted_fields_get_no_gradient():
    layer = _performer(feature_map="cluster_hybrid", eps=1e-3, query_key_norm=True)
    x = _inputs()

    def loss(layer):
        return jnp.sum(layer(x) ** 2)

    grads = nnx.grad(loss, argnums=nnx.DiffState(0, rnnx.FittedFeatureMap))(layer)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(np.all(np.asarray(g) == 0) for g in leaves)


def test_exact_decoding_with_grouped_heads_and_key_padding_is_flax():
    """A (B, L) key padding mask over the cache's L positions, with one key/value head for
    both query heads: ``nnx.MultiHeadAttention``'s steps with the mask (B, 1, 1, L)."""
    x = _inputs()
    padding = jnp.ones((BATCH, LENGTH), bool).at[1, jnp.array([1, 6])].set(False)
    mha = nnx.MultiHeadAttention(HEADS, WIDTH, num_kv_heads=1, decode=True, rngs=nnx.Rngs(1))
    ours = _performer(attention_kind="exact", num_kv_heads=1, decode=True)
    nnx.update(ours, nnx.state(mha, nnx.Param))
    for dtype in (jnp.bfloat16, jnp.float32):  # Flax's cache, then steps in float32
        ours.init_cache(x.shape, dtype)
        mha.init_cache(x.shape, dtype)
        for name in ("cached_key", "cached_value", "cache_index"):
            mine, theirs = getattr(ours, name)[...], getattr(mha, name)[...]
            assert (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype), name
    for t in range(LENGTH):
        token = x[:, t : t + 1]
        expected = mha(token, mask=padding[:, None, None, :])
        np.testing.assert_allclose(ours(token, mask=padding), expected, rtol=1e-5, atol=1e-6)


def test_init_cache_keeps_the_decode_state_in_the_given_dtype():
    layer = _performer()
    with jax.enable_x64(True):  # float64 (lower precisions accumulate in float32)
        layer.init_cache((BATCH, LENGTH, WIDTH), jnp.float64)
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(layer.decode_state.get_value())}
    assert dtypes == {jnp.dtype(jnp.float64)}


def test_decoding_with_two_batch_axes_equals_causal_attention():
    x = jnp.stack([_inputs(0), _inputs(1)])[..., :4, :]  # (2, B, 4, D)
    layer = _performer(decode=True)
    expected = layer(x, is_causal=True, decode=False)
    layer.init_cache(x.shape)
    outputs = [layer(x[..., t : t + 1, :]) for t in range(x.shape[-2])]
    np.testing.assert_allclose(jnp.concatenate(outputs, -2), expected, rtol=1e-5, atol=1e-5)


def test_nnx_view_sets_evaluation_and_decoding_as_for_flax_attention():
    """``nnx.view(model, deterministic=True)`` turns the exact kind's dropout off (it was left
    on: the layer had no ``set_view``); ``decode=True`` with ``batch_size`` and ``max_length``
    creates the cache, and the view decodes as the causal pass."""
    x = _inputs()
    dropping = _performer(attention_kind="exact", dropout_rate=0.5, deterministic=False)
    evaluation = nnx.view(dropping, deterministic=True)
    np.testing.assert_array_equal(evaluation(x), evaluation(x))
    layer = _performer()
    decoding = nnx.view(layer, decode=True, batch_size=BATCH, max_length=LENGTH)
    steps = [decoding(x[:, t : t + 1]) for t in range(LENGTH)]
    expected = layer(x, is_causal=True)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="max_length"):
        nnx.view(_performer(), decode=True, batch_size=BATCH)
