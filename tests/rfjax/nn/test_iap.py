"""Implicit Attention Policy: linear-time patch importance, top-k masking, purity, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from rfjax.nn import (
    image_patches,
    patch_centres,
    random_feature_importance,
    top_k_mask,
)
from tests.support.iap_policy import SHAPE, policy_of, queries_keys


def test_patches_and_their_centres_in_row_major_patch_order():
    """Patch (i, j) of a 2 x 3 grid (a 4 x 6 image, P = 2) is token i * 3 + j: its P x P x C
    pixels, and its centre ((i + 1/2) / 2, (j + 1/2) / 3) mapped to [-1, 1], written out."""
    image = np.arange(4 * 6 * 2, dtype=np.float32).reshape(4, 6, 2)
    patches = np.asarray(image_patches(image, 2))
    centres = np.asarray(patch_centres(4, 6, 2))
    assert patches.shape == (6, 8) and centres.shape == (6, 2)
    for i in range(2):
        for j in range(3):
            token = i * 3 + j
            np.testing.assert_array_equal(
                patches[token], image[2 * i : 2 * i + 2, 2 * j : 2 * j + 2].reshape(-1)
            )
            expected = [(i + 0.5) / 2 * 2 - 1, (j + 0.5) / 3 * 2 - 1]
            np.testing.assert_allclose(centres[token], expected, rtol=1e-6)


def test_scaled_queries_and_keys_score_the_temperature_times_the_cosine():
    """q.k / sqrt(d) = tau cos(q, k) for the scaled queries and keys (the class docstring's
    step 2), the cosines of the unscaled ones computed here."""
    policy = policy_of(temperature=0.7)
    raw = np.asarray(jax.random.normal(jax.random.key(11), (2, 36, 4)), np.float64)
    q, k = (np.asarray(x, np.float64) for x in queries_keys(policy))
    unit = raw / np.linalg.norm(raw, axis=-1, keepdims=True)
    cosines = unit[0] @ unit[1].T
    np.testing.assert_allclose(q @ k.T / math.sqrt(4), 0.7 * cosines, rtol=1e-5, atol=1e-6)


def test_top_k_mask_is_permutation_equivariant_over_patches():
    importance = jax.random.normal(jax.random.key(0), (4, 36))
    permutation = jax.random.permutation(jax.random.key(1), 36)
    mask = top_k_mask(importance, 5)
    np.testing.assert_array_equal(top_k_mask(importance[:, permutation], 5), mask[:, permutation])
    assert mask.sum(axis=-1).tolist() == [5] * 4
    assert bool(jnp.all(jnp.where(mask, importance, -jnp.inf).max(-1) >= importance.max(-1)))


@pytest.mark.parametrize("attention", ["exact", "positive", "angular_hybrid"])
def test_importance_is_permutation_equivariant_over_patches(attention):
    policy = policy_of(attention)
    query, key = queries_keys(policy)
    projection = policy.draw_projection(jax.random.key(3))
    permutation = jax.random.permutation(jax.random.key(4), policy.num_patches())
    importance = policy.patch_importance(query, key, projection)
    permuted = policy.patch_importance(query[permutation], key[permutation], projection)
    np.testing.assert_allclose(permuted, importance[permutation], rtol=1e-5)
    np.testing.assert_array_equal(
        top_k_mask(permuted, policy.num_kept), top_k_mask(importance, policy.num_kept)[permutation]
    )


def test_controller_reads_only_the_top_k_patches():
    policy = policy_of("exact", hidden_sizes=())
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
    policy = policy_of(attention)
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
    policy = policy_of("angular_hybrid")
    images = jax.random.bernoulli(jax.random.key(0), 0.4, (3, *SHAPE))
    projection = policy.draw_projection(jax.random.key(2))
    params = policy.init(jax.random.key(1), images[0], projection)
    batched = policy.apply(params, images, projection)
    single = jnp.stack([policy.apply(params, image, projection) for image in images])
    np.testing.assert_allclose(batched, single, rtol=1e-5)


def test_bad_inputs_raise_errors_naming_the_argument():
    policy = policy_of("positive")
    projection = policy.draw_projection(jax.random.key(0))
    params = policy.init(jax.random.key(1), jnp.zeros(SHAPE), projection)
    with pytest.raises(ValueError, match="observation must have shape"):
        policy.apply(params, jnp.zeros((6, 5, 2)), projection)
    with pytest.raises(ValueError, match="num_kept must be <= the number of patches T = 9"):
        policy_of(num_kept=10, patch_size=2).num_patches()
    with pytest.raises(ValueError, match="attention must be one of"):
        policy_of("favour").draw_projection(jax.random.key(0))
    with pytest.raises(ValueError, match="multiples of patch_size"):
        policy_of(patch_size=4).num_patches()
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


@pytest.mark.parametrize("temperature", [-1.0, 0.0, float("nan"), "hot"])
def test_a_bad_temperature_raises_naming_it_for_exact_attention_too(temperature):
    """Exact attention did not check it: -1 raised "math domain error", "hot" a sequence
    multiplication error, and 0 or NaN gave logits (every query scaled to 0 or NaN)."""
    policy = policy_of("exact", temperature=temperature)
    with pytest.raises((TypeError, ValueError), match="temperature must be"):
        policy.init(jax.random.key(1), jnp.zeros(SHAPE), None)


def test_policy_computes_its_docstring_steps_written_out():
    """Steps 1-5 of the class docstring in float64 numpy from the parameters: tokens are the
    patch pixels and centres, queries and keys come from their own layers, the importance is
    the column sums of the row-softmax of q.k / sqrt(d), the controller is a tanh MLP of the
    image with the dropped patches zeroed."""
    policy = policy_of("exact", patch_size=2, hidden_sizes=(5,), num_kept=4)
    image = jax.random.uniform(jax.random.key(0), SHAPE)
    params = policy.init(jax.random.key(1), image, None)
    logits, state = policy.apply(params, image, None, mutable="intermediates")
    layers = {
        name: {k: np.asarray(v, np.float64) for k, v in p.items()}
        for name, p in params["params"].items()
    }

    def dense(name, x):
        return x @ layers[name]["kernel"] + layers[name]["bias"]

    def unit_scaled(x):  # unit length, then sqrt(tau sqrt(d)) with tau = 1, d = 4
        return x / np.linalg.norm(x, axis=-1, keepdims=True) * math.sqrt(math.sqrt(4))

    patches = np.asarray(image_patches(image, 2), np.float64)  # (9, 8)
    tokens = np.concatenate([patches, np.asarray(patch_centres(6, 6, 2), np.float64)], axis=-1)
    query, key = unit_scaled(dense("query", tokens)), unit_scaled(dense("key", tokens))
    scores = np.exp(query @ key.T / math.sqrt(4))
    importance = (scores / scores.sum(axis=1, keepdims=True)).sum(axis=0)
    np.testing.assert_allclose(state["intermediates"]["importance"][0], importance, rtol=1e-5)
    kept = np.argsort(-importance)[:4]
    mask = np.isin(np.arange(9), kept)
    np.testing.assert_array_equal(state["intermediates"]["mask"][0], mask)
    hidden = np.tanh(dense("controller_0", np.where(mask[:, None], patches, 0.0).reshape(-1)))
    np.testing.assert_allclose(logits, dense("logits", hidden), rtol=1e-5, atol=1e-6)


def test_every_patch_may_be_kept():
    """num_kept = T and k = T are allowed (1 <= k <= T): the mask keeps every patch."""
    assert policy_of(num_kept=9, patch_size=2).num_patches() == 9
    assert top_k_mask(jnp.array([0.3, -1.0, 2.0]), 3).tolist() == [True, True, True]


def test_gaussian_hybrid_bandwidth_and_radius_are_the_root_temperature():
    """The scaled queries and keys have length sqrt(tau): the map is built for that radius."""
    feature_map = policy_of("gaussian_hybrid", temperature=0.5).feature_map()
    assert feature_map.bandwidth == feature_map.radius == pytest.approx(math.sqrt(0.5))


def test_policy_floors_the_row_normalisers_at_its_eps():
    policy = policy_of("positive", eps=1e3)  # above every normaliser: the floor decides
    query, key = queries_keys(policy)
    projection = policy.draw_projection(jax.random.key(3))

    def importance(eps):
        return random_feature_importance(
            query, key, projection.projection, feature_map=projection.feature_map, eps=eps
        )

    np.testing.assert_allclose(
        policy.patch_importance(query, key, projection), importance(1e3), rtol=1e-6
    )
    assert not np.allclose(importance(1e3), importance(1.0), rtol=1e-2)
