"""A trained Performer-ViT evaluated: accuracy over fresh projections, the attention-matrix
error of each coupling on its queries and keys, and the model with uniform attention.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core.train import distributed
from experiments.core.train import trainer as train
from experiments.performer_vit.task import _normaliser, pixel_stats
from rfjax.attention import draw_projection, favor_attention_weights
from rfjax.nn import PerformerViT


def fresh_draw_accuracies(
    model: PerformerViT,
    params,
    pixel_stats: tuple[float, float],
    test_arrays: dict,
    keys: jax.Array,
    batch_size: int,
    projection_step: int = 0,
) -> np.ndarray:
    """Test accuracy with each key's projection (``rngs={"projection": key}`` at
    ``projection_step``): ``(K,)``.

    ``pixel_stats``: the training images' pixel mean and std (of pixel / 255). Batches are split
    over all devices of all processes (the same accuracies on every process).
    """
    mean, std = pixel_stats

    def correct(params, batch, key, step):
        logits = model.apply(
            params,
            (batch["image"].astype(jnp.float32) / 255 - mean) / std,
            train=False,
            projection_step=step,
            rngs={"projection": key},
        )
        return {"correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) & batch["mask"])}

    totals = [
        distributed.evaluate(
            correct,
            params,
            train.padded_batches(test_arrays, batch_size),
            rng=key,
            step=jnp.int32(projection_step),
        )["correct"]
        for key in keys
    ]
    return np.asarray(totals) / len(test_arrays["label"])


def queries_and_keys(model: PerformerViT, params, images: jax.Array) -> list[tuple]:
    """Per layer, the per-head queries and keys ``(B, T, N, H)`` the trained model attends with."""
    _, state = model.apply(
        params,
        images,
        train=False,
        projection_step=0,
        rngs={"projection": jax.random.key(0)},
        mutable=["intermediates"],
    )
    layers = state["intermediates"]
    return [
        (
            block["PerformerAttention_0"]["query_heads"][0],
            block["PerformerAttention_0"]["key_heads"][0],
        )
        for _, block in sorted(layers.items(), key=lambda item: int(item[0].split("_")[-1]))
    ]


@jax.jit
def _exact_attention(query: jax.Array, key_heads: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(H)) per head: ``(B, N, T, S)``."""
    logits = jnp.einsum("btnh,bsnh->bnts", query, key_heads) / math.sqrt(query.shape[-1])
    return jax.nn.softmax(logits, axis=-1)


def uniform_attention_error(layers: list[tuple[jax.Array, jax.Array]]) -> float:
    """|U - A|_F / |A|_F over all layers, heads and images for the uniform matrix U = 1 / S:
    the error of an estimate that ignores queries and keys, the scale against which a
    random-feature estimate's error says how much of the attention pattern it keeps."""
    squared_error = squared_norm = 0.0
    for query, key_heads in layers:
        exact = _exact_attention(query, key_heads)
        squared_error += float(jnp.sum((exact - 1.0 / exact.shape[-1]) ** 2))
        squared_norm += float(jnp.sum(exact**2))
    return math.sqrt(squared_error / squared_norm)


def learned_temperatures(params) -> list[float]:
    """The learned per-head temperatures tau of every block (``query_key_norm``; [] without)."""
    blocks = sorted(
        (name for name in params["params"] if name.startswith("block_")),
        key=lambda name: int(name.split("_")[-1]),
    )
    return [
        float(t)
        for name in blocks
        if "log_temperature" in (attention := params["params"][name]["PerformerAttention_0"])
        for t in np.exp(np.asarray(attention["log_temperature"]))
    ]


def attention_relative_errors(
    layers: list[tuple[jax.Array, jax.Array]],
    keys: jax.Array,
    *,
    coupling: str,
    num_features: int,
    feature_map: str,
) -> np.ndarray:
    """|A_hat - A|_F / |A|_F over all layers, heads and images, one per key: ``(K,)``.

    A = softmax(q k^T / sqrt(H)) per head; A_hat is FAVOR's matrix
    (``favor_attention_weights``) with the key's projection (one independent draw per layer
    and head). A loop over keys: each draw reuses the compiled attention-weight program.
    """
    exact = [_exact_attention(query, key_heads) for query, key_heads in layers]
    errors = []
    for key in keys:
        squared_error = squared_norm = 0.0
        for index, (query, key_heads) in enumerate(layers):
            projection = draw_projection(
                jax.random.fold_in(key, index),
                query.shape[-1],
                num_features,
                coupling=coupling,
                num_heads=query.shape[-2],
            )
            estimate = favor_attention_weights(
                query, key_heads, projection, feature_map=feature_map
            )
            squared_error += float(jnp.sum((estimate - exact[index]) ** 2))
            squared_norm += float(jnp.sum(exact[index] ** 2))
        errors.append(math.sqrt(squared_error / squared_norm))
    return np.array(errors)


UNIFORM_LOG_TEMPERATURE = -30.0  # tau = e^-30: every cosine score ~0, attention uniform


def with_uniform_attention(params: dict) -> dict:
    """``params`` with every attention made uniform: its learned temperature at e^-30 (cosine
    scores) or, without one, its query and key projections at 0 (raw scores): every score is
    then 0 (exact: weights 1/S; random features of the zero vector: equal for every key)."""

    def visit(tree: dict) -> dict:
        if "log_temperature" in tree:
            return {
                **tree,
                "log_temperature": jnp.full_like(tree["log_temperature"], UNIFORM_LOG_TEMPERATURE),
            }
        if {"query", "key", "value"} <= set(tree):
            zero = jax.tree.map(jnp.zeros_like, {"query": tree["query"], "key": tree["key"]})
            return {**tree, **zero}
        return {k: visit(v) if isinstance(v, dict) else v for k, v in tree.items()}

    return {**params, "params": visit(params["params"])}


def evaluate_run(
    config: ml_collections.ConfigDict,
    model: PerformerViT,
    run_dir: str,
    arrays: dict,
    seed: int,
    attention: str,
) -> dict:
    """Fresh-draw accuracies (Performers) and the attention errors of every coupling on the
    run's trained queries and keys."""
    params = train.final_params(run_dir)
    normalise = _normaliser(arrays["train"]["image"])
    root = jax.random.fold_in(jax.random.key(config.eval_seed), seed)
    result: dict = {}
    if attention != "exact":
        keys = jax.random.split(jax.random.fold_in(root, 0), config.num_eval_draws)
        draws = fresh_draw_accuracies(
            model,
            params,
            pixel_stats(arrays["train"]["image"]),
            arrays["test"],
            keys,
            config.eval_batch_size,
        )
        result["accuracy_draws"] = [float(a) for a in draws]
    (uniform,) = fresh_draw_accuracies(  # the training check's trivial model
        model,
        with_uniform_attention(params),
        pixel_stats(arrays["train"]["image"]),
        arrays["test"],
        jax.random.fold_in(root, 0)[None],
        config.eval_batch_size,
    )
    result["accuracy_uniform_attention"] = float(uniform)
    images = normalise(arrays["test"]["image"][: config.num_attention_images])
    layers = queries_and_keys(model, params, images)
    result["uniform_attention_error"] = uniform_attention_error(layers)
    result["temperatures"] = learned_temperatures(params)
    result["attention_error"] = {}
    for index, coupling in enumerate(c for c in config.attentions if c != "exact"):
        keys = jax.random.split(jax.random.fold_in(root, 1 + index), config.num_attention_draws)
        errors = attention_relative_errors(
            layers,
            keys,
            coupling=coupling,
            num_features=config.model.num_features,
            feature_map=config.model.feature_map,
        )
        result["attention_error"][coupling] = float(np.mean(np.asarray(errors)))
    return result
