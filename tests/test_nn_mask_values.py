"""The values of a mask given to the Performer (FAVOR) kind of ``PerformerAttention`` (issue 32
item 4): FAVOR applies boolean masks and Flax's 0/1 masks (1 = attend); a float mask with other
values (an additive mask: 0 = attend, -inf or -1e9 = masked) used to be read as ``mask != 0``,
i.e. inverted, without an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from rfjax.nn import PerformerAttention
from rfjax.nn import nnx as rnnx

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
