"""Conformer-Performer with CTC on spoken digit strings (FSDD): digit error rate per attention.

The HRF paper (arXiv:2110.04367, Sec. 4.3, App. J, Table 2) trains a Conformer-Transducer with
Performer attention on LibriSpeech and compares softmax-kernel estimators by word error rate.
LibriSpeech is not available offline here, so this runs the same comparison on real speech at
small scale: utterances of concatenated Free Spoken Digit Dataset recordings
(``rfjax.data.concatenate_digits``), log-mel features (``rfjax.data.log_mel_spectrogram``), a
``rfjax.nn.ConformerEncoder`` trained with CTC (``optax.ctc_loss``, blank = class 0, digit d =
class d + 1) by the shared trainer (``experiments.core.train.trainer``; resumable runs in
``workdir/runs/<attention>_seed<k>``), greedy CTC decoding and the digit error rate
DER = (total edit distance) / (total reference digits).

Protocol. ``config.split`` chooses the test set: ``"recordings"`` holds out the recordings with
index >= ``first_test_index`` of every speaker (test utterances are new recordings of the
training speakers), ``"speakers"`` holds out whole speakers (``test_speakers``). Seeds are
paired: seed k gives every attention kind the same initialisation of the shared parameters and
the same batch order, so kinds are compared by per-seed differences. The analysis is gated: the
paired difference FAVOR+ - exact is tested first (two-sided paired t-test); only if it is
significant is the ordering of the hybrids against FAVOR+ reported. An attention kind that
fails the config's declared training check (``config.trained_check``: test DER below a
ceiling in every seed) did not train: every ordering whose test uses it is not tested, with its
numbers and what would test it. For every exact-attention
run, a diagnostic re-evaluates the trained model with its attention replaced at inference
(uniform weights, i.e. temperature -> 0; FAVOR+ features), which shows how much the trained
model relies on its attention weights.

``measure`` trains and evaluates (one core sweep cell per run), ``report`` writes
``results.csv`` (one row per run), ``summary.md`` (template
``experiments/conformer_ctc/summary.md``), ``digit_error_rate.png`` and
``learning_curves.png``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
import optax

from experiments.core import outputs, plots, records, stats, sweep, tabulate, verdicts
from experiments.core.study import Study
from experiments.core.train import distributed
from experiments.core.train import trainer as train
from experiments.core.validate import require, require_int, require_names, require_nonempty
from rfjax import features as feature_maps
from rfjax.data import concatenate_digits, load_fsdd, log_mel_spectrogram
from rfjax.nn import ConformerEncoder, conformer_attentions, fit_conformer_clusters

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=120,
    reproduces="HRF Sec. 4.3: Conformer-Performer with CTC on spoken digit strings (FSDD)",
)


def _label(attention: str) -> str:
    """The attention kind's name in tables and figures (the feature-map registry's label)."""
    return "exact softmax" if attention == "exact" else feature_maps.info(attention).label


SPLITS = ("recordings", "speakers")
HYBRIDS = ("angular_hybrid", "cluster_hybrid")
TRIGONOMETRIC_KINDS = ("trigonometric", "angular_hybrid")  # built on signed (cos, sin) features
RECORDINGS_PER_SPEAKER_DIGIT = 50  # FSDD indices 0..49
UNIFORM_LOG_TEMPERATURE = -30.0  # tau = e^-30: every score ~0, attention weights uniform
SIGNIFICANCE = 0.05  # two-sided level of the paired t-tests


# --------------------------------------------------------------------------- decoding, metric


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


# --------------------------------------------------------------------------- measure


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks names, the split and sizes before anything runs (by hand only the rule that spans
    the attentions and the optimiser).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_names(config, "attentions", conformer_attentions())
    require_nonempty(config, "seeds")
    require_names(config, "split", SPLITS)
    require_int(config, "first_test_index", minimum=1, maximum=RECORDINGS_PER_SPEAKER_DIGIT - 1)
    require_int(config, "min_digits", "num_swap_draws", minimum=1)
    require(
        config.max_digits >= config.min_digits,
        "max_digits",
        config.max_digits,
        f">= config.min_digits = {config.min_digits}",
    )
    require(
        bool(config.model.query_key_norm),
        "model.query_key_norm",
        config.model.query_key_norm,
        "True: every kind scores cosine attention with a learned temperature (the signed kinds "
        "need it to train, and the uniform-attention diagnostic sets that temperature)",
    )
    if "cluster_hybrid" in config.attentions and (
        config.train.optimizer == "adamw" and config.train.weight_decay
    ):
        raise ValueError(
            "cluster_hybrid keeps its fitted centres frozen among the trained variables; "
            "adamw weight decay would shrink them: use config.train.optimizer = 'adam'"
        )


def _gate_order(attentions) -> list[str]:
    """exact and FAVOR+ first (the gate), then the other kinds in config order."""
    first = [a for a in ("exact", "positive") if a in attentions]
    return first + [a for a in attentions if a not in first]


def train_run(config, attention, seed, arrays, workdir) -> dict:
    """Trains (or resumes) one (attention, seed) run and measures it: its row and learning
    curve."""
    train_arrays, test_arrays = arrays
    task = make_task(make_model(config, attention), train_arrays, test_arrays, config, seed)
    cpu_start = time.process_time()
    final, run_dir, seconds = train.train_seed(config.train, workdir, attention, seed, task)
    variables = train.final_params(run_dir)
    curve = train.read_metrics(run_dir)
    row = {
        "attention": attention,
        "seed": seed,
        "digit_error_rate": final["eval_edit_distance"] / final["eval_reference_digits"],
        "utterance_accuracy": final["eval_utterance_correct"],
        "test_ctc_loss": final["eval_loss"],
        "final_train_loss": [r["loss"] for r in curve if r["split"] == "train"][-1],
        "mean_temperature": float(np.mean(_temperatures(variables))),
    }
    step = config.train.num_train_steps
    row["der_uniform_attention"] = uniform_attention_rate(
        config, attention, variables, test_arrays, step
    )
    if attention == "exact":
        row["der_favor_swap"] = favor_swap_rate(config, variables, test_arrays, seed, step)
    row.update(outputs.run_cost(seconds, cpu_start))
    print(
        f"{_label(attention):>20} seed {seed}: DER {row['digit_error_rate']:.4f} ({seconds:.0f} s)"
    )
    return {**row, "curve": curve}


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains every (attention, seed) with the core sweep, exact and FAVOR+ first; with
    ``config.gate_first`` (and both in ``config.attentions``) the other kinds are trained only if
    the paired FAVOR+ - exact difference is significant. Returns per-run metrics, learning
    curves, the split and the kinds skipped."""
    validate_config(config)
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    train_arrays, test_arrays, info = make_data(config)
    settings = records.settings(
        config, exclude=("label", "attentions", "seeds", "gate_first", "compilation_cache_dir")
    )

    def cells(attentions) -> list[dict]:
        return sweep.run(
            workdir,
            attentions,
            config.seeds,
            lambda arm, seed, _: train_run(config, arm, seed, (train_arrays, test_arrays), workdir),
            settings,
        )

    order = _gate_order(config.attentions)
    gated = config.gate_first and {"exact", "positive"} <= set(config.attentions)
    done = cells(order[:2] if gated else order)
    skipped = []
    if gated:
        gate = _gate(done)
        if gate.p < SIGNIFICANCE:
            done += cells(order[2:])
        else:
            skipped = order[2:]
    curves: dict[str, list] = {}
    for record in sorted(done, key=lambda r: (order.index(r["attention"]), r["seed"])):
        curves.setdefault(record["attention"], []).append(record["curve"])
    runs = [
        {k: v for k, v in r.items() if k not in ("curve", "arm", "seconds")}
        for r in sorted(done, key=lambda r: (order.index(r["attention"]), r["seed"]))
    ]
    return {"runs": runs, "curves": curves, "info": info, "skipped": skipped}


# --------------------------------------------------------------------------- statistics


def _gate(runs: list[dict]) -> stats.Estimate:
    """FAVOR+ - exact test DER, paired by seed: does this task resolve attention kinds?"""
    return stats.paired_difference(
        tabulate.seed_values(runs, "digit_error_rate", attention="positive"),
        tabulate.seed_values(runs, "digit_error_rate", attention="exact"),
    )


def comparisons(runs: list[dict], attentions) -> list[dict]:
    """The gated paired differences: FAVOR+ - exact first, then every other kind - FAVOR+."""
    pairs = []
    if "exact" in attentions and "positive" in attentions:
        pairs.append(("positive", "exact"))
    if "positive" in attentions:
        pairs += [(a, "positive") for a in attentions if a not in ("exact", "positive")]
    if set(HYBRIDS) <= set(attentions):
        pairs.append(("cluster_hybrid", "angular_hybrid"))
    return [
        {
            "kind": kind,
            "reference": reference,
            **stats.paired_difference(
                tabulate.seed_values(runs, "digit_error_rate", attention=kind),
                tabulate.seed_values(runs, "digit_error_rate", attention=reference),
            ).as_dict(),
        }
        for kind, reference in pairs
    ]


def _format_difference(row: dict) -> str:
    shown = tabulate.plus_minus(row["mean"], row["se"], "+.4f")
    return f"{shown} (t = {row['t']:.2f}, p = {row['p']:.3g})"


# claim -> (the claimed-worse kinds, the claimed-better kinds): each claim is an intersection
# over pairs, one cell per (claimed-better, claimed-worse) kind, the effect the claimed-worse
# kind's test DER minus the claimed-better one's, per seed (positive where the claim shows).
ORDERINGS = {
    "hybrid_ordering": (("positive",), HYBRIDS),
    "hybrids_beat_trigonometric": (("trigonometric",), HYBRIDS),
    "cluster_best": (("angular_hybrid",), ("cluster_hybrid",)),
}


def ordering_cells(runs: list[dict], worse: tuple[str, ...], better: tuple[str, ...]) -> dict:
    """One cell per (claimed-better, claimed-worse) pair: the paired difference in test DER
    (worse - better) over seeds."""
    return {
        f"{_label(b)} vs {_label(w)}": stats.paired_difference(
            tabulate.seed_values(runs, "digit_error_rate", attention=w),
            tabulate.seed_values(runs, "digit_error_rate", attention=b),
        )
        for b in better
        for w in worse
    }


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The paper's orderings (``ORDERINGS``), each an intersection over its pairs of kinds
    (``Verdicts.every``: a paired test over seeds per pair, holding only where every pair does).
    With ``config.gate_first`` they are tested only where the task resolves attention kinds
    (the gate: FAVOR+ - exact). Every ordering's test uses its kinds and the exact-attention
    models (the task's reference: if they do not use their attention, no ordering of
    approximations of it is testable); an ordering using a kind that failed the declared
    training check (``config.trained_check``) is not tested."""
    judge = verdicts.Verdicts(config)
    runs = results["runs"]
    judge.check_training(runs, "attention", label=_label, remedy=lambda arms: _remedy(arms, config))
    trained = {r["attention"] for r in runs}
    why_not = _gate_failure(runs, trained) if config.gate_first else None
    for name, (worse, better) in ORDERINGS.items():
        if name not in judge.claims:
            continue
        missing = [a for a in ("exact", *worse, *better) if a not in trained]
        if why_not or missing:
            judge.not_tested(name, why_not or f"not trained: {', '.join(map(_label, missing))}")
            continue
        judge.every(
            name,
            ordering_cells(runs, worse, better),
            effect="test DER of the claimed-worse kind - the claimed-better kind's, paired by seed",
            cell_name="pairs",
            units="seeds",
            number=".4f",
            arms=[_label(a) for a in ("exact", *worse, *better)],
        )
    return judge


def _gate_failure(runs: list[dict], trained: set[str]) -> str | None:
    """Why the gate stops the orderings (None if it passes)."""
    if not {"exact", "positive"} <= trained:
        return "the gate needs exact and FAVOR+ runs"
    gate = _gate(runs)
    if gate.p < SIGNIFICANCE:
        return None
    shown = tabulate.estimate_text(
        gate.mean, gate.se, gate.interval(), details=[f"p = {gate.p:.2g}", f"{gate.n} paired seeds"]
    )
    return (
        f"this task does not resolve attention kinds: FAVOR+ - exact test DER = {shown}, so any "
        "ordering of the hybrids would be noise"
    )


def trigonometric_relative_sd(temperature: float, num_features: int) -> float:
    """Standard deviation over draws of the trigonometric estimate of the cosine-attention
    kernel exp(tau q^.k^) at orthogonal unit q, k, relative to the kernel's value (1): with
    q' = sqrt(tau) q^, k' = sqrt(tau) k^ the estimate is e^tau times the mean over m i.i.d.
    Gaussian w of cos(w.(q' - k')), |q' - k'|^2 = 2 tau, whose variance is
    ((1 + e^{-4 tau}) / 2 - e^{-2 tau}) / m."""
    variance = (1 + math.exp(-4 * temperature)) / 2 - math.exp(-2 * temperature)
    return math.exp(temperature) * math.sqrt(variance / num_features)


def _remedy(untrained: list[str], config) -> str:
    """What would test a claim whose kinds ``untrained`` (labels) failed the training check."""
    tau, m = config.model.initial_temperature, config.model.num_features
    kinds = {_label(a): a for a in conformer_attentions()}
    signed = [kinds[a] for a in untrained if kinds.get(a) in TRIGONOMETRIC_KINDS]
    others = [kinds.get(a, a) for a in untrained if kinds.get(a) not in TRIGONOMETRIC_KINDS]
    parts = []
    if signed:
        parts.append(
            f"a variant in which {' and '.join(map(_label, signed))} "
            f"train{'s' if len(signed) == 1 else ''}, e.g. with a lower "
            f"initial temperature (model.initial_temperature, {tau:g} here) for every kind: at "
            f"tau = {tau:g} the trigonometric estimate of the kernel exp(tau q^.k^) of "
            f"orthogonal unit q, k has a standard deviation "
            f"{trigonometric_relative_sd(tau, m):.3g} times the kernel's value (m = {m} i.i.d. "
            f"projections; {trigonometric_relative_sd(1.0, m):.2g} times at tau = 1)"
        )
    if others:
        parts.append(
            f"a task in which {' and '.join(map(_label, others))} "
            f"use{'s' if len(others) == 1 else ''} its attention and read"
            f"{'s' if len(others) == 1 else ''} the digits (e.g. attention as the only mixing "
            "across frames, as in attention_context, and more than "
            f"{config.train.num_train_steps} steps)"
        )
    follow_up = config.get("follow_up")
    if follow_up:  # the variant declared to do it
        return (
            f"{'; '.join(parts)}: the variant {follow_up} does this "
            f"(results/conformer_ctc_{follow_up})"
        )
    return "(not run) " + "; ".join(parts)


def _mean_der(runs: list[dict], kinds: tuple[str, ...]) -> np.ndarray:
    """Per seed, the mean test DER over ``kinds``."""
    return np.mean(
        [tabulate.seed_values(runs, "digit_error_rate", attention=a) for a in kinds], axis=0
    )


def _kinds_text(kinds: tuple[str, ...]) -> str:
    names = [_label(a) for a in kinds]
    return names[0] if len(names) == 1 else f"mean of {', '.join(names)}"


# --------------------------------------------------------------------------- report


def _summary_rows(results: dict, attentions, judge: verdicts.Verdicts) -> list[dict]:
    runs, rows = results["runs"], []
    for attention in attentions:
        rates = tabulate.seed_values(runs, "digit_error_rate", attention=attention)
        train_logs = [
            [r["loss"] for r in c if r["split"] == "train"] for c in results["curves"][attention]
        ]
        row = {
            "attention": _label(attention),
            "seeds": len(rates),
            "test DER (mean ± 1 SE)": tabulate.summarise(rates),
            "utterances fully correct": float(
                np.mean(tabulate.seed_values(runs, "utterance_accuracy", attention=attention))
            ),
            "test CTC loss": float(
                np.mean(tabulate.seed_values(runs, "test_ctc_loss", attention=attention))
            ),
            "train CTC loss, first -> last log": f"{np.mean([c[0] for c in train_logs]):.4g} -> "
            f"{np.mean([c[-1] for c in train_logs]):.4g}",
            "learned tau (mean)": float(
                np.mean(tabulate.seed_values(runs, "mean_temperature", attention=attention))
            ),
        }
        checked = judge.arm_checks.get(_label(attention))
        check = judge.trained_check
        row["training check"] = (
            checked.outcome(check) if checked is not None and check else "not checked"
        )
        rows.append(row)
    return rows


def _plot_error_rates(runs, tests, attentions, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    seeds = sorted({r["seed"] for r in runs})
    for i, attention in enumerate(attentions):
        mean, se = stats.mean_se(
            tabulate.seed_values(runs, "digit_error_rate", attention=attention)
        )
        left.bar(i, mean, yerr=np.nan_to_num(se), capsize=4, color=f"C{i}", alpha=0.7)
    per_seed = np.array(
        [tabulate.seed_values(runs, "digit_error_rate", attention=a) for a in attentions]
    )
    for k in range(len(seeds)):
        left.plot(range(len(attentions)), per_seed[:, k], "k.-", lw=0.5, ms=4, alpha=0.6)
    left.set_xticks(range(len(attentions)), [_label(a) for a in attentions], rotation=20)
    left.set(
        ylabel="test digit error rate",
        title=f"test DER: mean ± 1 SE over {len(seeds)} seeds (lines: paired seeds)",
    )
    labels = [f"{_label(t['kind'])}\n- {_label(t['reference'])}" for t in tests]
    plots.forest(
        right,
        [t["mean"] for t in tests],
        [2 * t["se"] for t in tests],
        labels,
        color="C0",
        capsize=4,
        fontsize=8,
    )
    right.set(xlabel="paired difference in test DER", title="paired differences, ± 2 SE")
    outputs.save_figure(figure, path)


def _plot_curves(curves: dict, attentions, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, attention in enumerate(attentions):
        for axis, split, value in ((left, "eval", digit_error_rate), (right, "train", "loss")):
            steps, series = plots.logged_series(curves[attention], split, value)
            plots.mean_se_band(axis, steps, series, color=f"C{i}", label=_label(attention))
    left.set(xlabel="step", ylabel="test digit error rate", title="test DER (band: ± 1 SE)")
    right.set(
        xlabel="step", ylabel="train CTC loss", yscale="log", title="train loss (band: ± 1 SE)"
    )
    left.legend(fontsize=8)
    outputs.save_figure(figure, path)


def _setup_text(config, info) -> str:
    m = config.model
    if config.split == "recordings":
        split = (
            f"test recordings: index >= {config.first_test_index} of every speaker and digit "
            f"({info['test_recordings']} recordings of the training speakers "
            f"{', '.join(info['train_speakers'])}; {info['train_recordings']} for training)"
        )
    else:
        split = (
            f"held-out speaker(s) {', '.join(info['test_speakers'])}; training speakers "
            f"{', '.join(info['train_speakers'])}"
        )
    return (
        f"Utterances of {config.min_digits}-{config.max_digits} concatenated recordings (each cut "
        f"to {config.max_samples_per_digit} samples), {config.num_train_utterances} for training "
        f"and {config.num_test_utterances} for testing; {split}. {config.num_mels} log-mel bins "
        f"(25 ms / 10 ms), padded to {info['max_frames']} frames (mean "
        f"{info['mean_frames']:.0f}), {info['max_frames'] // 4} after 4x subsampling. Conformer: "
        f"{m.num_layers} blocks, width {m.model_dim}, {m.num_heads} heads, conv kernel "
        f"{m.kernel_size}; cosine scores tau q^.k^ with a learned per-head temperature "
        f"initialised at tau = {m.initial_temperature}; m = {m.num_features} projections per "
        f"head ({m.coupling}, redrawn every {m.redraw_interval} steps), angular hybrid n = "
        f"{m.num_sign_features}, cluster hybrid {m.num_clusters} x {m.num_clusters} clusters per "
        "head (k-means on the initial model's queries and keys, then frozen), denominator floor "
        f"{m.hybrid_eps} for the signed kinds. Training: {config.train.num_train_steps} steps of "
        f"batch {config.train.batch_size}, {config.train.optimizer}, lr "
        f"{config.train.learning_rate} ({config.train.lr_schedule}); seeds "
        f"{tuple(config.seeds)}, paired across kinds."
    )


def _swap_text(runs: list[dict], attentions) -> str:
    """Each kind's models re-evaluated with uniform attention swapped in (the training check's
    trivial model), and the exact models with FAVOR+ features: mean test DER and the paired
    change against the model as trained."""
    rows = []
    for attention in attentions:
        mine = [r for r in runs if r["attention"] == attention]
        own = np.array([r["digit_error_rate"] for r in mine])
        swaps = [("der_uniform_attention", "uniform weights (tau -> 0)")]
        if attention == "exact":
            swaps.append(("der_favor_swap", "FAVOR+ features"))
        for name, label in swaps:
            if not mine or any(r.get(name) is None for r in mine):
                rows.append(
                    {
                        "trained with": _label(attention),
                        "attention at inference": label,
                        "test DER (mean ± 1 SE)": "not measured (runs made before the swap "
                        "was measured for every kind)",
                        "paired change": "—",
                    }
                )
                continue
            values = np.array([r[name] for r in mine])
            change = stats.paired_difference(values, own)
            rows.append(
                {
                    "trained with": _label(attention),
                    "attention at inference": label,
                    "test DER (mean ± 1 SE)": tabulate.summarise(values),
                    "paired change": tabulate.plus_minus(change.mean, change.se, "+.4f"),
                }
            )
    return outputs.markdown_table(rows) if rows else "not run."


def _pair_tables(runs: list[dict], judge: verdicts.Verdicts, attentions) -> str:
    """Every ordering's per-pair table (``Verdicts.cell_rows``), for the kinds trained."""
    parts = []
    for name, (worse, better) in ORDERINGS.items():
        if name not in judge.claims or not set((*worse, *better)) <= set(attentions):
            continue
        rows = judge.cell_rows(
            name, ordering_cells(runs, worse, better), cell_name="pair", units="seeds", number=".4f"
        )
        parts.append(f"*{name}*:\n\n{outputs.markdown_table(rows)}")
    return "\n\n".join(parts) if parts else "none (the kinds of no ordering were all trained)"


def comparison_rows(tests: list[dict]) -> list[dict]:
    """The paired comparisons as shown in the summary."""
    return [
        {
            "difference": f"{_label(t['kind'])} - {_label(t['reference'])}",
            "mean ± 1 SE": tabulate.plus_minus(t["mean"], t["se"], "+.4f"),
            "t": t["t"],
            "p (two-sided)": t["p"],
        }
        for t in tests
    ]


def _gate_text(tests: list[dict], config) -> str:
    gate = next((t for t in tests if t["reference"] == "exact"), None)
    if gate is None:
        return "not run (exact or FAVOR+ missing)"
    rule = (
        f"the other kinds are trained if p < {SIGNIFICANCE:g}"
        if config.gate_first
        else "no gate in this variant: the orderings are tested whatever it says"
    )
    return f"FAVOR+ - exact = {_format_difference(gate)} over {gate['n']} paired seeds ({rule})"


def _design_text(config) -> str:
    if config.gate_first:
        return (
            "A claim about attention kinds needs a task where the kind of attention changes "
            "the error, so the analysis is gated: first the paired difference FAVOR+ - exact "
            "over seeds (two-sided paired t-test); the hybrids' ordering against FAVOR+ is "
            "tested only if that gate is significant."
        )
    return (
        "The orderings are claims about models trained with each kind, tested directly: each "
        "is one paired t-test over seeds, refuted only beyond its declared margin. No gate: "
        "FAVOR+- and exact-trained models may reach the same error (each adapts to its "
        "attention) while the kind of attention still matters to a trained model (the swap "
        "below)."
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, the summary and the verdicts of ``measure``'s records."""
    runs, info = results["runs"], results["info"]
    attentions = tuple(a for a in config.attentions if a in results["curves"])
    tests = comparisons(runs, attentions)
    judged = judge(results, config)
    _plot_error_rates(runs, tests, attentions, os.path.join(workdir, "digit_error_rate.png"))
    _plot_curves(results["curves"], attentions, os.path.join(workdir, "learning_curves.png"))
    text = verdicts.write_summary(
        workdir,
        "conformer_ctc",
        judged,
        config,
        setup=_setup_text(config, info),
        table=outputs.markdown_table(_summary_rows(results, attentions, judged)),
        pair_tables=_pair_tables(runs, judged, attentions),
        comparisons=outputs.markdown_table(comparison_rows(tests)) if tests else "none",
        design=_design_text(config),
        gate=_gate_text(tests, config),
        skipped=(
            "Not trained, because of the gate (`gate_first`): "
            + ", ".join(_label(a) for a in results["skipped"])
            + "."
            if results["skipped"]
            else ""
        ),
        swaps=_swap_text(runs, attentions),
        timing=outputs.timing_text(runs),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), runs)
    print(text)
    return {"runs": runs, "comparisons": tests, "skipped": results["skipped"], **info}
