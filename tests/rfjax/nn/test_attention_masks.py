"""Masks of the Performer (FAVOR) kind of ``PerformerAttention`` (``rfjax.nn._attention_masks``):
Flax's masks read as key padding and causality, eagerly and traced; and their values (issue 32
item 4): FAVOR applies boolean masks and Flax's 0/1 masks (1 = attend); a float mask with other
values (an additive mask: 0 = attend, -inf or -1e9 = masked) used to be read as ``mask != 0``,
i.e. inverted, without an error."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from rfjax.nn import PerformerAttention
from rfjax.nn import nnx as rnnx
from rfjax.nn._attention_masks import favor_mask

BATCH, LENGTH, FEATURES, HEADS = 2, 8, 16, 2
PAD = jnp.arange(LENGTH)[None, :] < jnp.array([[5], [LENGTH]])  # (B, S)
RNGS = {"projection": jax.random.key(0)}


def additive(mask):
    """The additive form of a boolean mask: 0 where attended, -1e9 where masked."""
    return jnp.where(mask, 0.0, -1e9).astype(jnp.float32)


def layers():
    """(name, call(x, mask)) for the linen and the NNX layer, eager and jitted."""
    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, FEATURES))
    linen = PerformerAttention(num_heads=HEADS, num_features=8)
    params = linen.init(jax.random.key(2), x)
    layer = rnnx.PerformerAttention(HEADS, FEATURES, num_features=8, rngs=nnx.Rngs(3))

    def linen_call(mask):
        return linen.apply(params, x, mask=mask, rngs=RNGS)

    def nnx_call(mask):
        return layer(x, mask=mask)

    return {
        "linen": linen_call,
        "linen_jit": jax.jit(linen_call),
        "nnx": nnx_call,
        "nnx_jit": jax.jit(nnx_call),
    }


def _read(mask, key_length=LENGTH):
    """``favor_mask`` of T = LENGTH queries against ``key_length`` keys, not causal."""
    return favor_mask(
        mask,
        batch_shape=(BATCH,),
        num_heads=HEADS,
        query_length=LENGTH,
        key_length=key_length,
        causal=False,
    )


@pytest.mark.parametrize(
    "form",
    [
        PAD,  # (B, S) key padding
        # The further layouts run with --runstatistical (CI): each compiles four layers' calls.
        pytest.param(PAD[:, None, None, :], marks=pytest.mark.statistical),  # (B, 1, 1, S)
        pytest.param(  # (B, 1, T, S)
            nn.make_attention_mask(PAD, PAD, dtype=bool), marks=pytest.mark.statistical
        ),
    ],
    ids=["key_padding", "broadcast", "flax_padding"],
)
def test_additive_masks_are_rejected_and_flax_float_masks_accepted(form):
    for name, call in layers().items():
        expected = np.asarray(call(form))
        # Flax's 0/1 float mask (make_attention_mask's default dtype) means the same.
        np.testing.assert_array_equal(call(form.astype(jnp.float32)), expected, err_msg=name)
        error = ValueError if not name.endswith("jit") else Exception  # at run time under jit
        with pytest.raises(error, match=r"additive mask.*values other than 0 and 1"):
            jax.block_until_ready(call(additive(form)))
        with pytest.raises(error, match=r"values other than 0 and 1"):
            jax.block_until_ready(call(2 * form.astype(jnp.int32)))


@pytest.mark.parametrize(
    ("mask", "padded", "causal"),
    [
        (nn.make_attention_mask(PAD, PAD), True, False),
        (nn.make_attention_mask(jnp.ones_like(PAD), PAD), True, False),
        (nn.make_causal_mask(PAD), False, True),
        (nn.combine_masks(nn.make_causal_mask(PAD), nn.make_attention_mask(PAD, PAD)), True, True),
        (jnp.broadcast_to(nn.make_causal_mask(PAD), (BATCH, HEADS, LENGTH, LENGTH)), False, True),
    ],
    ids=["padding", "key_padding", "causal", "causal_padding", "per_head"],
)
def test_flax_masks_read_as_key_padding_and_causality(mask, padded, causal):
    """The decomposition itself: the key padding it keeps and the causality it finds, as a
    Python bool for a concrete mask and as a traced one inside ``jit``."""
    expected = PAD if padded else jnp.ones_like(PAD)
    got = _read(mask)
    assert got.causal is causal
    np.testing.assert_array_equal(got.key_padding, expected)
    traced = jax.jit(_read)(mask)
    assert bool(traced.causal) is causal
    np.testing.assert_array_equal(traced.key_padding, expected)


@pytest.mark.parametrize("keys", [LENGTH - 3, LENGTH + 3])
def test_a_cross_attention_mask_is_key_padding(keys):
    """A Flax mask of T queries and S != T keys (``nn.make_attention_mask(q_pad, k_pad)``)
    is key padding, eagerly and traced: it raised JAX's "Incompatible shapes for
    broadcasting" (its causal form was compared with a T x T triangle whatever S)."""
    key_padding = jnp.arange(keys)[None, :] < jnp.array([[keys - 2], [keys]])  # (B, S)
    mask = nn.make_attention_mask(jnp.ones((BATCH, LENGTH), bool), key_padding)
    read = functools.partial(_read, key_length=keys)
    for got in (read(mask), jax.jit(read)(mask)):
        assert not bool(got.causal)
        np.testing.assert_array_equal(got.key_padding, key_padding)
    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, FEATURES))
    context = jax.random.normal(jax.random.key(4), (BATCH, keys, FEATURES))
    layer = PerformerAttention(num_heads=HEADS, num_features=8)
    params = layer.init(jax.random.key(2), x, context)
    np.testing.assert_allclose(
        layer.apply(params, x, context, mask=mask, rngs=RNGS),
        layer.apply(params, x, context, mask=key_padding, rngs=RNGS),
        rtol=1e-6,
    )
    nnx_layer = rnnx.PerformerAttention(HEADS, FEATURES, num_features=8, rngs=nnx.Rngs(3))
    np.testing.assert_allclose(
        nnx_layer(x, context, mask=mask), nnx_layer(x, context, mask=key_padding), rtol=1e-6
    )
    with pytest.raises(ValueError, match="neither"):  # a causal-looking T x S mask is not one
        read(jnp.tri(LENGTH, keys, dtype=bool)[None, None])
