"""Implicit Attention Policy: linear-time patch importance, top-k masking, purity, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from rfjax.attention import favor_attention_weights, softmax_attention
from rfjax.nn import (
    ImplicitAttentionPolicy,
    image_patches,
    random_feature_importance,
    top_k_mask,
)

SHAPE = (6, 6, 2)
RANDOM_FEATURE_KINDS = [
    ("positive", "orthogonal"),
    ("trigonometric", "gaussian"),
    ("angular_hybrid", "orthogonal"),
    ("gaussian_hybrid", "orthogonal"),
]


def _policy(attention="positive", **overrides):
    settings = dict(
        image_shape=SHAPE,
        num_actions=3,
        patch_size=1,
        num_kept=4,
        embed_dim=4,
        attention=attention,
        num_features=8,
        num_sign_features=3,
    )
    settings.update(overrides)
    return ImplicitAttentionPolicy(**settings)


def _queries_keys(policy, dtype=jnp.float32):
    """Unit-scaled queries and keys as the policy makes them, (T, d)."""
    q, k = jax.random.normal(jax.random.key(11), (2, policy.num_patches(), policy.embed_dim))
    return policy._unit_scaled(q.astype(dtype)), policy._unit_scaled(k.astype(dtype))


@pytest.mark.parametrize(("attention", "coupling"), RANDOM_FEATURE_KINDS)
def test_linear_time_importance_equals_explicit_attention_column_sums(attention, coupling):
    with jax.enable_x64(True):
        policy = _policy(attention, coupling=coupling)
        query, key = _queries_keys(policy, jnp.float64)
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
        policy = _policy("exact")
        query, key = _queries_keys(policy, jnp.float64)
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


def test_top_k_mask_is_permutation_equivariant_over_patches():
    importance = jax.random.normal(jax.random.key(0), (4, 36))
    permutation = jax.random.permutation(jax.random.key(1), 36)
    mask = top_k_mask(importance, 5)
    np.testing.assert_array_equal(top_k_mask(importance[:, permutation], 5), mask[:, permutation])
    assert mask.sum(axis=-1).tolist() == [5] * 4
    assert bool(jnp.all(jnp.where(mask, importance, -jnp.inf).max(-1) >= importance.max(-1)))


@pytest.mark.parametrize("attention", ["exact", "positive", "angular_hybrid"])
def test_importance_is_permutation_equivariant_over_patches(attention):
    policy = _policy(attention)
    query, key = _queries_keys(policy)
    projection = policy.draw_projection(jax.random.key(3))
    permutation = jax.random.permutation(jax.random.key(4), policy.num_patches())
    importance = policy.patch_importance(query, key, projection)
    permuted = policy.patch_importance(query[permutation], key[permutation], projection)
    np.testing.assert_allclose(permuted, importance[permutation], rtol=1e-5)
    np.testing.assert_array_equal(
        top_k_mask(permuted, policy.num_kept), top_k_mask(importance, policy.num_kept)[permutation]
    )


def test_controller_reads_only_the_top_k_patches():
    policy = _policy("exact", hidden_sizes=())
    image = jax.random.uniform(jax.random.key(0), SHAPE, minval=0.5)
    params = policy.init(jax.random.key(1), image, None)
    logits, state = policy.apply(params, image, None, mutable="intermediates")
    importance = state["intermediates"]["importance"][0]
    mask = state["intermediates"]["mask"][0]
    np.testing.assert_array_equal(mask, top_k_mask(importance, policy.num_kept))
    # With no hidden layer the logits are affine in the masked image: dropped patches are 0.
    masked = jnp.where(mask[:, None], image_patches(image, 1), 0.0).reshape(-1)
    layer = params["params"]["logits"]
    np.testing.assert_allclose(logits, masked @ layer["kernel"] + layer["bias"], rtol=1e-5)
    assert int(jnp.sum(jnp.any(masked.reshape(mask.shape[0], -1) != 0, axis=1))) == 4


@pytest.mark.parametrize("attention", ["exact", "positive", "gaussian_hybrid"])
def test_policy_is_a_pure_function_of_params_observation_and_key(attention):
    policy = _policy(attention)
    image = jax.random.bernoulli(jax.random.key(0), 0.4, SHAPE)
    params = policy.init(jax.random.key(1), image, policy.draw_projection(jax.random.key(2)))

    def logits_and_importance(params, observation, key):
        logits, state = policy.apply(
            params, observation, policy.draw_projection(key), mutable="intermediates"
        )
        return logits, state["intermediates"]["importance"][0]

    eager = logits_and_importance(params, image, jax.random.key(5))
    jitted = jax.jit(logits_and_importance)
    for _ in range(2):  # no state carried between calls
        np.testing.assert_allclose(jitted(params, image, jax.random.key(5))[0], eager[0], rtol=1e-5)
    other = jitted(params, image, jax.random.key(6))[1]
    if attention == "exact":
        np.testing.assert_allclose(other, eager[1], rtol=1e-6)
    else:  # the projection key changes the estimate
        assert not np.allclose(other, eager[1], rtol=1e-6)
    # the flat parameter vector that ES perturbs round-trips
    flat, unravel = ravel_pytree(params)
    assert flat.ndim == 1
    np.testing.assert_array_equal(jitted(unravel(flat), image, jax.random.key(5))[0], eager[0])


def test_policy_handles_a_batch_of_observations():
    policy = _policy("angular_hybrid")
    images = jax.random.bernoulli(jax.random.key(0), 0.4, (3, *SHAPE))
    projection = policy.draw_projection(jax.random.key(2))
    params = policy.init(jax.random.key(1), images[0], projection)
    batched = policy.apply(params, images, projection)
    single = jnp.stack([policy.apply(params, image, projection) for image in images])
    np.testing.assert_allclose(batched, single, rtol=1e-5)


def test_bad_inputs_raise_errors_naming_the_argument():
    policy = _policy("positive")
    projection = policy.draw_projection(jax.random.key(0))
    params = policy.init(jax.random.key(1), jnp.zeros(SHAPE), projection)
    with pytest.raises(ValueError, match="observation must have shape"):
        policy.apply(params, jnp.zeros((6, 5, 2)), projection)
    with pytest.raises(ValueError, match="num_kept must be <= the number of patches T = 9"):
        _policy(num_kept=10, patch_size=2).num_patches()
    with pytest.raises(ValueError, match="attention must be one of"):
        _policy("favour").draw_projection(jax.random.key(0))
    with pytest.raises(ValueError, match="multiples of patch_size"):
        _policy(patch_size=4).num_patches()
    with pytest.raises(ValueError, match="projection must be drawn"):
        policy.apply(params, jnp.zeros(SHAPE), None)
    with pytest.raises(ValueError, match="k must be <= the number of patches"):
        top_k_mask(jnp.zeros(3), 4)
    with pytest.raises(ValueError, match="query and key must have the same shape"):
        random_feature_importance(
            jnp.zeros((4, 2)),
            jnp.zeros((5, 2)),
            projection.projection,
            feature_map=projection.feature_map,
            eps=1.0,
        )
