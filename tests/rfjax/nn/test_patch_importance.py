"""Tests of ``rfjax.nn._patch_importance``: the linear-time patch importance equals the column sums
of the explicit attention (random-feature and exact)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, features, projections
from rfjax.attention import favor_attention_weights, softmax_attention
from rfjax.nn import random_feature_importance
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


@pytest.mark.parametrize("name", ["positive", "cluster_hybrid"])
def test_exponential_maps_keep_every_row_at_large_norms(name):
    # |x'| ~ 17 in float32: with one shift for all keys, 9 of 16 rows' normalisers underflowed
    # to the floor and the importances summed to 6.9; per-feature shifts keep each row's
    # largest term at 1, so they sum to T and equal the explicit weights' column sums.
    query, key = 10.0 * jax.random.normal(jax.random.key(0), (2, 16, 8))
    projection = projections.orthogonal(jax.random.key(1), 8, 64)
    scaled = [x * attention.data_normalizer(8) for x in (query, key)]
    fmap = features.get(name)().init(jax.random.key(2), 8).fit(jax.random.key(3), *scaled)
    fast = random_feature_importance(query, key, projection, feature_map=fmap, eps=1e-6)
    weights = favor_attention_weights(
        query[None, :, None], key[None, :, None], projection, feature_map=fmap, eps=1e-6
    )
    # Entries of at most T; float32 rounding of a few eps per term over 16 rows.
    np.testing.assert_allclose(fast, jnp.sum(weights[0, 0], axis=0), rtol=0, atol=1e-5)
    assert float(jnp.sum(fast)) == pytest.approx(16.0, rel=1e-5)


def test_row_normalisers_are_floored_at_eps():
    """A_tj = phi_t.psi_j / max(D_t, eps): at a small eps the importances sum to T; at eps
    above every (shifted, at most T m) normaliser each row is divided by eps, so eps c does
    not depend on eps."""
    q, k = jax.random.normal(jax.random.key(0), (2, 16, 4))
    w = projections.orthogonal(jax.random.key(1), 4, 8)

    def importance(eps):
        return random_feature_importance(q, k, w, feature_map=features.get("positive")(), eps=eps)

    np.testing.assert_allclose(importance(1e-6).sum(), 16.0, rtol=1e-5)
    np.testing.assert_allclose(importance(1e6) * 1e6, importance(1e7) * 1e7, rtol=1e-5)
    assert float(importance(1e6).sum()) < 16 * 16 * 8 / 1e6
