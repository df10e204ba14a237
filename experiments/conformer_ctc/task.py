"""The Conformer-CTC task: FSDD digit strings as log-mel features, the model, its training task,
greedy CTC decoding and the digit error rate, and the trained model's evaluations.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments.core.train import distributed
from experiments.core.train import trainer as train
from rfjax import features as feature_maps
from rfjax.data import concatenate_digits, load_fsdd, log_mel_spectrogram
from rfjax.nn import ConformerEncoder, fit_conformer_clusters


def _label(attention: str) -> str:
    """The attention kind's name in tables and figures (the feature-map registry's label)."""
    return "exact softmax" if attention == "exact" else feature_maps.info(attention).label


SPLITS = ("recordings", "speakers")
HYBRIDS = ("angular_hybrid", "cluster_hybrid")
TRIGONOMETRIC_KINDS = ("trigonometric", "angular_hybrid")  # built on signed (cos, sin) features
RECORDINGS_PER_SPEAKER_DIGIT = 50  # FSDD indices 0..49
UNIFORM_LOG_TEMPERATURE = -30.0  # tau = e^-30: every score ~0, attention weights uniform
SIGNIFICANCE = 0.05  # two-sided level of the paired t-tests


def greedy_ctc_decode(logits: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Best-path CTC decoding: per-frame argmax, merge repeats, drop blanks (class 0).

    Args:
      logits: ``(B, T, C)``.
      mask: ``(B, T)`` bool, real frames.

    Returns:
      ``(tokens, lengths)``: ``(B, T)`` int32 decoded classes left-aligned (0 after the end)
      and ``(B,)`` their counts.
    """
    best = jnp.where(mask, jnp.argmax(logits, axis=-1), 0).astype(jnp.int32)
    previous = jnp.pad(best[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    keep = (best != 0) & (best != previous)
    position = jnp.where(keep, jnp.cumsum(keep, axis=1) - 1, best.shape[1])
    rows = jnp.arange(best.shape[0])[:, None]
    tokens = jnp.zeros_like(best).at[rows, position].set(best, mode="drop")
    return tokens, jnp.sum(keep, axis=1).astype(jnp.int32)


def edit_distance(
    hypothesis: jax.Array, hypothesis_length: jax.Array, reference: jax.Array, reference_length
) -> jax.Array:
    """Levenshtein distance (unit insert/delete/substitute) between two padded sequences.

    Args:
      hypothesis: ``(T,)`` ints, the first ``hypothesis_length`` used.
      hypothesis_length: scalar int.
      reference: ``(L,)`` ints, the first ``reference_length`` used.
      reference_length: scalar int.

    Returns:
      The distance, an int32 scalar (vmap for batches).
    """
    size = reference.shape[0]
    first = jnp.arange(size + 1, dtype=jnp.int32)

    def row(previous, inputs):
        i, token = inputs
        new = [i + 1]
        for j in range(1, size + 1):
            substitute = previous[j - 1] + (token != reference[j - 1]).astype(jnp.int32)
            new.append(jnp.minimum(jnp.minimum(previous[j], new[j - 1]) + 1, substitute))
        new = jnp.stack(new).astype(jnp.int32)
        return jnp.where(i < hypothesis_length, new, previous), None

    steps = jnp.arange(hypothesis.shape[0], dtype=jnp.int32)
    last, _ = jax.lax.scan(row, first, (steps, hypothesis.astype(jnp.int32)))
    return last[reference_length]


# --------------------------------------------------------------------------- data


def _test_selection(config: ml_collections.ConfigDict, data: dict) -> np.ndarray:
    """Boolean mask of the test recordings (``config.split``)."""
    if config.split == "recordings":
        return data["index"] >= config.first_test_index
    speakers = data["speaker"]
    unknown = set(config.test_speakers) - set(speakers.tolist())
    if unknown or not config.test_speakers:
        raise ValueError(
            f"test_speakers must be a non-empty subset of {sorted(set(speakers.tolist()))}, "
            f"got {tuple(config.test_speakers)}"
        )
    return np.isin(speakers, list(config.test_speakers))


def make_data(config: ml_collections.ConfigDict) -> tuple[dict, dict, dict]:
    """Train and test arrays and a description of the split.

    Utterances are drawn from the train recordings and the test recordings separately, so no
    recording is in both. Features are normalised by the training frames' mean and std; all
    utterances are zero-padded to one length (a multiple of 4 frames) and labels to
    ``max_digits``.
    """
    data: dict[str, Any] = load_fsdd(config.data_dir)
    is_test = _test_selection(config, data)
    splits = {}
    for name, selected, count, seed in (
        ("train", ~is_test, config.num_train_utterances, config.data_seed),
        ("test", is_test, config.num_test_utterances, config.data_seed + 1),
    ):
        indices = np.flatnonzero(selected)
        waveforms, labels = concatenate_digits(
            [data["audio"][i] for i in indices],
            data["digit"][indices],
            count,
            seed=seed,
            min_digits=config.min_digits,
            max_digits=config.max_digits,
            max_samples_per_digit=config.max_samples_per_digit,
        )
        splits[name] = (
            [log_mel_spectrogram(w, num_mels=config.num_mels) for w in waveforms],
            labels,
        )
    frames = max(len(f) for features, _ in splits.values() for f in features)
    frames = -(-frames // 4) * 4
    train_features = np.concatenate(splits["train"][0])
    mean, std = train_features.mean(0), train_features.std(0) + 1e-5
    arrays = {}
    for name, (features, labels) in splits.items():
        padded = np.zeros((len(features), frames, config.num_mels), np.float32)
        targets = np.zeros((len(features), config.max_digits), np.int32)
        for i, (f, digits) in enumerate(zip(features, labels, strict=True)):
            padded[i, : len(f)] = (f - mean) / std
            targets[i, : len(digits)] = digits + 1
        arrays[name] = {
            "features": padded,
            "frames": np.array([len(f) for f in features], np.int32),
            "labels": targets,
            "label_count": np.array([len(d) for d in labels], np.int32),
        }
    info = {
        "train_recordings": int(np.sum(~is_test)),
        "test_recordings": int(np.sum(is_test)),
        "train_speakers": sorted(set(data["speaker"][~is_test].tolist())),
        "test_speakers": sorted(set(data["speaker"][is_test].tolist())),
        "max_frames": frames,
        "mean_frames": float(np.mean([len(f) for f in splits["train"][0]])),
    }
    return arrays["train"], arrays["test"], info


# --------------------------------------------------------------------------- task


def make_model(config: ml_collections.ConfigDict, attention: str) -> ConformerEncoder:
    return ConformerEncoder(num_classes=11, attention=attention, **config.model.to_dict())


def _masks(batch):
    frames = jnp.arange(batch["features"].shape[1])[None] < batch["frames"][:, None]
    width = batch["labels"].shape[1]
    label_paddings = (jnp.arange(width)[None] >= batch["label_count"][:, None]).astype(jnp.float32)
    return frames, label_paddings


def make_task(model, train_arrays, test_arrays, config, seed) -> train.Task:
    """CTC loss (mean over utterances); eval: edit-distance, digit and utterance sums."""

    def forward(variables, batch, rngs, step, train_mode):
        mask, label_paddings = _masks(batch)
        logits, out_mask = model.apply(
            variables, batch["features"], mask, train=train_mode, projection_step=step, rngs=rngs
        )
        losses = optax.ctc_loss(
            logits, 1.0 - out_mask.astype(jnp.float32), batch["labels"], label_paddings
        )
        return logits, out_mask, losses

    def loss(variables, batch, rng, step):
        _, _, losses = forward(variables, batch, train.step_rngs(rng, step), step, True)
        return jnp.mean(losses), {}

    def eval_metrics(variables, batch, rng, step):
        last = jnp.maximum(step - 1, 0)  # the projection of the last update
        logits, out_mask, losses = forward(
            variables, batch, train.step_rngs(rng, step, per_step=()), last, False
        )
        tokens, lengths = greedy_ctc_decode(logits, out_mask)
        distances = jax.vmap(edit_distance)(tokens, lengths, batch["labels"], batch["label_count"])
        weights = batch["mask"]
        return {
            "edit_distance": jnp.sum(jnp.where(weights, distances, 0)),
            "reference_digits": jnp.sum(jnp.where(weights, batch["label_count"], 0)),
            "utterance_correct": jnp.sum(weights & (distances == 0)),
            "loss": jnp.sum(jnp.where(weights, losses, 0)),
            "count": jnp.sum(weights),
        }

    def init(rng, batch):
        params_rng, projection_rng, cluster_rng = jax.random.split(rng, 3)
        mask, _ = _masks(batch)
        variables = model.init(
            {"params": params_rng, "projection": projection_rng}, batch["features"], mask
        )
        variables = {k: v for k, v in variables.items() if k != "intermediates"}
        if model.attention == "cluster_hybrid":
            variables = fit_conformer_clusters(
                cluster_rng,
                model,
                variables,
                batch["features"],
                mask,
                num_points=config.cluster_points,
            )
        return variables

    return train.array_task(
        init,
        loss,
        eval_metrics,
        train_arrays,
        test_arrays,
        batch_size=config.train.batch_size,
        eval_batch_size=config.eval_batch_size,
        seed=seed,
    )


# --------------------------------------------------------------------------- evaluation


def digit_error_rate(totals: dict[str, float]) -> float:
    """Total edit distance over total reference digits."""
    return totals["edit_distance"] / totals["reference_digits"]


def evaluator(model: ConformerEncoder, test_arrays: dict, config):
    """``(variables, rng, step) -> totals``: sums of the task's eval metrics over the test set
    under ``model``, batches split over all devices of all processes (the same totals on every
    process)."""
    eval_fn = make_task(model, test_arrays, test_arrays, config, seed=0).eval_metrics
    if eval_fn is None:
        raise ValueError("the CTC task has no eval_metrics")

    def evaluate(variables, rng: jax.Array, step: int) -> dict[str, float]:
        batches = train.padded_batches(test_arrays, config.eval_batch_size)
        return distributed.evaluate(eval_fn, variables, batches, rng=rng, step=step)

    return evaluate


def with_uniform_attention(variables: dict) -> dict:
    """``variables`` with every attention's temperature set to e^-30: uniform weights."""

    def visit(tree):
        return {
            name: (
                jnp.full_like(value, UNIFORM_LOG_TEMPERATURE)
                if name == "log_temperature"
                else visit(value)
                if isinstance(value, dict)
                else value
            )
            for name, value in tree.items()
        }

    return {**variables, "params": visit(variables["params"])}


def uniform_attention_rate(config, attention: str, variables, test_arrays, step: int) -> float:
    """Test DER of a trained model with uniform attention swapped in at inference (every
    temperature at e^-30: all scores ~0): the training check's trivial model (a model that
    uniform attention serves as well does not use its attention)."""
    uniform = evaluator(make_model(config, attention), test_arrays, config)(
        with_uniform_attention(variables), jax.random.key(0), step
    )
    return digit_error_rate(uniform)


def favor_swap_rate(config, variables, test_arrays, seed: int, step: int) -> float:
    """Test DER of an exact-attention model with FAVOR+ features swapped in at inference (mean
    over ``num_swap_draws`` projection draws)."""
    favor = evaluator(make_model(config, "positive"), test_arrays, config)
    rates = [
        digit_error_rate(favor(variables, jax.random.key(1000 * seed + draw), step))
        for draw in range(config.num_swap_draws)
    ]
    return float(np.mean(rates))


def _temperatures(variables: dict) -> list[float]:
    """The learned per-head temperatures tau of every block (cosine scores)."""
    return [
        float(t)
        for name in sorted(variables["params"])
        if name.startswith("block_")
        for t in np.exp(np.asarray(variables["params"][name]["attention"]["log_temperature"]))
    ]
