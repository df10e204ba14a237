"""Performer-ViT on Fashion-MNIST: does SimRF attention beat ORF (and ORF IID)? (SimRF Sec. 5.4)

Runs. For every seed, one ViT with exact softmax attention and one Performer per (projection
protocol, coupling) are trained with ``experiments.core.train.trainer`` in
``workdir/runs/<run>_seed<k>`` (resumable: an interrupted experiment started again skips
finished runs). The runs of one seed are paired: the same parameter initialisation and the
same batches in the same order (both are functions of the seed only), so couplings differ only
in their random features.

Projection protocols (the projection is never a parameter; ``PerformerAttention`` draws it from
the run's ``"projection"`` stream and the step it is given):

* ``"fixed"``: one projection for the whole run (step 0's);
* ``"redraw"``: redrawn every ``model.redraw_interval`` steps up to ``redraw_until_step``, then
  kept for the rest of the run. With ``redraw_interval`` 1 and ``redraw_until_step`` the last
  step (the default config), a new projection at every step to the end: no projection is seen
  twice, so the model cannot co-adapt to one and stays a random-feature model of its attention
  (``is_redrawn_throughout``). With an earlier last redraw (the ``short`` config: step 500 of
  1,000) the model trains its last steps with the projection it is evaluated with.

Evaluation, on the full test set: with the run's own last projection (``accuracy_own``), and
with ``num_eval_draws`` fresh projections of the run's coupling (``accuracy_draws``, mean
``accuracy_fresh``: the expected accuracy of the random-feature model over draws). The primary
metric (``primary_metric``) is the fresh-draw accuracy for a model redrawn throughout (its own
last draw is one draw among all), and the own-projection accuracy, the model as trained, for
one that co-adapts to the projection it ends with (fresh draws lose much of its accuracy). The
gap own - fresh over all Performer runs is the check that the model is a random-feature model
(claim ``random_feature_model``). Paired differences over seeds (SimRF - ORF, ORF - IID,
exact - each Performer) with Student-t 95% intervals; a power estimate.

Seeds: ORF and SimRF train on seeds 0..``num_seeds[protocol]`` - 1, the references (exact and
IID, ``reference_attentions``) on the first ``num_reference_seeds``.

Attention error: on ``num_attention_images`` test images, the per-head queries and keys of
every layer of every trained model (sown by ``PerformerAttention``) give the exact attention
matrices softmax(q k^T / sqrt(H)); each coupling draws ``num_attention_draws`` projections and
estimates them with FAVOR+ (``rfjax.attention.favor_attention_weights``). Reported: the
relative Frobenius error |A_hat - A|_F / |A|_F over all layers, heads and images, mean over
draws, then mean ± SE over seeds per (trained model, coupling); beside it the error of the
uniform matrix 1 / S (an estimate that ignores queries and keys) and the learned temperatures.
The mechanism claim is one paired test over all trained models: SimRF - ORF error on each
model's queries and keys (``attention_error_difference``).

``measure`` trains and evaluates every run as a core sweep cell (its record kept with its
settings in ``runs/<run>_seed<k>/result.json``); ``report`` writes ``runs.csv``,
``differences.csv``, ``attention_error.csv``, ``paired_differences.png``,
``learning_curves.png``, ``attention_error.png``, ``summary.md`` (claims from the config,
verdicts by ``experiments.core.verdicts``, template ``experiments/performer_vit/summary.md``)
and ``verdicts.json``. ``measure_run``, ``load_arrays``, ``differences`` and the table helpers
are public: ``experiments.performer_vit_maps`` uses them.

Modules: ``task`` (arms, model, data, training task), ``evaluation`` (a trained model's
accuracies and attention errors), ``reporting`` (statistics, tables, figures, summary); this
module validates the config and measures (``measure``, ``measure_run``).
"""

from __future__ import annotations

import copy
import time

import ml_collections
import numpy as np

from experiments.core import outputs, records, sweep
from experiments.core.study import Study
from experiments.core.train import trainer as train
from experiments.core.validate import (
    require,
    require_int,
    require_interval,
    require_names,
    require_no_repeats,
    require_positive,
)
from experiments.performer_vit.evaluation import (
    attention_relative_errors,
    evaluate_run,
    fresh_draw_accuracies,
    queries_and_keys,
    uniform_attention_error,
)
from experiments.performer_vit.reporting import (
    accuracy_table,
    attention_error_difference,
    attention_error_rows,
    difference_table,
    differences,
    judge,
    lr_fraction,
    paired_row,
    report,
    seeds_at_3se,
)
from experiments.performer_vit.task import (
    LABELS,
    METRICS,
    PROTOCOLS,
    is_redrawn_throughout,
    load_arrays,
    make_model,
    make_task,
    num_seeds,
    pixel_stats,
    primary_metric,
    projection_step,
    run_name,
    run_names,
)
from rfjax import features, projections

__all__ = [
    "LABELS",
    "METRICS",
    "PROTOCOLS",
    "SEED_FIELD",
    "STUDY",
    "accuracy_table",
    "attention_error_difference",
    "attention_error_rows",
    "attention_relative_errors",
    "difference_table",
    "differences",
    "fresh_draw_accuracies",
    "headline",
    "is_redrawn_throughout",
    "judge",
    "load_arrays",
    "lr_fraction",
    "make_model",
    "make_task",
    "measure",
    "measure_run",
    "num_seeds",
    "one_seed",
    "paired_row",
    "pixel_stats",
    "primary_metric",
    "projection_step",
    "queries_and_keys",
    "report",
    "run_name",
    "run_names",
    "seeds_at_3se",
    "uniform_attention_error",
    "validate_config",
]


STUDY = Study(
    paper="Performers",
    order=140,
    reproduces=(
        "SimRF Sec. 5.4: Performer-ViT whose attention approximates softmax (normalised "
        "queries and keys, features redrawn at every step, 10k steps), ORF vs SimRF and "
        "exact, on Fashion-MNIST (Debian `dataset-fashion-mnist`); variant `short`: the "
        "1,000-step design with IID, whose models co-adapt to their projections"
    ),
)


IMAGE_SIDE = 28  # Fashion-MNIST images are 28 x 28


def validate_config(config: ml_collections.ConfigDict, prefix: str = "config") -> None:
    """Checks the attention and protocol names, seed counts, the redraw schedule and the sizes
    before anything runs (the trainer options are checked by ``train.validate_train_config``).

    ``prefix``: the config's path in the errors (``"config.vit"`` where it is a study's part).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "attentions", "protocols", "reference_attentions", prefix=prefix)
    require_names(config, "attentions", ("exact", *projections.available()), prefix=prefix)
    require_names(config.model, "feature_map", features.available(), prefix=f"{prefix}.model")
    require_names(config, "protocols", PROTOCOLS, prefix=prefix)
    missing = [p for p in config.protocols if p not in config.num_seeds]
    if missing:
        raise ValueError(f"{prefix}.num_seeds has no entry for the protocols {missing}")
    require_positive(config.num_seeds, *config.protocols, prefix=f"{prefix}.num_seeds")
    unknown = [a for a in config.reference_attentions if a not in config.attentions]
    if unknown:
        raise ValueError(
            f"{prefix}.reference_attentions {unknown} are not in {prefix}.attentions "
            f"{tuple(config.attentions)}"
        )
    if config.reference_attentions:
        require_positive(config, "num_reference_seeds", prefix=prefix)
    require_positive(
        config,
        "eval_batch_size",
        "num_eval_draws",
        "num_attention_images",
        "num_attention_draws",
        "target_difference",
        prefix=prefix,
    )
    # 0: all
    require_int(config, "num_train_examples", "num_test_examples", minimum=0, prefix=prefix)
    sizes = ("patch_size", "hidden_size", "num_heads", "mlp_dim", "num_features")
    require_int(config.model, *sizes, "redraw_interval", minimum=1, prefix=f"{prefix}.model")
    require_int(config.model, "num_layers", minimum=0, prefix=f"{prefix}.model")
    require(
        IMAGE_SIDE % config.model.patch_size == 0,
        "model.patch_size",
        config.model.patch_size,
        f"a divisor of the Fashion-MNIST image side {IMAGE_SIDE}",
        prefix,
    )
    require_interval(config.model, "dropout_rate", interval="[0, 1)", prefix=f"{prefix}.model")
    if "initial_temperature" in config.model:  # cosine attention (query_key_norm) only
        require_positive(config.model, "initial_temperature", prefix=f"{prefix}.model")
    steps = config.train.num_train_steps
    if "redraw" in config.protocols and not 0 <= config.redraw_until_step < steps:
        raise ValueError(
            f"{prefix}.redraw_until_step must be in [0, train.num_train_steps = {steps}), got "
            f"{config.redraw_until_step}"
        )


def measure_run(config, arrays: dict, name: str, attention: str, protocol, seed: int, workdir):
    """Trains (or resumes) one run in ``workdir/runs/<name>_seed<seed>`` and evaluates it: its
    record (accuracies, attention errors, train time) and learning curve."""
    model = make_model(config, attention)
    task = make_task(model, arrays["train"], arrays["test"], config, seed, protocol)
    cpu_start = time.process_time()
    final, run_dir, seconds = train.train_seed(config.train, workdir, name, seed, task)
    evaluation = evaluate_run(config, model, run_dir, arrays, seed, attention)
    draws = evaluation.get("accuracy_draws", [final["eval_accuracy"]])
    print(
        f"{name:>20} seed {seed}: accuracy own {final['eval_accuracy']:.4f}, fresh draws "
        f"{np.mean(draws):.4f} ({seconds:.0f} s)"
    )
    return {
        "run": name,
        "attention": attention,
        "protocol": protocol or "",
        "seed": seed,
        "accuracy_own": final["eval_accuracy"],
        "accuracy_draws": draws,
        "accuracy_fresh": float(np.mean(draws)),
        "test_loss": final["eval_loss"],
        "attention_error": evaluation["attention_error"],
        "uniform_attention_error": evaluation["uniform_attention_error"],
        "accuracy_uniform_attention": evaluation["accuracy_uniform_attention"],
        "temperatures": evaluation["temperatures"],
        **outputs.run_cost(seconds, cpu_start),
        "curve": train.read_metrics(run_dir),
    }


SEED_FIELD = "train.seed"  # the first seed: the runs train seeds train.seed, train.seed + 1, ...


def one_seed(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` whose runs train the seed ``train.seed`` alone: an ablation's cell
    (``core.ablation``), whose seeds must not share runs (with two seeds per run, seeds s and
    s + 1 both trained seed s + 1, and the paired test counted that run twice)."""
    config = copy.deepcopy(config)
    with config.unlocked():
        for protocol in config.num_seeds:
            config.num_seeds[protocol] = 1
        config.num_reference_seeds = 1
    return config


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains and evaluates every (run, seed) with the core sweep (the runs that share a seed
    count form one sweep, seeds outside; seeds from ``train.seed`` on); one record per run and
    the curves."""
    outputs.save_config(workdir, config)  # now too: a long run that stops early keeps it
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    arrays = load_arrays(config)
    variants = {name: (attention, protocol) for name, attention, protocol in run_names(config)}
    settings = records.settings(
        config,
        exclude=(
            "variant",
            "attentions",
            "protocols",
            "num_seeds",
            "num_reference_seeds",
            "reference_attentions",
        ),
    )
    cells = []
    for count in sorted({num_seeds(config, a, p) for a, p in variants.values()}, reverse=True):
        names = [n for n, (a, p) in variants.items() if num_seeds(config, a, p) == count]
        cells += sweep.run(
            workdir,
            names,
            range(config.train.seed, config.train.seed + count),
            lambda name, seed, _: measure_run(config, arrays, name, *variants[name], seed, workdir),
            settings,
        )
    cells.sort(key=lambda r: (r["seed"], list(variants).index(r["run"])))
    curves: dict[str, list] = {}
    for cell in sorted(cells, key=lambda r: (list(variants).index(r["run"]), r["seed"])):
        curves.setdefault(cell["run"], []).append(cell["curve"])
    return {
        "runs": [
            {k: v for k, v in c.items() if k not in ("curve", "arm", "seconds")} for c in cells
        ],
        "curves": curves,
        "num_train": len(arrays["train"]["label"]),
        "num_test": len(arrays["test"]["label"]),
    }


def headline(results: dict) -> dict[str, float]:
    """The numbers an ablation compares: the mean over the runs of the test accuracy (own
    projection, fresh draws) and the test loss, and for the training check the accuracy with
    uniform attention swapped in."""
    runs = results["runs"]
    return {
        metric: float(np.mean([r[metric] for r in runs]))
        for metric in ("accuracy_own", "accuracy_fresh", "test_loss", "accuracy_uniform_attention")
    }
