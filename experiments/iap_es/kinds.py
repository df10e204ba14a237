"""The attention kinds of the IAP + ES study (``"<attention>[:m[xn]]"``), their labels, and the
environment, policy and rollout a kind trains in.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_collections
import pgx

from experiments.core import cost
from experiments.core.train import es
from rfjax import features as feature_maps
from rfjax.nn import IAP_ATTENTIONS, ImplicitAttentionPolicy

_KIND = re.compile(r"^(?P<attention>[a-z_]+)(:(?P<m>\d+)(x(?P<n>\d+))?)?$")
_FLOP_FIELDS = ("importance_flops", "xla_importance_flops")
_INFERENCE_STREAM = 7  # fold_in tag of the inference-swap episodes (training uses split(key, 3))
_NAMES = {
    "exact": "exact softmax",
    "positive": "FAVOR+",
    "trigonometric": "trigonometric",
    "angular_hybrid": "HRF angular",
    "gaussian_hybrid": "HRF Gaussian",
}


def parse_kind(kind: str) -> dict:
    """``"exact"``, ``"positive:256"``, ``"angular_hybrid:8x8"`` (m x n) -> policy attributes."""
    match = _KIND.match(kind) if isinstance(kind, str) else None
    if match is None or match["attention"] not in IAP_ATTENTIONS:
        raise ValueError(
            f"kinds must hold 'exact' or '<attention>:<m>' or '<hybrid>:<m>x<n>' with attention "
            f"in {IAP_ATTENTIONS}; got {kind!r}"
        )
    attention = match["attention"]
    hybrid = attention.endswith("_hybrid")
    if (attention == "exact") != (match["m"] is None) or hybrid != (match["n"] is not None):
        raise ValueError(
            f"kind {kind!r}: exact takes no size, FAVOR+/trigonometric take ':m', hybrids ':mxn'"
        )
    spec = {"attention": attention}
    if match["m"] is not None:
        spec["num_features"] = int(match["m"])
    if match["n"] is not None:
        spec["num_sign_features"] = int(match["n"])
    return spec


def kind_label(kind: str) -> str:
    spec = parse_kind(kind)
    name = _NAMES.get(spec["attention"]) or feature_maps.info(spec["attention"]).label
    if "num_sign_features" in spec:
        return f"{name} {spec['num_features']}x{spec['num_sign_features']}"
    return f"{name} m={spec['num_features']}" if "num_features" in spec else name


def run_name(kind: str) -> str:
    return kind.replace(":", "_m")


def make_env(config: ml_collections.ConfigDict):
    if config.env not in pgx.available_envs():
        raise ValueError(f"env must be a Pgx environment, got {config.env!r}")
    return pgx.make(config.env)


def make_policy(config: ml_collections.ConfigDict, env, kind: str) -> ImplicitAttentionPolicy:
    return ImplicitAttentionPolicy(
        image_shape=tuple(env.observation_shape),
        num_actions=env.num_actions,
        **config.policy.to_dict(),
        **parse_kind(kind),
    )


def make_rollout(config: ml_collections.ConfigDict, env, policy) -> es.Rollout:
    def act(params, observation, projection):
        return jnp.argmax(policy.apply(params, observation, projection))

    return es.Rollout(env, act, policy.draw_projection, max_steps=config.max_steps)


def inference_evaluator(rollout: es.Rollout, num_episodes: int):
    """A jitted ``(params, key) -> returns`` of ``num_episodes`` episodes of one policy played
    with ``rollout``'s attention (the inference swap: any kind's trained parameters fit every
    kind's policy, they share one layout)."""

    @jax.jit
    def returns(params, key):
        totals, _ = rollout.returns(jax.tree.map(lambda x: x[None], params), key, num_episodes)
        return totals[0]

    return returns


def xla_importance_flops(policy: ImplicitAttentionPolicy) -> float:
    """XLA's FLOP count (``cost_analysis``) of one patch-importance computation."""
    count, d = policy.num_patches(), policy.embed_dim
    query = jax.ShapeDtypeStruct((count, d), jnp.float32)
    projection = jax.eval_shape(policy.draw_projection, jax.random.key(0))
    return cost.compiled_flops(policy.patch_importance, query, query, projection)
