"""LSTM language model on Penn Treebank with random-feature sampled softmax (HRF Sec. 4.2, App. I).

Each arm ``"<setting>:<estimator>"`` of ``config.arms`` trains an ``rfjax.nn.LSTMLanguageModel``
per seed with the shared trainer (``experiments.core.train.trainer``; resumable runs in
``workdir/runs/<setting>-<estimator>_seed<k>``) on the sampled-softmax loss with M negatives
(``rfjax.sampled_softmax.sample_proposal``; projections redrawn every step from
``fold_in(rng, step)``).
Two settings (``SETTINGS``):

* ``"normalised"`` (the HRF paper's PTB setting, App. I.1): the model keeps raw logits q.e, the
  proposal is the softmax kernel exp(q_bar.e_bar / tau) of the normalised vectors, with tau by
  ``config.tau_rule``: ``"fixed"`` (``config.tau``; 1 for the paper's normalised embeddings) or
  ``"heldout_kl"`` (every step, the tau of ``config.tau_grid`` that minimises KL(model softmax ||
  kernel softmax) on a fixed held-out batch of validation windows,
  ``rfjax.sampled_softmax.kernel_softmax_divergence``, under the current parameters).
* ``"cosine"`` (Rawat et al. 2019): the model's logits are s q_bar.e_bar with a learned scale s
  (``LSTMLanguageModel(logits="cosine")``), so the kernel softmax at tau = 1/s *is* the model's
  softmax.

Estimators are named in ``config.estimators`` (a proposal, m and n); ``exact`` (the model's
softmax), ``kernel`` (the kernel softmax computed exactly), ``uniform`` and ``unigram`` (the
count unigram model of the training words, ``experiments.core.unigram``) are proposals without
features; ``uniform`` and ``unigram`` enter no claim and train on ``config.baseline_seeds``.
Seeds are paired: seed k gives every arm of a setting the same initialisation, dropout masks and
batch order. Evaluation: full-softmax perplexity on the validation and test windows (zero
initial state per window) and the model's softmax mass on the 10 most frequent training words
(the top-10 mass), against their share of the targets.

Verdicts (``judge``) follow the declared training check (``config.trained_check``: test
perplexity below the count unigram model's): a claim over an arm that fails it is not tested.
Claim (1) is an intersection over (hybrid, competitor, metric) cells, scored on the queries of
the models whose arm passed the check; claim (2) over (hybrid, other random-feature proposal)
pairs.

Two sweeps (``experiments.core.sweep``), so that the metrics can be measured again without
training: the training cells (records: perplexities, learning curve, time and load) and then,
from each trained model's final parameters, the metric cells (``workdir/metrics/runs``):

* Distribution metrics (HRF Fig. 3, Table 4) of every estimator on every trained model: the
  model's queries at the first ``num_metric_queries`` validation positions, the kernel softmax
  softmax(q_bar.e_bar / tau) at the model's proposal tau as the truth, ``num_metric_draws``
  feature draws whose keys every estimator shares (paired by query and draw; estimators with the
  same m draw the same base projections). Per model and estimator: mean, median and the SE over
  queries of W1, KS and the negative fraction (``experiments.lstm_lm.metrics``), and the paired
  differences of each hybrid of ``config.hybrid_estimators`` against each competitor.
* Proposal diagnostic on the exact-proposal models (normalised setting): every proposal's
  KL(model softmax || proposal) (the divergence that governs the sampled loss), negative
  fraction and W1 at the default tau and at the held-out-KL tau.

The cost of every estimator is measured with XLA's cost analysis (``proposal_flops``):
constructing the features of a training step's queries and of the vocabulary (what the paper
matched) and the whole proposal with each sampler.

``measure`` trains and measures; ``report`` writes ``results.csv`` (one row per run),
``metrics.csv`` (one row per model and estimator), ``summary.md`` (template
``experiments/lstm_lm/summary.md``), ``perplexity.png``, ``distribution_metrics.png`` and
``temperature.png``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import cost, outputs, records, stats, sweep, unigram, verdicts
from experiments.core.study import Study
from experiments.core.train import distributed
from experiments.core.train import trainer as train
from experiments.core.validate import (
    require,
    require_int,
    require_names,
    require_nonempty,
    require_positive,
)
from experiments.lstm_lm.metrics import distribution_metrics, proposal_divergence
from rfjax.data import PTB_SOURCE, load_ptb
from rfjax.nn import LSTMLanguageModel, logit_temperature
from rfjax.sampled_softmax import (
    PLAIN_PROPOSALS,
    SAMPLERS,
    clipped_log_probabilities,
    feature_proposals,
    kernel_softmax_divergence,
    normalize_for_proposal,
    proposal_estimates,
    proposal_features,
    sample_from_features,
    sample_proposal,
    sampled_softmax_loss,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=110,
    reproduces=(
        "HRF Sec. 4.2: LSTM language model on Penn Treebank with random-feature sampled softmax"
    ),
)

SETTINGS = ("normalised", "cosine")
TAU_RULES = ("fixed", "heldout_kl")
SETTING_LABELS = {
    "normalised": "raw logits, normalised proposal (HRF PTB)",
    "cosine": "cosine logits (Rawat et al.)",
}
METRICS = ("wasserstein", "ks", "negative_fraction")
# Proposals without a kernel (they read neither tau nor the sampler's kernel options): the
# model's own softmax and rfjax's uniform proposal, and the study's count unigram proposal
# (``experiments.core.unigram``).
BASELINE_PROPOSALS = ("exact", "uniform", "unigram")
SIGNIFICANCE = 0.05


# --------------------------------------------------------------------------- config


def parse_arm(arm: str) -> tuple[str, str]:
    """``"<setting>:<estimator>"`` -> (setting, estimator)."""
    setting, _, estimator = arm.partition(":")
    return setting, estimator


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the arms, the estimators, the sampler and the sizes before anything runs (by hand
    only the rules that span fields: an arm's estimator among ``config.estimators``, the
    hybrids' competitors, the metric chunks).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_nonempty(config, "arms", "seeds")
    known = (*PLAIN_PROPOSALS, "unigram", *config.estimators.keys())
    for arm in config.arms:
        setting, estimator = parse_arm(arm)
        if setting not in SETTINGS or estimator not in known:
            raise ValueError(
                f"config.arms: {arm!r} must be '<setting>:<estimator>' with a setting in "
                f"{SETTINGS} and an estimator in {known}"
            )
    for name, options in config.estimators.items():
        require_names(options, "proposal", feature_proposals(), f"config.estimators.{name}")
    require_names(config, "favor_estimator", tuple(config.estimators))
    require_names(config, "hybrid_estimators", tuple(config.estimators))
    if not competitors(config):
        raise ValueError(
            "config.estimators needs a non-hybrid estimator for the hybrids to be compared with"
        )
    require_names(config.sampler, "name", SAMPLERS, "config.sampler")
    require_names(config, "tau_rule", TAU_RULES)
    require_int(
        config,
        "bptt",
        "num_metric_queries",
        "num_metric_draws",
        "metric_query_chunk",
        "num_diagnostic_queries",
        "num_diagnostic_draws",
        "eval_batch_size",
        "num_heldout_windows",
        "num_curve_tokens",
        minimum=1,
    )
    require_int(config.sampler, "num_samples", minimum=1, prefix="config.sampler")
    require(
        config.num_metric_queries % config.metric_query_chunk == 0,
        "num_metric_queries",
        config.num_metric_queries,
        f"a multiple of config.metric_query_chunk = {config.metric_query_chunk}",
    )
    require_positive(config, "tau", "tau_grid")


def competitors(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The estimators the hybrids of claim (1) are compared with: those whose proposal is not a
    hybrid (FAVOR+ and trigonometric)."""
    return tuple(
        name
        for name, options in config.estimators.items()
        if not options.proposal.endswith("_hybrid")
    )


def estimator_options(config: ml_collections.ConfigDict, estimator: str) -> dict:
    """``proposal`` and the ``proposal_features`` options of a named estimator."""
    if estimator in (*PLAIN_PROPOSALS, "unigram"):
        return {"proposal": estimator}
    options = config.estimators[estimator]
    return {
        "proposal": options.proposal,
        "num_features": options.num_features,
        "num_coefficient_features": options.num_coefficient_features,
        "coupling": config.sampler.coupling,
    }


def feature_width(options: dict) -> int:
    """W of an estimator's features (``proposal_features``), from the shapes."""
    probe = jax.ShapeDtypeStruct((1, 4), jnp.float32)
    query_features, _ = jax.eval_shape(
        lambda q: proposal_features(jax.random.key(0), q, q, **options), probe
    )
    return int(query_features.shape[-1])


# --------------------------------------------------------------------------- data


def windows(tokens: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """Non-overlapping windows: inputs ``tokens[i L:(i+1) L]``, targets shifted by one."""
    count = (len(tokens) - 1) // length
    if count < 1:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of length {length}")
    usable = tokens[: count * length + 1]
    return {
        "inputs": usable[:-1].reshape(count, length),
        "targets": usable[1:].reshape(count, length),
    }


def load_arrays(config: ml_collections.ConfigDict) -> tuple[dict, int]:
    """Train/valid/test windows (the first ``num_*_tokens`` of each split; 0: all) and V."""
    splits, vocabulary = load_ptb()
    limits = {
        "train": config.num_train_tokens,
        "valid": config.num_eval_tokens,
        "test": config.num_eval_tokens,
    }
    arrays = {
        split: windows(tokens[: limits[split] or None], config.bptt)
        for split, tokens in splits.items()
    }
    return arrays, len(vocabulary)


def curve_windows(arrays: dict, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """The validation windows evaluated during training (the learning curves): the first
    ``num_curve_tokens`` tokens; the final perplexities use every window."""
    count = max(1, config.num_curve_tokens // config.bptt)
    return {name: value[:count] for name, value in arrays["valid"].items()}


def heldout_inputs(arrays: dict, config: ml_collections.ConfigDict) -> np.ndarray:
    """The held-out batch that selects tau: the last ``num_heldout_windows`` validation
    windows (the distribution-metric queries come from the first ones)."""
    return arrays["valid"]["inputs"][-config.num_heldout_windows :]


# --------------------------------------------------------------------------- temperature


def divergence_curve(model, params, inputs: np.ndarray, tau_grid) -> jax.Array:
    """KL(model softmax || softmax(q_bar.e_bar / tau)) on ``inputs`` for every tau of the grid."""
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])
    cosines = normalize_for_proposal(queries, 1.0) @ normalize_for_proposal(table, 1.0).T
    return kernel_softmax_divergence(queries @ table.T, cosines, jnp.asarray(tau_grid))


def proposal_temperature(model, params, config, setting: str, inputs: np.ndarray) -> jax.Array:
    """tau of the kernel proposal, a constant for the gradient: ``"cosine"``: the model's own
    1/s (floored at the grid's smallest tau so that exp(1/tau) stays finite in float32; the
    logged tau shows when the floor binds); ``"normalised"``: ``config.tau`` (``tau_rule``
    ``"fixed"``) or the tau of ``config.tau_grid`` with the least held-out divergence on
    ``inputs`` (``"heldout_kl"``)."""
    params = jax.lax.stop_gradient(params)
    if setting == "cosine":
        return jnp.maximum(logit_temperature(params), min(config.tau_grid))
    if config.tau_rule == "fixed":
        return jnp.float32(config.tau)
    return heldout_temperature(model, params, inputs, config.tau_grid)


def heldout_temperature(model, params, inputs: np.ndarray, tau_grid) -> jax.Array:
    """The tau of ``tau_grid`` that minimises KL(model softmax || kernel softmax) on ``inputs``."""
    grid = jnp.asarray(tau_grid)
    return grid[jnp.argmin(divergence_curve(model, params, inputs, grid))]


# --------------------------------------------------------------------------- task


def make_model(config: ml_collections.ConfigDict, setting: str, vocab_size: int):
    return LSTMLanguageModel(
        vocab_size=vocab_size,
        logits="cosine" if setting == "cosine" else "dot",
        **config.model.to_dict(),
    )


def make_task(
    model, arrays, config, setting: str, estimator: str, seed: int, log_unigram: np.ndarray
) -> train.Task:
    """The trainer task: sampled-softmax loss (logging the proposal's tau); eval: full-softmax
    NLL, the softmax mass on the ``unigram.TOP_WORDS`` most frequent training words, how many
    targets are among them, and token count sums on the learning-curve validation windows
    (``curve_windows``). ``log_unigram``: the count unigram model (``unigram``), the proposal
    of the ``"unigram"`` estimator."""
    options = estimator_options(config, estimator)
    sampler = config.sampler
    heldout = jnp.asarray(heldout_inputs(arrays, config))
    log_prior = jnp.asarray(log_unigram)
    top = jnp.asarray(unigram.top_words(log_unigram))

    def loss(params, batch, rng, step):
        rngs = train.step_rngs(rng, step, per_step=("dropout", "proposal"), fixed=())
        queries, table = model.apply(params, batch["inputs"], train=True, rngs=rngs)
        queries = queries.reshape(-1, queries.shape[-1])
        targets = batch["targets"].reshape(-1)
        extra, temperature = {}, jnp.float32(jnp.nan)
        if options["proposal"] in (*feature_proposals(), "kernel"):
            temperature = proposal_temperature(model, params, config, setting, heldout)
            extra["temperature"] = temperature
        if options["proposal"] in feature_proposals():
            extra.update(sampler=sampler.name, uniform_floor=sampler.uniform_floor)
        if options["proposal"] == "unigram":
            samples, log_q = unigram.sample(
                rngs["proposal"], log_prior, queries.shape[0], sampler.num_samples
            )
        else:
            samples, log_q = sample_proposal(
                rngs["proposal"],
                queries,
                table,
                num_samples=sampler.num_samples,
                **options,
                **extra,
            )
        losses = sampled_softmax_loss(
            queries,
            table,
            targets,
            samples,
            log_q,
            remove_accidental_hits=sampler.remove_accidental_hits,
        )
        hits = jnp.mean(samples == targets[:, None])
        return jnp.mean(losses), {"accidental_hit_rate": hits, "proposal_temperature": temperature}

    def eval_metrics(params, batch, rng, step):
        queries, table = model.apply(params, batch["inputs"], train=False)
        log_probs = jax.nn.log_softmax(queries @ table.T, axis=-1)
        nll = -jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        mask = jnp.broadcast_to(batch["mask"][:, None], nll.shape)
        top_mass = jnp.sum(jnp.exp(log_probs[..., top]), axis=-1)
        top_target = jnp.isin(batch["targets"], top)
        return {
            "nll": jnp.sum(jnp.where(mask, nll, 0.0)),
            "top_mass": jnp.sum(jnp.where(mask, top_mass, 0.0)),
            "top_targets": jnp.sum(mask & top_target),
            "count": jnp.sum(mask),
        }

    return train.array_task(
        lambda rng, batch: model.init(rng, batch["inputs"], train=False),
        loss,
        eval_metrics,
        arrays["train"],
        curve_windows(arrays, config),
        batch_size=config.train.batch_size,
        eval_batch_size=config.eval_batch_size,
        seed=seed,
    )


def evaluate_split(eval_fn, params, arrays: dict[str, np.ndarray], batch_size: int) -> dict:
    """Over all windows of a split, full softmax (batches split over all devices of all
    processes: the same values on every process): the perplexity exp(mean NLL per token), the
    model's mean softmax mass on the most frequent training words (``top_mass``) and their
    share of the targets (``top_share``)."""
    totals = distributed.evaluate(eval_fn, params, train.padded_batches(arrays, batch_size))
    return {
        "perplexity": float(np.exp(totals["nll"] / totals["count"])),
        "top_mass": float(totals["top_mass"] / totals["count"]),
        "top_share": float(totals["top_targets"] / totals["count"]),
    }


# --------------------------------------------------------------------------- estimator metrics


def proposal_flops(config: ml_collections.ConfigDict, estimator: str, vocab_size: int) -> dict:
    """XLA-measured FLOPs (compiled cost analysis) of one training step's proposal for its B T
    queries: ``construct``, the features of the queries and of the vocabulary (what the HRF
    paper matched: "the similar number of FLOPS needed to construct their corresponding random
    features"), and the whole proposal (the features, then the draws) with each sampler."""
    options = estimator_options(config, estimator)
    proposal = options.pop("proposal")
    count = config.train.batch_size * config.bptt
    shapes = (
        jax.random.key(0),
        jnp.zeros((count, config.model.hidden_size)),
        jnp.zeros((vocab_size, config.model.hidden_size)),
    )

    def features(key, queries, embeddings):
        return proposal_features(
            key,
            queries,
            embeddings,
            proposal=proposal,
            temperature=jnp.float32(config.tau),
            **options,
        )

    def draw(key, q, e, sampler):
        query_features, class_features = features(key, q, e)
        return sample_from_features(
            key,
            query_features,
            class_features,
            config.sampler.num_samples,
            sampler=sampler,
            uniform_floor=config.sampler.uniform_floor,
        )

    return {
        "construct": cost.compiled_flops(features, *shapes),
        **{
            name: cost.compiled_flops(functools.partial(draw, sampler=name), *shapes)
            for name in SAMPLERS
        },
    }


def _metric_draws(config: ml_collections.ConfigDict, estimator: str, temperature: float):
    """A jitted ``(keys, queries, table, probabilities) -> {metric: (draws, queries)}``: the
    distribution metrics of ``estimator``'s estimate of every query's kernel softmax, one
    feature draw per key, queries in chunks of ``config.metric_query_chunk``."""
    options = estimator_options(config, estimator)
    chunk = config.metric_query_chunk

    # Arrays enter as arguments, not closure constants (XLA would constant-fold them).
    @jax.jit
    def draws(keys, queries, table, probabilities):
        def one_draw(key):
            def one_chunk(args):
                rows, target = args
                estimates = proposal_estimates(key, rows, table, temperature=temperature, **options)
                return distribution_metrics(target, estimates)

            blocks = jax.lax.map(
                one_chunk,
                (
                    queries.reshape(-1, chunk, queries.shape[-1]),
                    probabilities.reshape(-1, chunk, probabilities.shape[-1]),
                ),
            )
            return {name: value.reshape(-1) for name, value in blocks.items()}

        return jax.lax.map(one_draw, keys)

    return draws


def _summary_row(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean, median and the SE over queries (of each query's mean over draws) of every metric
    of ``values`` (``(draws, queries)`` arrays)."""
    row = {}
    for name, value in values.items():
        per_query = value.mean(axis=0)
        row[f"{name}_mean"] = float(value.mean())
        row[f"{name}_median"] = float(np.median(value))
        row[f"{name}_se"] = float(per_query.std(ddof=1) / np.sqrt(per_query.size))
    return row


def model_metrics(
    model, params, inputs: np.ndarray, temperature: float, config, key: jax.Array
) -> tuple[list[dict], list[dict]]:
    """The distribution metrics of every estimator on one model (module docstring): per
    estimator a ``_summary_row`` (``uniform``: the flat estimate), and per hybrid and
    competitor the paired difference competitor - hybrid of W1 and KS over the same queries
    and draws (mean and SE over queries)."""
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])[: config.num_metric_queries]
    probabilities = jax.nn.softmax(
        normalize_for_proposal(queries, temperature) @ normalize_for_proposal(table, temperature).T,
        axis=-1,
    )
    uniform = distribution_metrics(probabilities, jnp.ones_like(probabilities))
    values = {"uniform": {name: np.asarray(value)[None] for name, value in uniform.items()}}
    keys = jax.random.split(key, config.num_metric_draws)  # shared: paired by draw
    for estimator in config.estimators:
        draws = _metric_draws(config, estimator, temperature)
        computed = draws(keys, queries, table, probabilities)
        values[estimator] = {name: np.asarray(value) for name, value in computed.items()}
    scored = [{"estimator": name, **_summary_row(v)} for name, v in values.items()]
    pairs = []
    hybrids = [name for name in config.estimators if name not in competitors(config)]
    for hybrid in hybrids:
        for competitor in competitors(config):
            for metric in ("wasserstein", "ks"):
                difference = values[competitor][metric].mean(0) - values[hybrid][metric].mean(0)
                pairs.append(
                    {
                        "hybrid": hybrid,
                        "competitor": competitor,
                        "metric": metric,
                        "difference": float(difference.mean()),
                        "se": float(difference.std(ddof=1) / np.sqrt(difference.size)),
                    }
                )
    return scored, pairs


def proposal_diagnostic(
    model, params, inputs: np.ndarray, heldout: np.ndarray, tau: float, config, key: jax.Array
) -> dict:
    """Every proposal as an importance sampler for the model's softmax, at the proposal's tau
    and at the held-out-KL tau: mean over ``num_diagnostic_queries`` queries and
    ``num_diagnostic_draws`` draws of KL(model softmax || proposal) (the clipped sampler's
    proposal with its floor; ``kernel``: the kernel softmax itself; ``uniform``: 1/V), the
    fraction of negative estimates and the W1 of the clipped estimate against the kernel
    softmax. Returns the held-out divergence curve, the selected tau and the rows."""
    curve = np.asarray(divergence_curve(model, params, heldout, config.tau_grid))
    tau_kl = float(config.tau_grid[int(np.argmin(curve))])
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])[: config.num_diagnostic_queries]
    log_model = jax.nn.log_softmax(queries @ table.T, axis=-1)
    rows = []
    for rule, temperature in (("proposal", tau), ("heldout_kl", tau_kl)):
        log_kernel = jax.nn.log_softmax(
            normalize_for_proposal(queries, temperature)
            @ normalize_for_proposal(table, temperature).T,
            axis=-1,
        )
        kernel = jnp.exp(log_kernel)
        uniform = jnp.full_like(log_kernel, -np.log(table.shape[0]))
        plain = {
            "uniform": (uniform, jnp.ones_like(kernel)),
            "kernel": (log_kernel, kernel),
        }
        for name, (log_q, estimate) in plain.items():
            rows.append(
                _diagnostic_row(rule, temperature, name, log_model, log_q, kernel, estimate)
            )
        keys = jax.random.split(key, config.num_diagnostic_draws)
        for estimator in config.estimators:
            options = estimator_options(config, estimator)
            per_draw = []
            for draw_key in keys:
                estimate = proposal_estimates(
                    draw_key, queries, table, temperature=temperature, **options
                )
                log_q = clipped_log_probabilities(estimate, config.sampler.uniform_floor)
                row = _diagnostic_row(
                    rule, temperature, estimator, log_model, log_q, kernel, estimate
                )
                per_draw.append(row)
            rows.append(
                {
                    **per_draw[0],
                    **{
                        name: float(np.mean([row[name] for row in per_draw]))
                        for name in ("proposal_kl", "negative_fraction", "wasserstein")
                    },
                }
            )
    return {"divergence": curve.tolist(), "tau_heldout_kl": tau_kl, "rows": rows}


def _diagnostic_row(rule, temperature, name, log_model, log_q, kernel, estimate) -> dict:
    metrics = distribution_metrics(kernel, estimate)
    return {
        "tau_rule": rule,
        "tau": float(temperature),
        "proposal": name,
        "proposal_kl": float(jnp.mean(proposal_divergence(log_model, log_q))),
        "negative_fraction": float(jnp.mean(metrics["negative_fraction"])),
        "wasserstein": float(jnp.mean(metrics["wasserstein"])),
    }


# --------------------------------------------------------------------------- measure

# Fields that only the metric cells read: changing them measures the metrics again, not the
# training.
METRIC_FIELDS = (
    "estimators",
    "favor_estimator",
    "hybrid_estimators",
    "num_metric_queries",
    "num_metric_draws",
    "metric_query_chunk",
    "num_diagnostic_queries",
    "num_diagnostic_draws",
)
SWEEP_FIELDS = ("variant", "arms", "seeds", "baseline_seeds", "compilation_cache_dir")

# Baselines that enter no claim (they show what the trivial proposals do): trained on
# ``config.baseline_seeds`` only.
UNCLAIMED_BASELINES = ("uniform", "unigram")


def arm_groups(config: ml_collections.ConfigDict) -> list[tuple[list[str], tuple[int, ...]]]:
    """The arms trained on ``config.seeds`` and, apart, the unclaimed baselines trained on
    ``config.baseline_seeds`` (each group a core sweep; empty groups left out)."""
    baselines = [a for a in config.arms if parse_arm(a)[1] in UNCLAIMED_BASELINES]
    claimed = [a for a in config.arms if a not in baselines]
    groups = [(claimed, tuple(config.seeds)), (baselines, tuple(config.baseline_seeds))]
    return [(arms, seeds) for arms, seeds in groups if arms]


def training_settings(config: ml_collections.ConfigDict, arm: str) -> dict:
    """What a training cell depends on: the config less the sweep's and the metrics' fields,
    with the options of the arm's own proposal."""
    _, estimator = parse_arm(arm)
    settings = records.settings(config, exclude=(*SWEEP_FIELDS, *METRIC_FIELDS))
    settings["proposal"] = estimator_options(config, estimator)
    return settings


def _model(config, arm: str, seed: int, context: dict, workdir: str):
    """The task of one (arm, seed) cell and its run folder."""
    setting, estimator = parse_arm(arm)
    model = make_model(config, setting, context["vocab_size"])
    task = make_task(
        model, context["arrays"], config, setting, estimator, seed, context["log_unigram"]
    )
    return model, task, sweep.run_dir(workdir, run_name(arm), seed)


def train_run(config, arm: str, seed: int, context: dict, workdir: str) -> dict:
    """Trains (or resumes) one (arm, seed) run: its row (perplexities, final tau, time and the
    load at start and end) and its learning curve."""
    arrays, heldout = context["arrays"], context["heldout"]
    setting, estimator = parse_arm(arm)
    model, task, _ = _model(config, arm, seed, context, workdir)
    load_start = os.getloadavg()[0]
    cpu_start = time.process_time()
    _, run_dir, seconds = train.train_seed(config.train, workdir, run_name(arm), seed, task)
    params = train.final_params(run_dir)
    if task.eval_metrics is None:
        raise ValueError("the language-model task has no eval_metrics")
    eval_fn = task.eval_metrics
    tau = (
        None  # a baseline proposal has no tau
        if estimator in BASELINE_PROPOSALS
        else float(proposal_temperature(model, params, config, setting, heldout))
    )
    splits = {
        split: evaluate_split(eval_fn, params, arrays[split], config.eval_batch_size)
        for split in ("valid", "test")
    }
    row = {
        "arm": arm,
        "setting": setting,
        "estimator": estimator,
        "seed": seed,
        **{f"{split}_perplexity": splits[split]["perplexity"] for split in splits},
        "test_top_mass": splits["test"]["top_mass"],
        "test_top_share": splits["test"]["top_share"],
        "final_temperature": tau,
        "load_average_start": load_start,
        **outputs.run_cost(seconds, cpu_start),
    }
    print(
        f"{arm:>32} seed {seed}: valid ppl {row['valid_perplexity']:.1f}, test ppl "
        f"{row['test_perplexity']:.1f}, top-{unigram.TOP_WORDS} mass "
        f"{row['test_top_mass']:.3f} (share {row['test_top_share']:.3f}), tau {tau} "
        f"({seconds:.0f} s, load {load_start:.1f} -> {row['load_average']:.1f})",
        flush=True,
    )
    return {"row": row, "curve": train.read_metrics(run_dir)}


def metrics_run(config, arm: str, seed: int, context: dict, workdir: str) -> dict:
    """The distribution metrics of one trained model (and, for the exact-proposal models of the
    normalised setting, the proposal diagnostic), from its final parameters."""
    setting, estimator = parse_arm(arm)
    model, _, run_dir = _model(config, arm, seed, context, workdir)
    params = train.final_params(run_dir)
    tau = float(proposal_temperature(model, params, config, setting, context["heldout"]))
    began = time.perf_counter()
    scored, pairs = model_metrics(
        model, params, context["metric_inputs"], tau, config, jax.random.key(1000 + seed)
    )
    labels = {"arm": arm, "setting": setting, "model": estimator, "seed": seed, "tau": tau}
    record: dict[str, Any] = {
        "metrics": [{**labels, **row} for row in scored],
        "pairs": [{**labels, **row} for row in pairs],
        "diagnostic": None,
    }
    if setting == "normalised" and estimator == "exact":
        record["diagnostic"] = {
            **labels,
            **proposal_diagnostic(
                model,
                params,
                context["metric_inputs"],
                context["heldout"],
                tau,
                config,
                jax.random.key(2000 + seed),
            ),
        }
    print(f"metrics of {arm} seed {seed}: {time.perf_counter() - began:.0f} s", flush=True)
    return record


def run_name(arm: str) -> str:
    """The run folder name of an arm: ``"<setting>-<estimator>"``."""
    setting, estimator = parse_arm(arm)
    return f"{setting}-{estimator}"


METRICS_DIR = "metrics"  # the metric cells' sweep: workdir/metrics/runs/<run>_seed<k>


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains every (arm, seed), then measures every trained model (two core sweeps); returns
    runs, learning curves, estimator costs, metrics and the diagnostic."""
    validate_config(config)
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    arrays, vocab_size = load_arrays(config)
    log_unigram = unigram.log_probabilities(arrays["train"]["targets"], vocab_size)
    context = {
        "arrays": arrays,
        "vocab_size": vocab_size,
        "log_unigram": log_unigram,
        "heldout": heldout_inputs(arrays, config),
        "metric_inputs": arrays["valid"]["inputs"][: -(-config.num_metric_queries // config.bptt)],
    }
    arms = {run_name(arm): arm for arm in config.arms}
    cells, scored = [], []
    for group, seeds in arm_groups(config):
        names = [run_name(arm) for arm in group]
        cells += sweep.run(
            workdir,
            names,
            seeds,
            lambda name, seed, _: train_run(config, arms[name], seed, context, workdir),
            lambda name: training_settings(config, arms[name]),
        )
        scored += sweep.run(
            os.path.join(workdir, METRICS_DIR),
            names,
            seeds,
            lambda name, seed, _: metrics_run(config, arms[name], seed, context, workdir),
            records.settings(config, exclude=SWEEP_FIELDS),
        )
    flops = {
        name: proposal_flops(config, name, vocab_size)
        for name in outputs.progress(config.estimators, "measuring proposal FLOPs")
    }
    order = list(arms.values())
    cells.sort(key=lambda r: (order.index(r["row"]["arm"]), r["seed"]))  # arm-major
    curves: dict[str, list] = {}
    for cell in cells:
        curves.setdefault(cell["row"]["arm"], []).append(cell["curve"])
    return {
        "runs": [cell["row"] for cell in cells],
        "curves": curves,
        "metrics": [row for cell in scored for row in cell["metrics"]],
        "pairs": [row for cell in scored for row in cell["pairs"]],
        "diagnostic": [cell["diagnostic"] for cell in scored if cell["diagnostic"]],
        "flops": flops,
        "vocab_size": vocab_size,
        "tokens": {split: int(value["inputs"].size) for split, value in arrays.items()},
        # The trivial model of the training check: the count unigram model of the training
        # targets, on each split's targets.
        "unigram_perplexity": {
            split: unigram.perplexity(log_unigram, value["targets"])
            for split, value in arrays.items()
        },
    }


# --------------------------------------------------------------------------- statistics


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error (ddof 1; nan for one value) of ``values``."""
    mean, se = stats.mean_se(np.asarray(values, float))
    return float(mean), float(se)


def _format(mean: float, se: float, digits: int = 4) -> str:
    """``mean ± se``; the mean alone where one unit gives no SE."""
    return f"{mean:.{digits}g}" if np.isnan(se) else f"{mean:.{digits}g} ± {se:.2g}"


def _values(rows: list[dict], name: str, **where) -> np.ndarray:
    chosen = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return np.array([r[name] for r in sorted(chosen, key=lambda r: r["seed"])], float)


# --------------------------------------------------------------------------- report


def _pairs(runs: list[dict], estimator: str, reference: str) -> stats.Estimate | None:
    """Test perplexity of ``estimator`` / ``reference`` - 1 over the seeds both trained
    (paired), from the runs of one setting; None if no seed has both."""
    mine = {r["seed"]: r["test_perplexity"] for r in runs if r["estimator"] == estimator}
    base = {r["seed"]: r["test_perplexity"] for r in runs if r["estimator"] == reference}
    seeds = sorted(set(mine) & set(base))
    if not seeds:
        return None
    return stats.sample_estimate(np.array([mine[s] / base[s] - 1 for s in seeds]))


def _trained_arms(runs: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in runs))


def _trained(runs: list[dict], setting: str) -> list[str]:
    return list(dict.fromkeys(r["estimator"] for r in runs if r["setting"] == setting))


def _alike_cells(runs: list[dict], config) -> dict:
    """Claim (2)'s cells: every trained hybrid against every other trained random-feature
    proposal of its setting, test perplexity ratio - 1 paired by seed."""
    cells = {}
    rival = competitors(config)
    for setting in SETTINGS:
        trained = _trained(runs, setting)
        hybrids = [e for e in trained if e in config.estimators and e not in rival]
        for hybrid in hybrids:
            for other in (e for e in trained if e in rival):
                estimate = _pairs([r for r in runs if r["setting"] == setting], hybrid, other)
                if estimate is not None:
                    cells[f"{hybrid} / {other}"] = estimate
    return cells


def _target_cells(runs: list[dict], config) -> dict:
    """Our target's cells: FAVOR+ / exact test perplexity - 1 per setting, paired by seed."""
    cells = {}
    for setting in SETTINGS:
        rows = [r for r in runs if r["setting"] == setting]
        estimate = _pairs(rows, config.favor_estimator, "exact")
        if estimate is not None:
            cells[SETTING_LABELS[setting]] = estimate
    return cells


def perplexity_rows(runs: list[dict], arms, judge: verdicts.Verdicts) -> list[dict]:
    """Per trained arm: perplexities, the softmax mass on the most frequent words (runs made
    before it was measured: "—"), the final tau and the training check's outcome."""
    rows = []
    check = judge.trained_check
    for arm in arms:
        setting, estimator = parse_arm(arm)
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        taus = [r["final_temperature"] for r in mine if r["final_temperature"] is not None]
        masses = [r["test_top_mass"] for r in mine if "test_top_mass" in r]
        checked = judge.arm_checks.get(arm_label(arm))
        rows.append(
            {
                "setting": SETTING_LABELS[setting],
                "proposal": estimator,
                "seeds": len(mine),
                "valid perplexity": _format(*mean_se(_values(runs, "valid_perplexity", arm=arm))),
                "test perplexity": _format(*mean_se(_values(runs, "test_perplexity", arm=arm))),
                f"top-{unigram.TOP_WORDS} mass (test)": _format(*mean_se(masses), 3)
                + (f" ({len(masses)} of {len(mine)} seeds)" if len(masses) < len(mine) else "")
                if masses
                else "—",
                "final tau": f"{np.mean(taus):.3g}" if taus else "—",
                "train min / run": float(np.mean(_values(runs, "train_seconds", arm=arm)) / 60),
                "training check": checked.outcome(check) if checked and check else "—",
            }
        )
    return rows


def top_mass_text(runs: list[dict], config) -> str:
    """The softmax mass that each arm's models put on the most frequent training words,
    against those words' share of the test targets (from the runs that measured it)."""
    measured = [r for r in runs if "test_top_mass" in r]
    if not measured:
        return "not measured (every run predates it)"
    share = float(np.mean([r["test_top_share"] for r in measured]))
    parts = []
    for arm in config.arms:
        masses = [r["test_top_mass"] for r in measured if r["arm"] == arm]
        if masses:
            parts.append(
                f"{arm_label(arm)} {np.mean(masses):.3f}"
                + (f" ({len(masses)} seed{'s' if len(masses) > 1 else ''})")
            )
    return (
        f"the {unigram.TOP_WORDS} most frequent training words are {share:.1%} of the test "
        f"targets; the models' mean softmax mass on them (test positions): " + ", ".join(parts)
    )


def _metric_means(metrics: list[dict], estimator: str, metric: str) -> np.ndarray:
    """Per model (in a fixed model order) the mean of ``metric`` for ``estimator``."""
    rows = sorted(
        (m for m in metrics if m["estimator"] == estimator), key=lambda m: (m["arm"], m["seed"])
    )
    return np.array([m[f"{metric}_mean"] for m in rows], float)


def _log_ratio(metrics: list[dict], competitor: str, hybrid: str, metric: str) -> np.ndarray:
    """ln(competitor's mean distance / hybrid's) per model."""
    return np.log(_metric_means(metrics, competitor, metric)) - np.log(
        _metric_means(metrics, hybrid, metric)
    )


def estimator_rows(results: dict, config) -> list[dict]:
    """Per estimator: m, n, width, XLA-measured FLOPs, and the mean W1, KS and negative
    fraction (mean over models ± 1 SE of each model's mean over queries and draws)."""
    metrics, flops, rows = results["metrics"], results["flops"], []
    reference = flops[config.favor_estimator]["construct"]
    for estimator in ("uniform", *config.estimators):
        row: dict = {"estimator": estimator}
        if estimator in config.estimators:
            options = estimator_options(config, estimator)
            hybrid = options["proposal"].endswith("_hybrid")
            m, n = options["num_features"], options["num_coefficient_features"]
            cost_ = flops[estimator]
            row.update(
                {
                    "m, n": f"{m}, {n}" if hybrid else f"{m}",
                    "width W": feature_width(options),
                    "construct GFLOP": cost_["construct"] / 1e9,
                    "construct / FAVOR+": cost_["construct"] / reference,
                    "clipped proposal GFLOP/step": cost_["clipped"] / 1e9,
                }
            )
        else:
            row.update(
                dict.fromkeys(
                    (
                        "m, n",
                        "width W",
                        "construct GFLOP",
                        "construct / FAVOR+",
                        "clipped proposal GFLOP/step",
                    ),
                    "—",
                )
            )
        for name, label in (("wasserstein", "W1"), ("ks", "KS"), ("negative_fraction", "neg.")):
            row[f"mean {label}"] = _format(*mean_se(_metric_means(metrics, estimator, name)), 3)
        rows.append(row)
    return rows


def claim1_rows(results: dict, config) -> list[dict]:
    """Per hybrid, competitor and metric: ln(competitor / hybrid) over models, the models where
    the hybrid is lower, and the within-model paired differences (query SE)."""
    metrics, pairs, rows = results["metrics"], results["pairs"], []
    hybrids = [e for e in config.estimators if e not in competitors(config)]
    for hybrid in hybrids:
        for competitor in competitors(config):
            for metric, label in (("wasserstein", "W1"), ("ks", "KS")):
                ratio = _log_ratio(metrics, competitor, hybrid, metric)
                within = [
                    p
                    for p in pairs
                    if (p["hybrid"], p["competitor"], p["metric"]) == (hybrid, competitor, metric)
                ]
                z = np.array([p["difference"] / p["se"] for p in within if p["se"] > 0])
                rows.append(
                    {
                        "hybrid": hybrid,
                        "claim (1)": "yes" if hybrid in config.hybrid_estimators else "—",
                        "vs": competitor,
                        "metric": label,
                        "ln(vs / hybrid), models": _format(*mean_se(ratio), 3),
                        "hybrid lower": f"{int(np.sum(ratio > 0))} of {len(ratio)}",
                        "paired z per model (min, max)": f"{z.min():+.1f}, {z.max():+.1f}"
                        if len(z)
                        else "—",
                    }
                )
    return rows


def diagnostic_rows(results: dict) -> list[dict]:
    """Per tau rule and proposal: means over the exact-proposal models of the diagnostic."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for model in results["diagnostic"]:
        for row in model["rows"]:
            rows.setdefault((row["tau_rule"], row["proposal"]), []).append(row)
    labels = {"proposal": "the proposal's tau", "heldout_kl": "held-out-KL tau"}
    return [
        {
            "tau": f"{labels[rule]} ({np.mean([r['tau'] for r in group]):.3g})",
            "proposal": proposal,
            "KL(model softmax ‖ proposal), nats": _format(
                *mean_se([r["proposal_kl"] for r in group]), 3
            ),
            "negative fraction": float(np.mean([r["negative_fraction"] for r in group])),
            "W1 vs kernel softmax": float(np.mean([r["wasserstein"] for r in group])),
        }
        for (rule, proposal), group in rows.items()
    ]


def arm_label(arm: str) -> str:
    """An arm as the summaries and verdicts name it: its estimator (``"<estimator> (cosine
    logits)"`` in the cosine setting)."""
    setting, estimator = parse_arm(arm)
    return estimator if setting == "normalised" else f"{estimator} ({SETTING_LABELS[setting]})"


def checked_runs(results: dict) -> list[dict]:
    """The runs with the training check's trivial model beside each: the count unigram
    model's test perplexity (a property of the data: ``measure`` stores it once)."""
    trivial = results.get("unigram_perplexity", {}).get("test")  # None: records predate it
    return [{**run, "unigram_test_perplexity": trivial} for run in results["runs"]]


def _remedy(config: ml_collections.ConfigDict) -> Callable[[list[str]], str]:
    """What would test a claim over arms that failed the training check, at the config's tau."""

    def remedy(arms: list[str]) -> str:
        follow_up = config.get("follow_up")
        where = (
            f"the variant `{follow_up}` (configs/lstm_lm.py:{follow_up}) probes a temperature "
            "declared for it"
            if follow_up
            else "(not run here) more random features, or a temperature between the two"
        )
        return (
            f"a proposal under which {', '.join(arms)} train. On the normalised vectors the "
            f"kernel exp(q_bar.e_bar / tau) varies by at most e^(2 / tau) across the vocabulary "
            f"(e^{2 / config.tau:.3g} at tau = {config.tau:g}): near tau = 1 every kernel "
            "proposal is near uniform, while the noise of the estimators built on "
            "trigonometric features grows like e^(1 / tau) (at tau = 0.1 about half of their "
            f"estimates are negative: the default's diagnostic); {where}"
        )

    return remedy


def claim1_cells(results: dict, config, models: set[tuple[str, int]]) -> dict:
    """Claim (1)'s cells, one per (hybrid, competitor, metric): ln(competitor's mean distance /
    hybrid's) per model, over the ``models`` ((arm, seed) of the trained models whose queries
    are scored), paired by query and draw within a model."""
    kept = [m for m in results["metrics"] if (m["arm"], m["seed"]) in models]
    cells = {}
    for hybrid in config.hybrid_estimators:
        for competitor in competitors(config):
            for metric, label in (("wasserstein", "W1"), ("ks", "KS")):
                ratio = _log_ratio(kept, competitor, hybrid, metric)
                if len(ratio):
                    cells[f"{hybrid} vs {competitor}, {label}"] = stats.sample_estimate(ratio)
    return cells


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares, each over the arms its test uses after
    the declared training check (a claim using an arm that failed it is not tested).

    Claim (1) scores the estimators on the queries of the trained models whose arm passed the
    check (the estimators are not trained; the models supply the queries), one cell per
    (hybrid, competitor, metric), holding only where every cell does; claim (2) is one cell per
    (hybrid, other random-feature proposal) pair; our target FAVOR+ against the exact proposal.
    """
    judge = verdicts.Verdicts(config)
    runs = results["runs"]
    judge.check_training(checked_runs(results), "arm", label=arm_label, remedy=_remedy(config))
    passed = [a for a in config.arms if arm_label(a) in judge.passed_arms()]
    models = {(m["arm"], m["seed"]) for m in results["metrics"] if m["arm"] in passed}
    cells = claim1_cells(results, config, models)
    if passed and cells and min(e.n for e in cells.values()) > 1:
        judge.every(
            "hybrids_most_accurate",
            cells,
            effect="ln(competitor's mean distance / hybrid's) per model, paired by query and "
            "draw within a model",
            cell_name="(hybrid, competitor, metric) cells",
            units="models",
            arms=[arm_label(a) for a in passed],
        )
    else:
        judge.not_tested(
            "hybrids_most_accurate",
            "fewer than 2 models of arms that passed the training check were scored",
        )
    alike, rf = _alike_cells(runs, config), tuple(config.estimators)
    if alike:
        judge.every(
            "proposals_alike",
            alike,
            effect="test perplexity hybrid / other random-feature proposal - 1, paired by seed",
            cell_name="pairs",
            units="seeds",
            arms=[arm_label(a) for a in _trained_arms(runs) if parse_arm(a)[1] in rf],
        )
    else:
        judge.not_tested(
            "proposals_alike", "no hybrid and no other random-feature proposal were both trained"
        )
    target = _target_cells(runs, config)
    if target:
        judge.ordering(
            "favor_within_20",
            target,
            effect="test perplexity FAVOR+ / exact softmax proposal - 1, paired by seed",
            cell_name="settings",
            units="seeds",
            arms=[config.favor_estimator, "exact"],
        )
    else:
        judge.not_tested("favor_within_20", "FAVOR+ and the exact proposal were not both trained")
    return judge


def _bar_axis(axis, labels, means, errors, title, log):
    axis.bar(range(len(labels)), means, yerr=errors, capsize=3, color="C0")
    axis.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    axis.set(title=title, yscale="log" if log else "linear")


def _plot_perplexity(runs, curves, arms, path: str) -> None:
    arms = [arm for arm in arms if arm in curves]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    stats_ = [mean_se(_values(runs, "test_perplexity", arm=arm)) for arm in arms]
    means = [m for m, _ in stats_]
    _bar_axis(
        left,
        list(arms),
        means,
        [0 if np.isnan(s) else s for _, s in stats_],
        "test perplexity (full softmax), mean ± 1 SE",
        max(means) / min(means) > 10,
    )
    for i, arm in enumerate(arms):
        series = [[r for r in records if r["split"] == "eval"] for records in curves[arm]]
        steps = [r["step"] for r in series[0]]
        values = np.exp(np.array([[r["nll"] for r in run] for run in series]))
        outputs.plot_mean_se(right, steps, values, color=f"C{i}", label=arm)
    right.set(
        xlabel="step",
        ylabel="validation perplexity (full softmax)",
        yscale="log",
        title="validation perplexity during training (band: ± 1 SE)",
    )
    right.legend(fontsize=7)
    outputs.save_figure(figure, path)


def _plot_metrics(results: dict, config, path: str) -> None:
    metrics = results["metrics"]
    estimators = ("uniform", *config.estimators)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for axis, (name, label) in zip(axes, (("wasserstein", "W1"), ("ks", "KS")), strict=True):
        stats_ = [mean_se(_metric_means(metrics, e, name)) for e in estimators]
        _bar_axis(
            axis,
            list(estimators),
            [m for m, _ in stats_],
            [0 if np.isnan(s) else s for _, s in stats_],
            f"mean {label} of the clipped estimate vs the kernel softmax\n"
            "(bars: mean over models ± 1 SE)",
            True,
        )
    outputs.save_figure(figure, path)


def _plot_temperature(results: dict, config, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    grid = np.asarray(config.tau_grid)
    for model in results["diagnostic"]:
        curve = np.asarray(model["divergence"])
        (line,) = left.plot(grid, curve, label=f"seed {model['seed']}")
        left.plot(grid[np.argmin(curve)], curve.min(), "o", color=line.get_color())
    left.axvline(config.tau, color="k", linestyle=":", label=f"tau = {config.tau:g}")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="tau",
        ylabel="KL(model softmax || kernel softmax), nats",
        title="held-out divergence of the trained exact-proposal models"
        "\n(raw logits; dot: the held-out-KL tau)",
    )
    left.legend(fontsize=7)
    for i, (arm, per_seed) in enumerate(results["curves"].items()):
        series = [
            [
                (r["step"], r.get("proposal_temperature", np.nan))
                for r in records
                if r["split"] == "train"
            ]
            for records in per_seed
        ]
        values = np.array([[v for _, v in run] for run in series], float)
        if np.all(np.isnan(values)):
            continue
        steps = [s for s, _ in series[0]]
        outputs.plot_mean_se(right, steps, values, color=f"C{i}", label=arm)
    right.set(
        xlabel="step",
        ylabel="proposal tau",
        yscale="log",
        title="tau of the kernel proposals during training (band: ± 1 SE)",
    )
    right.legend(fontsize=7)
    outputs.save_figure(figure, path)


def _setup_text(config, results: dict) -> str:
    tokens, model, sampler = results["tokens"], config.model, config.sampler
    steps = config.train.num_train_steps
    epochs = steps * config.train.batch_size * config.bptt / tokens["train"]
    seeds = sorted({r["seed"] for r in results["runs"]})
    models = len({(m["arm"], m["seed"]) for m in results["metrics"]})
    tau = (
        f"tau = {config.tau:g} (fixed)"
        if config.tau_rule == "fixed"
        else f"tau chosen every step on the held-out batch from {len(config.tau_grid)} values "
        f"between {min(config.tau_grid):.3g} and {max(config.tau_grid):.3g}"
    )
    return (
        f"Data: {PTB_SOURCE}; vocabulary V = {results['vocab_size']}. {tokens['train']:,} "
        f"training tokens, {tokens['valid']:,} validation and {tokens['test']:,} test tokens, "
        f"non-overlapping windows of {config.bptt} tokens, each from a zero LSTM state. Model: "
        f"{model.num_layers}-layer LSTM, hidden {model.hidden_size}, tied embeddings, dropout "
        f"{model.dropout_rate}; {config.train.optimizer}, lr {config.train.learning_rate} "
        f"({config.train.lr_schedule}), {steps} steps of {config.train.batch_size} windows "
        f"({epochs:.2f} epochs); seeds {tuple(seeds)} (of {tuple(config.seeds)} declared), "
        f"paired across arms. Sampled softmax: {sampler.num_samples} negatives with "
        f"replacement, log-proposal correction, accidental hits "
        f"{'removed' if sampler.remove_accidental_hits else 'kept'}; kernel proposals on the "
        f"normalised vectors at {tau}, the `{sampler.name}` sampler (uniform floor "
        f"{sampler.uniform_floor}) and {sampler.coupling} projections redrawn every step. "
        f"Distribution metrics: {config.num_metric_queries} validation queries x "
        f"{config.num_metric_draws} feature draws on each of {models} "
        f"trained models; diagnostic: {config.num_diagnostic_queries} queries x "
        f"{config.num_diagnostic_draws} draws on each exact-proposal model."
    )


def _timing(runs: list[dict]) -> str:
    starts = [r["load_average_start"] for r in runs if "load_average_start" in r]
    text = outputs.timing_text(runs)
    if starts:
        text += f" (mean 1-min load when they started: {np.mean(starts):.1f})"
    return text


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, the summary and the verdicts of ``measure``'s records."""
    runs, arms = results["runs"], tuple(config.arms)
    judged = judge(results, config)
    ppl_rows = perplexity_rows(runs, arms, judged)
    metric_rows = estimator_rows(results, config)
    alike, target = _alike_cells(runs, config), _target_cells(runs, config)
    passed = [a for a in config.arms if arm_label(a) in judged.passed_arms()]
    models = {(m["arm"], m["seed"]) for m in results["metrics"] if m["arm"] in passed}
    claim1 = claim1_cells(results, config, models)
    outputs.write_csv(os.path.join(workdir, "metrics.csv"), results["metrics"])
    _plot_metrics(results, config, os.path.join(workdir, "distribution_metrics.png"))
    _plot_perplexity(runs, results["curves"], arms, os.path.join(workdir, "perplexity.png"))
    _plot_temperature(results, config, os.path.join(workdir, "temperature.png"))
    diagnostic = diagnostic_rows(results)
    text = verdicts.write_summary(
        workdir,
        "lstm_lm",
        judged,
        config,
        setup=_setup_text(config, results),
        perplexity_table=outputs.markdown_table(ppl_rows),
        top_mass=top_mass_text(runs, config),
        unigram_perplexity=(
            f"{results['unigram_perplexity']['test']:.1f}"
            if "unigram_perplexity" in results
            else "not measured"
        ),
        alike_table=outputs.markdown_table(
            judged.cell_rows("proposals_alike", alike, cell_name="pair", units="seeds")
        )
        if alike
        else "not run",
        target_table=outputs.markdown_table(
            judged.cell_rows("favor_within_20", target, cell_name="setting", units="seeds")
        )
        if target
        else "not run",
        metric_table=outputs.markdown_table(metric_rows),
        claim1_table=outputs.markdown_table(claim1_rows(results, config)),
        claim1_pairs=outputs.markdown_table(
            judged.cell_rows(
                "hybrids_most_accurate",
                claim1,
                cell_name="(hybrid, competitor, metric)",
                units="models",
            )
        )
        if claim1
        else "none: no model of an arm that passed the training check was scored",
        claim1_models=", ".join(
            f"{arm_label(a)} ({sum(m[0] == a for m in models)})" for a in passed
        )
        or "none",
        diagnostic_table=outputs.markdown_table(diagnostic) if diagnostic else "not run",
        timing=_timing(runs),
    )
    # Runs made before a field was measured (the top-10 mass) leave its cell empty.
    columns = list(dict.fromkeys(key for run in runs for key in run))
    outputs.write_csv(
        os.path.join(workdir, "results.csv"),
        [{key: run.get(key, "") for key in columns} for run in runs],
    )
    print(text)
    return {"runs": runs, "perplexity": ppl_rows, "metrics": metric_rows}
