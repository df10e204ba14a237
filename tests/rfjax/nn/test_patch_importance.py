"""Tests of ``rfjax.nn._patch_importance``: the linear-time patch importance equals the column sums
of the explicit attention (random-feature and exact)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention import favor_attention_weights, softmax_attention
from tests.support.iap_policy import policy_of, queries_keys

RANDOM_FEATURE_KINDS = [
    ("positive", "orthogonal"),
    ("trigonometric", "gaussian"),
    ("angular_hybrid", "orthogonal"),
    ("gaussian_hybrid", "orthogonal"),
]


@pytest.mark.parametrize(("attention", "coupling"), RANDOM_FEATURE_KINDS)
def test_linear_time_importance_equals_explicit_attention_column_sums(attention, coupling):
    with jax.enable_x64(True):
        policy = policy_of(attention, coupling=coupling)
        query, key = queries_keys(policy, jnp.float64)
        drawn = jax.tree.map(
            lambda x: x.astype(jnp.float64), policy.draw_projection(jax.random.key(3))
        )
        fast = policy.patch_importance(query, key, drawn)
        weights = favor_attention_weights(
            query[None, :, None],
            key[None, :, None],
            drawn.projection,
            feature_map=drawn.feature_map,
        )  # (1, 1, T, T), formed explicitly
        explicit = jnp.sum(weights[0, 0], axis=0)
        assert fast.dtype == jnp.float64
        np.testing.assert_allclose(fast, explicit, rtol=1e-10, atol=0)
        assert float(jnp.sum(fast)) == pytest.approx(policy.num_patches(), rel=1e-10)


def test_exact_importance_equals_softmax_attention_column_sums():
    with jax.enable_x64(True):
        policy = policy_of("exact")
        query, key = queries_keys(policy, jnp.float64)
        count = policy.num_patches()
        # softmax_attention with identity values returns the attention matrix itself.
        matrix = softmax_attention(
            query[None, :, None],
            key[None, :, None],
            jnp.eye(count, dtype=jnp.float64)[None, :, None],
        )[0, :, 0]
        np.testing.assert_allclose(
            policy.patch_importance(query, key, None), matrix.sum(axis=0), rtol=1e-10, atol=0
        )
