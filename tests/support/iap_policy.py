"""A small Implicit Attention Policy and its unit-scaled queries and keys, shared by the tests of
``rfjax.nn._iap`` and ``rfjax.nn._patch_importance``."""

import jax
import jax.numpy as jnp

from rfjax.nn import (
    ImplicitAttentionPolicy,
)

SHAPE = (6, 6, 2)


def policy_of(attention="positive", **overrides):
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


def queries_keys(policy, dtype=jnp.float32):
    """Unit-scaled queries and keys as the policy makes them, (T, d)."""
    q, k = jax.random.normal(jax.random.key(11), (2, policy.num_patches(), policy.embed_dim))
    return policy._unit_scaled(q.astype(dtype)), policy._unit_scaled(k.astype(dtype))
