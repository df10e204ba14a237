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

Modules: ``task`` (data, model, training task, decoding and evaluation), ``reporting``
(comparisons, verdicts, tables, figures, summary); this module validates the config and
measures.
"""

from __future__ import annotations

import time

import ml_collections
import numpy as np

from experiments.conformer_ctc.reporting import (
    ORDERINGS,
    _gate,
    _summary_rows,
    comparisons,
    judge,
    ordering_cells,
    report,
    trigonometric_relative_sd,
)
from experiments.conformer_ctc.task import (
    HYBRIDS,
    RECORDINGS_PER_SPEAKER_DIGIT,
    SIGNIFICANCE,
    SPLITS,
    _label,
    _temperatures,
    _test_selection,
    digit_error_rate,
    edit_distance,
    evaluator,
    favor_swap_rate,
    greedy_ctc_decode,
    make_data,
    make_model,
    make_task,
    uniform_attention_rate,
    with_uniform_attention,
)
from experiments.core import outputs, records, sweep
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
from rfjax.nn import conformer_attentions

__all__ = [
    "HYBRIDS",
    "ORDERINGS",
    "SPLITS",
    "STUDY",
    "_summary_rows",
    "_test_selection",
    "comparisons",
    "digit_error_rate",
    "edit_distance",
    "evaluator",
    "greedy_ctc_decode",
    "judge",
    "make_data",
    "make_model",
    "make_task",
    "measure",
    "ordering_cells",
    "report",
    "train_run",
    "trigonometric_relative_sd",
    "validate_config",
    "with_uniform_attention",
]


STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=120,
    reproduces="HRF Sec. 4.3: Conformer-Performer with CTC on spoken digit strings (FSDD)",
)


# --------------------------------------------------------------------------- measure


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks names, the split and sizes before anything runs (by hand only the rule that spans
    the attentions and the optimiser).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "attentions")
    require_names(config, "attentions", conformer_attentions())
    require_nonempty(config, "seeds")
    require_names(config, "split", SPLITS)
    require_int(config, "first_test_index", minimum=1, maximum=RECORDINGS_PER_SPEAKER_DIGIT - 1)
    require_int(
        config,
        "min_digits",
        "num_swap_draws",
        "num_train_utterances",
        "num_test_utterances",
        "max_samples_per_digit",
        "num_mels",
        "eval_batch_size",
        "cluster_points",
        minimum=1,
    )
    require_int(config, "data_seed", minimum=0)
    sizes = ("model_dim", "num_layers", "num_heads", "ff_expansion", "kernel_size")
    features = ("num_features", "num_sign_features", "num_clusters", "redraw_interval")
    require_int(config.model, *sizes, *features, minimum=1, prefix="config.model")
    require_interval(config.model, "dropout_rate", interval="[0, 1)", prefix="config.model")
    require_positive(config.model, "hybrid_eps", "initial_temperature", prefix="config.model")
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
    evaluated = {name: final[f"eval_{name}"] for name in ("edit_distance", "reference_digits")}
    row = {
        "attention": attention,
        "seed": seed,
        "digit_error_rate": digit_error_rate(evaluated),
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
    settings = records.settings(config, exclude=("label", "attentions", "seeds", "gate_first"))

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
