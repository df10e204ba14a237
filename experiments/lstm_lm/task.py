"""The LSTM language model task: arms (setting and estimator), the PTB windows, the proposal
temperature, the model and its sampled-softmax training task.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core import (
    ptb,
    unigram,
)
from experiments.core.train import distributed
from experiments.core.train import trainer as train
from rfjax.nn import LSTMLanguageModel, logit_temperature
from rfjax.sampled_softmax import (
    PLAIN_PROPOSALS,
    feature_proposals,
    kernel_softmax_divergence,
    normalize_for_proposal,
    proposal_features,
    sample_proposal,
    sampled_softmax_loss,
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


def parse_arm(arm: str) -> tuple[str, str]:
    """``"<setting>:<estimator>"`` -> (setting, estimator)."""
    setting, _, estimator = arm.partition(":")
    return setting, estimator


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


def load_arrays(config: ml_collections.ConfigDict) -> tuple[dict, int]:
    """Train/valid/test windows of ``config.bptt`` tokens (the first ``num_*_tokens`` of each
    split; 0: all) and V (``experiments.core.ptb``)."""
    return ptb.load_windows(config.bptt, config.num_train_tokens, config.num_eval_tokens)


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
