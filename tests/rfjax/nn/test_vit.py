"""Tests of ``rfjax.nn._vit``: PerformerViT's layers draw their own projections, and its query-key
norm scores unit queries and keys with a learned temperature."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import PerformerViT


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
