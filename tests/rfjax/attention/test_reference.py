"""Tests of ``rfjax.attention._reference``: softmax attention against JAX's own."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import attention
from tests.support.favor_inputs import LENGTH, make_inputs


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
