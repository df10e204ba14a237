"""Tests of ``rfjax.nn._vit``: PerformerViT's layers draw their own projections, its query-key
norm scores unit queries and keys with a learned temperature, its tokens, blocks, pooling and
head are the ViT's, and the NNX model computes the linen one."""

import functools
import operator
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import PerformerViT
from tests.support.module_calls import assert_pre_norm_block, recorded_calls


def test_layers_draw_different_projections():
    vit = PerformerViT(num_classes=3, num_layers=2, coupling="gaussian", num_features=8)
    images = jnp.ones((1, 28, 28))
    variables = vit.init(jax.random.key(0), images)
    _, state = vit.apply(
        variables, images, rngs={"projection": jax.random.key(1)}, mutable=["intermediates"]
    )
    first = state["intermediates"]["block_0"]["PerformerAttention_0"]["projection"][0]  # unchanged
    second = state["intermediates"]["block_1"]["PerformerAttention_0"]["projection"][0]
    assert not np.allclose(first, second)


def test_vit_query_key_norm_scores_unit_queries_and_keys_with_a_learned_temperature():
    """PerformerViT(query_key_norm=True): each block's attention holds a per-head
    log_temperature at log(initial_temperature) (linen and NNX alike), and its queries and
    keys enter the attention (scored q'.k' / sqrt(H), H = 8) with norm sqrt(tau) H^(1/4), so
    that q'.k' / sqrt(H) = tau q^.k^."""
    from flax import nnx

    from rfjax.nn import nnx as rnnx

    options = {"num_layers": 2, "num_heads": 2, "hidden_size": 16, "num_features": 8}
    options |= {"query_key_norm": True, "initial_temperature": 3.0}
    vit = PerformerViT(num_classes=3, **options)
    images = jax.random.normal(jax.random.key(0), (2, 28, 28))
    variables = vit.init(jax.random.key(1), images)
    for block in ("block_0", "block_1"):
        temperature = variables["params"][block]["PerformerAttention_0"]["log_temperature"]
        np.testing.assert_allclose(temperature, np.log(3.0) * np.ones(2), rtol=1e-6)
    _, state = vit.apply(
        variables, images, rngs={"projection": jax.random.key(2)}, mutable=["intermediates"]
    )
    (query,) = state["intermediates"]["block_0"]["PerformerAttention_0"]["query_heads"]
    np.testing.assert_allclose(np.linalg.norm(query, axis=-1), np.sqrt(3.0) * 8**0.25, rtol=1e-5)
    assert (
        "log_temperature"
        not in PerformerViT(num_classes=3).init(jax.random.key(1), images)["params"]["block_0"][
            "PerformerAttention_0"
        ]
    )
    nnx_vit = rnnx.PerformerViT(3, image_size=(28, 28), rngs=nnx.Rngs(0), **options)
    for block in nnx_vit.blocks:
        np.testing.assert_allclose(block.attention.log_temperature[...], np.log(3.0), rtol=1e-6)


def test_images_of_another_rank_raise_naming_them():
    """(H, W) and 5-D batches: an unpacking error and a message about the wrong axes before."""
    vit = PerformerViT(num_classes=3, num_layers=1, coupling="gaussian", num_features=8)
    for shape in ((8, 8), (1, 3, 8, 8, 1)):
        with pytest.raises(
            ValueError, match=r"images must be \(B, H, W\) .*" + re.escape(str(shape))
        ):
            vit.init(jax.random.key(0), jnp.ones(shape))


@pytest.mark.parametrize("rate", [-0.5, 1.0, 1.5])
def test_a_dropout_rate_outside_0_1_raises_naming_it(rate):
    """Accepted before, linen and NNX: -0.5 scaled every kept unit by 1 / 1.5 and 1.5 dropped
    them all, silently (the LSTM LM and the Conformer refused them)."""
    from flax import nnx

    from rfjax.nn import nnx as rnnx

    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\)"):
        PerformerViT(num_classes=3, dropout_rate=rate).init(jax.random.key(0), jnp.ones((1, 8, 8)))
    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\)"):
        rnnx.PerformerViT(3, image_size=(8, 8), dropout_rate=rate, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_head_reads_the_pooled_token(pooling):
    """The head (given a random kernel: it starts at 0) reads the final LayerNorm's class
    token (``"cls"``, prepended: position 0) or the mean of the tokens (``"mean"``)."""
    model = PerformerViT(
        num_classes=3,
        patch_size=4,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        num_features=8,
        pooling=pooling,
    )
    images = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
    rngs = {"projection": jax.random.key(2)}
    params = model.init(jax.random.key(1), images)["params"]
    kernel = jax.random.normal(jax.random.key(3), params["head"]["kernel"].shape)
    params = {**params, "head": {**params["head"], "kernel": kernel}}
    logits, state = model.apply({"params": params}, images, rngs=rngs, capture_intermediates=True)
    (tokens,) = state["intermediates"]["encoder_norm"]["__call__"]  # (B, T (+ 1), D)
    assert tokens.shape[1] == 4 + (pooling == "cls")
    pooled = tokens[:, 0] if pooling == "cls" else tokens.mean(axis=1)
    np.testing.assert_allclose(logits, pooled @ kernel + params["head"]["bias"], atol=1e-5)


SMALL = dict(patch_size=4, hidden_size=8, num_heads=2, mlp_dim=16, attention_kind="exact")
NNX_NAMES = {
    "attention_norm": "LayerNorm_0",
    "attention": "PerformerAttention_0",
    "mlp_norm": "LayerNorm_1",
    "mlp_in": "Dense_0",
    "mlp_out": "Dense_1",
}


def _random_params(model: PerformerViT, images: jax.Array) -> dict:
    """The model's parameters, every entry redrawn N(0, 1) (the class token and the head start
    at 0, which would hide where they are read)."""
    leaves, tree = jax.tree.flatten(model.init(jax.random.key(0), images)["params"])
    draws = [jax.random.normal(jax.random.key(i), x.shape) for i, x in enumerate(leaves)]
    return jax.tree.unflatten(tree, draws)


def _layer_norm(x, params):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + 1e-6) * params["scale"] + params["bias"]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_tokens_are_row_major_patches_with_positions(pooling):
    """No block: logits = head(tanh(pre_logits(pool(LN(tokens))))), the tokens the class token
    (first) and the patches in row-major order, each its p x p x C pixels times the embedding
    kernel, plus the learned positions. The head starts at 0."""
    model = PerformerViT(3, num_layers=0, pooling=pooling, representation_size=5, **SMALL)
    images = jax.random.normal(jax.random.key(1), (2, 8, 12, 3))  # 2 x 3 patches
    assert not np.any(model.apply(model.init(jax.random.key(0), images), images))
    params = _random_params(model, images)
    patches = images.reshape(2, 2, 4, 3, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 6, 48)
    embedding = params["embedding"]
    tokens = patches @ embedding["kernel"].reshape(48, 8) + embedding["bias"]
    if pooling == "cls":
        tokens = jnp.concatenate([jnp.broadcast_to(params["cls"], (2, 1, 8)), tokens], 1)
    tokens = _layer_norm(tokens + params["position_embedding"], params["encoder_norm"])
    pooled = tokens[:, 0] if pooling == "cls" else tokens.mean(1)
    hidden = jnp.tanh(pooled @ params["pre_logits"]["kernel"] + params["pre_logits"]["bias"])
    expected = hidden @ params["head"]["kernel"] + params["head"]["bias"]
    logits = model.apply({"params": params}, images)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_block_is_pre_norm_with_residuals_and_dropout_only_in_training():
    """From the recorded module calls: x + Attn(LN(x)), then x + Dense(gelu(Dense(LN(x)))).
    With dropout_rate = 0.5: the same outputs when not training (no "dropout" stream needed),
    others when training."""
    model = PerformerViT(3, num_layers=1, **SMALL)
    images = jax.random.normal(jax.random.key(1), (2, 8, 8))
    variables = {"params": _random_params(model, images)}
    with recorded_calls() as calls:
        logits = model.apply(variables, images)

    assert_pre_norm_block(calls, "block_0", "PerformerAttention_0")
    noisy = PerformerViT(3, num_layers=1, dropout_rate=0.5, **SMALL)
    np.testing.assert_allclose(noisy.apply(variables, images), logits, rtol=1e-5, atol=1e-5)
    trained = noisy.apply(variables, images, train=True, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(trained, logits)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_nnx_vit_computes_the_linen_vit(pooling):
    """The NNX PerformerViT given the linen model's parameters (renamed) returns its logits
    (dropout 0.5, not training: none applied), whichever the pooling."""
    from flax import nnx

    from rfjax.nn import nnx as rnnx

    options = SMALL | dict(num_layers=2, pooling=pooling, representation_size=5)
    images = jax.random.normal(jax.random.key(1), (2, 8, 12, 3))
    linen = PerformerViT(3, **options)
    params = _random_params(linen, images)
    model = rnnx.PerformerViT(
        3, image_size=(8, 12), channels=3, dropout_rate=0.5, rngs=nnx.Rngs(0), **options
    )
    flat = []
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        linen_path = path
        if path[0] == "blocks":
            _, index, module, *rest = path
            linen_path = (f"block_{index}", NNX_NAMES[module], *rest)
        value = functools.reduce(operator.getitem, linen_path, params)
        flat.append((path, variable.replace(value)))
    nnx.update(model, nnx.from_flat_state(flat))
    np.testing.assert_allclose(model(images), linen.apply({"params": params}, images), atol=1e-5)
