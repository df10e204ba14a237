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

Modules: ``task`` (arms, data, proposal temperature, model and training task),
``estimator_metrics`` (the estimators' FLOPs, distribution metrics and diagnostic on a trained
model), ``metrics`` (the distribution metrics themselves), ``reporting`` (statistics, tables,
verdicts, figures, summary); this module validates the config and measures.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import ml_collections

from experiments.core import (
    outputs,
    records,
    sweep,
    unigram,
)
from experiments.core.study import Study
from experiments.core.train import trainer as train
from experiments.core.validate import (
    require,
    require_int,
    require_interval,
    require_names,
    require_no_repeats,
    require_nonempty,
    require_positive,
)
from experiments.lstm_lm.estimator_metrics import (
    model_metrics,
    proposal_diagnostic,
    proposal_flops,
)
from experiments.lstm_lm.reporting import (
    arm_label,
    checked_runs,
    claim1_rows,
    diagnostic_rows,
    estimator_rows,
    judge,
    mean_se,
    perplexity_rows,
    report,
    top_mass_text,
)
from experiments.lstm_lm.task import (
    BASELINE_PROPOSALS,
    METRICS,
    SETTING_LABELS,
    SETTINGS,
    SIGNIFICANCE,
    TAU_RULES,
    competitors,
    curve_windows,
    divergence_curve,
    estimator_options,
    evaluate_split,
    feature_width,
    heldout_inputs,
    heldout_temperature,
    load_arrays,
    make_model,
    make_task,
    parse_arm,
    proposal_temperature,
)
from rfjax.sampled_softmax import (
    PLAIN_PROPOSALS,
    SAMPLERS,
    feature_proposals,
)

__all__ = [
    "BASELINE_PROPOSALS",
    "METRICS",
    "METRICS_DIR",
    "METRIC_FIELDS",
    "SETTINGS",
    "SETTING_LABELS",
    "SIGNIFICANCE",
    "STUDY",
    "SWEEP_FIELDS",
    "TAU_RULES",
    "UNCLAIMED_BASELINES",
    "arm_groups",
    "arm_label",
    "checked_runs",
    "claim1_rows",
    "competitors",
    "curve_windows",
    "diagnostic_rows",
    "divergence_curve",
    "estimator_options",
    "estimator_rows",
    "evaluate_split",
    "feature_width",
    "heldout_inputs",
    "heldout_temperature",
    "judge",
    "load_arrays",
    "make_model",
    "make_task",
    "mean_se",
    "measure",
    "metrics_run",
    "model_metrics",
    "parse_arm",
    "perplexity_rows",
    "proposal_diagnostic",
    "proposal_flops",
    "proposal_temperature",
    "report",
    "run_name",
    "top_mass_text",
    "train_run",
    "training_settings",
    "validate_config",
]


STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=110,
    reproduces=(
        "HRF Sec. 4.2: LSTM language model on Penn Treebank with random-feature sampled softmax"
    ),
)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the arms, the estimators, the sampler and the sizes before anything runs (by hand
    only the rules that span fields: an arm's estimator among ``config.estimators``, the
    hybrids' competitors, the metric chunks).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "arms", "hybrid_estimators")
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
        prefix = f"config.estimators.{name}"
        require_names(options, "proposal", feature_proposals(), prefix)
        require_int(options, "num_features", "num_coefficient_features", minimum=1, prefix=prefix)
    require_names(config, "favor_estimator", tuple(config.estimators))
    require_names(config, "hybrid_estimators", tuple(config.estimators))
    if not competitors(config):
        raise ValueError(
            "config.estimators needs a non-hybrid estimator for the hybrids to be compared with"
        )
    require_names(config.sampler, "name", SAMPLERS, "config.sampler")
    require_names(config, "tau_rule", TAU_RULES)
    require_int(config, "num_train_tokens", "num_eval_tokens", minimum=0)  # 0: all
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
    require_interval(config.sampler, "uniform_floor", interval="(0, 1]", prefix="config.sampler")
    require_int(config.model, "hidden_size", minimum=1, prefix="config.model")
    require_int(config.model, "num_layers", minimum=0, prefix="config.model")
    require_interval(config.model, "dropout_rate", interval="[0, 1)", prefix="config.model")
    require_positive(config.model, "initial_logit_scale", prefix="config.model")
    require(
        config.num_metric_queries % config.metric_query_chunk == 0,
        "num_metric_queries",
        config.num_metric_queries,
        f"a multiple of config.metric_query_chunk = {config.metric_query_chunk}",
    )
    require_positive(config, "tau", "tau_grid")


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
SWEEP_FIELDS = ("variant", "arms", "seeds", "baseline_seeds")

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
