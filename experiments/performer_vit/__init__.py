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
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Literal

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
from experiments.core.validate import require_names, require_positive
from rfjax import features, projections
from rfjax.attention import draw_projection, favor_attention_weights
from rfjax.data import load_fashion_mnist
from rfjax.nn import PerformerViT

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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

PROTOCOLS = ("fixed", "redraw")
METRICS = {"accuracy_own": "own projection", "accuracy_fresh": "fresh draws"}
LABELS = {
    "exact": "exact",
    "gaussian": "IID",
    "orthogonal": "ORF",
    "simplex": "SimRF",
    "simplex_plus": "SimRF+",
}
# (better, worse) pairs whose paired differences are reported, when both were trained.
COMPARISONS = (("simplex", "orthogonal"), ("orthogonal", "gaussian"), ("simplex", "gaussian"))


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the attention and protocol names, seed counts, the redraw schedule and the sizes
    before anything runs (the trainer options are checked by ``train.validate_train_config``).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_names(config, "attentions", ("exact", *projections.available()))
    require_names(config.model, "feature_map", features.available(), prefix="config.model")
    require_names(config, "protocols", PROTOCOLS)
    missing = [p for p in config.protocols if p not in config.num_seeds]
    if missing:
        raise ValueError(f"config.num_seeds has no entry for the protocols {missing}")
    require_positive(config.num_seeds, *config.protocols, prefix="config.num_seeds")
    unknown = [a for a in config.reference_attentions if a not in config.attentions]
    if unknown:
        raise ValueError(
            f"config.reference_attentions {unknown} are not in config.attentions "
            f"{tuple(config.attentions)}"
        )
    if config.reference_attentions:
        require_positive(config, "num_reference_seeds")
    require_positive(
        config,
        "eval_batch_size",
        "num_eval_draws",
        "num_attention_images",
        "num_attention_draws",
        "target_difference",
    )
    steps = config.train.num_train_steps
    if "redraw" in config.protocols and not 0 <= config.redraw_until_step < steps:
        raise ValueError(
            f"config.redraw_until_step must be in [0, train.num_train_steps = {steps}), got "
            f"{config.redraw_until_step}"
        )


def _label(attention: str) -> str:
    return LABELS.get(attention, attention)


def run_name(attention: str, protocol: str | None) -> str:
    """``"exact"`` or ``"<protocol>_<coupling>"``: the run directory's prefix."""
    return attention if attention == "exact" else f"{protocol}_{attention}"


def run_names(config: ml_collections.ConfigDict) -> list[tuple[str, str, str | None]]:
    """(run name, attention, protocol) of every trained variant: exact once, then each
    (protocol, coupling)."""
    names: list[tuple[str, str, str | None]] = []
    if "exact" in config.attentions:
        names.append(("exact", "exact", None))
    for protocol in config.protocols:
        names += [(run_name(a, protocol), a, protocol) for a in config.attentions if a != "exact"]
    return names


def num_seeds(config: ml_collections.ConfigDict, attention: str, protocol: str | None) -> int:
    """Seeds 0..n-1 of a variant: ``num_reference_seeds`` for the reference attentions (exact,
    IID), else ``num_seeds[protocol]`` (sized by the power estimate)."""
    if attention in config.reference_attentions:
        return config.num_reference_seeds
    return config.num_seeds[protocol]


def is_redrawn_throughout(config: ml_collections.ConfigDict, protocol: str | None) -> bool:
    """Whether ``protocol`` draws a new projection at every training step to the last."""
    return (
        protocol == "redraw"
        and config.model.redraw_interval == 1
        and config.redraw_until_step == config.train.num_train_steps - 1
    )


def primary_metric(config: ml_collections.ConfigDict, protocol: str | None) -> str:
    """The accuracy a protocol's Performers are judged by: the mean over fresh draws for a
    model redrawn throughout (a random-feature model: its accuracy is an expectation over
    draws), the accuracy with its own projection for one that co-adapts to the projection it
    ends with (the model as trained)."""
    return "accuracy_fresh" if is_redrawn_throughout(config, protocol) else "accuracy_own"


def projection_step(step: jax.Array, protocol: str | None, redraw_until_step: int) -> jax.Array:
    """The step that selects the projection used at training step ``step``."""
    if protocol == "redraw":
        return jnp.minimum(step, redraw_until_step)
    return jnp.zeros_like(step)  # "fixed" (and exact attention, which draws nothing)


def make_model(config: ml_collections.ConfigDict, attention: str) -> PerformerViT:
    """The ViT of ``config.model`` with exact attention or a Performer with that coupling."""
    kind = {"attention_kind": "exact"} if attention == "exact" else {"coupling": attention}
    options: dict[str, Any] = {**config.model.to_dict(), **kind}
    return PerformerViT(num_classes=10, **options)


def pixel_stats(train_images: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of the training pixels / 255."""
    return float(np.mean(train_images) / 255), float(np.std(train_images) / 255)


def _normaliser(train_images: np.ndarray):
    mean, std = pixel_stats(train_images)

    def normalise(images):
        return (images.astype(jnp.float32) / 255 - mean) / std

    return normalise


def make_task(
    model: PerformerViT,
    train_arrays: dict,
    test_arrays: dict,
    config: ml_collections.ConfigDict,
    seed: int,
    protocol: str | None,
) -> train.Task:
    """Cross-entropy on normalised images; eval: accuracy and loss sums over the test set, with
    the projection of the last update."""
    normalise = _normaliser(train_arrays["image"])

    def loss(params, batch, rng, step):
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=True,
            projection_step=projection_step(step, protocol, config.redraw_until_step),
            rngs=train.step_rngs(rng, step),
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
        return jnp.mean(losses), {"accuracy": accuracy}

    def eval_metrics(params, batch, rng, step):
        # The projection of the last update (step - 1): the one the parameters were trained with.
        last = projection_step(jnp.maximum(step - 1, 0), protocol, config.redraw_until_step)
        logits = model.apply(
            params,
            normalise(batch["image"]),
            train=False,
            projection_step=last,
            rngs=train.step_rngs(rng, step, per_step=()),
        )
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        correct = jnp.argmax(logits, -1) == batch["label"]
        weights = batch["mask"]
        return {
            "accuracy": jnp.sum(correct & weights),
            "loss": jnp.sum(jnp.where(weights, losses, 0)),
            "count": jnp.sum(weights),
        }

    def init(rng, batch):
        params_rng, projection_rng = jax.random.split(rng)
        return model.init(
            {"params": params_rng, "projection": projection_rng},
            normalise(batch["image"]),
            train=False,
        )

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


def _load(split: Literal["train", "test"], data_dir: str, limit: int) -> dict[str, np.ndarray]:
    images, labels = load_fashion_mnist(split, data_dir=data_dir)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return {"image": images, "label": labels}


def load_arrays(config: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
    """The train and test splits of ``config`` (limited to its example counts)."""
    return {
        "train": _load("train", config.data_dir, config.num_train_examples),
        "test": _load("test", config.data_dir, config.num_test_examples),
    }


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
            "compilation_cache_dir",
            "target_difference",
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


# --------------------------------------------------------------------------- statistics


def seeds_at_3se(sd: float, target: float) -> int:
    """Paired seeds n at which ``target`` is 3 SE: n = (3 sd / target)^2, at least 2."""
    return max(2, math.ceil((3 * sd / target) ** 2))


def differences(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Paired differences per protocol and metric: better - worse coupling, exact - each."""
    rows = []
    for protocol in config.protocols:
        pairs = [
            (run_name(a, protocol), run_name(b, protocol))
            for a, b in COMPARISONS
            if a in config.attentions and b in config.attentions
        ]
        if "exact" in config.attentions:
            pairs += [("exact", run_name(a, protocol)) for a in config.attentions if a != "exact"]
        for metric in METRICS:
            for better, worse in pairs:
                a, b = tabulate.paired(
                    tabulate.by_seed(runs, metric, run=better),
                    tabulate.by_seed(runs, metric, run=worse),
                )
                if len(a) < 2:
                    continue
                difference = stats.paired_difference(a, b)
                rows.append(
                    {
                        "protocol": protocol,
                        "metric": metric,
                        "primary": metric == primary_metric(config, protocol),
                        "comparison": f"{_label(better.split('_')[-1])} - "
                        f"{_label(worse.split('_')[-1])}",
                        **difference.as_dict(),
                        "seeds_for_target_at_3se": seeds_at_3se(
                            difference.sd, config.target_difference
                        ),
                    }
                )
    return rows


def accuracy_table(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Mean ± SE over seeds of both accuracies per run."""
    rows = []
    for name, attention, protocol in run_names(config):
        row: dict[str, Any] = {"protocol": protocol or "-", "attention": _label(attention)}
        for metric in METRICS:
            values = tabulate.seed_values(runs, metric, run=name)
            row[f"test accuracy, {METRICS[metric]}"] = tabulate.summarise(values)
        row["seeds"] = len(values)
        rows.append(row)
    return rows


def attention_error_rows(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Per trained model: each coupling's attention error, mean ± SE over seeds, SimRF - ORF
    (paired by seed: the same queries and keys), the uniform matrix's error and the learned
    temperatures (where the records have them)."""
    couplings = [c for c in config.attentions if c != "exact"]
    rows = []
    for name, attention, protocol in run_names(config):
        mine = sorted((r for r in runs if r["run"] == name), key=lambda r: r["seed"])
        row: dict[str, Any] = {
            "queries and keys of": f"{protocol or ''} {_label(attention)}".strip()
        }
        errors = {c: np.array([r["attention_error"][c] for r in mine]) for c in couplings}
        for coupling in couplings:
            mean, se = (float(v) for v in stats.mean_se(errors[coupling]))
            row[_label(coupling)] = tabulate.plus_minus(mean, se)
            row[f"{coupling}_mean"] = mean
            row[f"{coupling}_se"] = se
        if {"simplex", "orthogonal"} <= set(couplings):
            row["SimRF / ORF"] = f"{errors['simplex'].mean() / errors['orthogonal'].mean():.3f}"
            row["SimRF - ORF"] = "-"
            if len(mine) > 1:  # paired by model: both couplings see the same queries and keys
                diff = stats.paired_difference(errors["simplex"], errors["orthogonal"])
                row["SimRF - ORF"] = tabulate.plus_minus(diff.mean, diff.se, "+.4f")
        if all("uniform_attention_error" in r for r in mine):
            row["uniform 1/S"] = tabulate.summarise(
                np.array([r["uniform_attention_error"] for r in mine])
            )
        if all(r.get("temperatures") for r in mine):
            row["learned tau (min-max)"] = _range([t for r in mine for t in r["temperatures"]])
        rows.append(row)
    return rows


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _performer_runs(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["attention"] != "exact"]


def attention_error_difference(
    runs: list[dict], config: ml_collections.ConfigDict
) -> stats.Estimate | None:
    """SimRF - ORF attention error, one paired test over every trained model (each model's
    queries and keys estimated by both couplings); None if either coupling was not drawn."""
    if not {"simplex", "orthogonal"} <= set(config.attentions):
        return None
    errors = {c: [r["attention_error"][c] for r in runs] for c in ("simplex", "orthogonal")}
    return stats.paired_difference(errors["simplex"], errors["orthogonal"])


def random_feature_gap(runs: list[dict]) -> stats.Estimate:
    """Own-projection minus fresh-draw accuracy, paired by run over every Performer run: near 0
    for a random-feature model, large for one co-adapted to its projection."""
    performers = _performer_runs(runs)
    return stats.paired_difference(
        [r["accuracy_own"] for r in performers], [r["accuracy_fresh"] for r in performers]
    )


# --------------------------------------------------------------------------- report


def _plot_differences(rows: list[dict], config, path: str) -> None:
    """Forest plot: paired differences of each protocol's primary accuracy, 95% t intervals."""
    shown = [r for r in rows if r["primary"]]
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(shown) + 2.2))
    labels = [f"{r['protocol']} ({METRICS[r['metric']]}): {r['comparison']}" for r in shown]
    plots.forest(
        ax,
        [r["mean"] for r in shown],
        [[r["mean"] - r["low"] for r in shown], [r["high"] - r["mean"] for r in shown]],
        labels,
        color="C0",
        top_down=True,
        label="mean paired difference, 95% t interval",
        fontsize=8,
    )
    ax.axvline(
        config.target_difference,
        color="C3",
        linestyle="--",
        linewidth=0.8,
        label=f"paper's SimRF - ORF gain ({100 * config.target_difference:+.1f} points)",
    )
    ax.set_xlabel("test accuracy difference, paired by seed (percentage points)")
    ax.xaxis.set_major_formatter(lambda value, _: f"{100 * value:+.1f}")
    # Above the axes: inside, it would cover the points of the lowest rows.
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    outputs.save_figure(fig, path)


def _plot_curves(curves: dict, config, path: str) -> None:
    """Train loss and test accuracy (own projection) vs step: mean over seeds, ±1 SE band."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, (name, attention, protocol) in enumerate(run_names(config)):
        style = "--" if protocol == "redraw" else "-"
        label = f"{protocol or ''} {_label(attention)}".strip()
        for axis, (split, metric) in zip(
            axes, (("train", "loss"), ("eval", "accuracy")), strict=True
        ):
            steps, values = plots.logged_series(curves[name], split, metric)
            plots.mean_se_band(axis, steps, values, color=f"C{index}", label=label, style=style)
    for axis in axes:
        if "redraw" in config.protocols:
            axis.axvline(config.redraw_until_step, color="grey", linewidth=0.8, linestyle=":")
    axes[0].set(xlabel="step", ylabel="train loss", yscale="log", title="training loss")
    axes[1].set(
        xlabel="step",
        ylabel="test accuracy (own projection)",
        title="test accuracy; dotted: last redraw",
    )
    axes[1].legend(fontsize=7, title="mean over seeds, band ±1 SE", title_fontsize=7)
    outputs.save_figure(figure, path)


def _plot_attention_error(rows: list[dict], config, path: str) -> None:
    """Relative attention-matrix error per coupling on each trained model's q, k (±2 SE bars)."""
    couplings = [c for c in config.attentions if c != "exact"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 3.8))
    width = 0.8 / len(couplings)
    x = np.arange(len(rows))
    for index, coupling in enumerate(couplings):
        ax.bar(
            x + (index - (len(couplings) - 1) / 2) * width,
            [r[f"{coupling}_mean"] for r in rows],
            width,
            yerr=[2 * r[f"{coupling}_se"] for r in rows],
            capsize=2,
            color=f"C{index}",
            label=_label(coupling),
        )
    ax.set_xticks(x, [r["queries and keys of"] for r in rows], fontsize=7, rotation=20)
    ax.set_ylabel("|A_hat - A|_F / |A|_F")
    ax.set_title(
        f"FAVOR+ attention-matrix error, m = {config.model.num_features} (bars ±2 SE over seeds)",
        fontsize=9,
    )
    ax.legend(fontsize=7, title="coupling", title_fontsize=7)
    outputs.save_figure(fig, path)


def _find(rows: list[dict], protocol: str, comparison: str) -> dict:
    """The row of ``comparison`` on ``protocol``'s primary metric ({} if not measured)."""
    for row in rows:
        if (row["protocol"], row["comparison"]) == (protocol, comparison) and row["primary"]:
            return row
    return {}


def _difference(row: dict) -> stats.Estimate:
    return stats.Estimate(row["mean"], row["se"], row["n"], row["n"] - 1)


def judge(diff_rows: list[dict], runs: list[dict], config) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares, each over the runs (arms) its test uses
    after the declared training check: the primary accuracy differences per protocol (pooled
    over protocols, or every protocol for "never worse"), SimRF - ORF attention error in one
    paired test over every trained model, and own - fresh accuracy over every Performer run
    (the model is a random-feature model)."""
    judge = verdicts.Verdicts(config)
    judge.check_training(runs, "run")
    for name, comparison in (("simrf_beats_orf", "SimRF - ORF"), ("orf_beats_iid", "ORF - IID")):
        cells = {
            p: _difference(row)
            for p in config.protocols
            if (row := _find(diff_rows, p, comparison))
        }
        if not cells:
            judge.not_tested(name, f"no {comparison} pair with two or more seeds was trained")
            continue
        judge.ordering(
            name,
            cells,
            effect=f"{comparison} test accuracy ({_primary_text(config)}), paired by seed",
            cell_name="protocols",
            units="seeds",
            number=".4f",
            arms=_comparison_runs(runs, cells, comparison),
        )
    never_worse = {
        p: _difference(row) for p in config.protocols if (row := _find(diff_rows, p, "SimRF - ORF"))
    }
    judge.every(
        "simrf_never_worse",
        never_worse,
        effect=f"SimRF - ORF test accuracy ({_primary_text(config)}), paired by seed",
        cell_name="protocols",
        units="seeds",
        number=".4f",
        arms=_comparison_runs(runs, never_worse, "SimRF - ORF") or None,
    )
    error = attention_error_difference(runs, config) if len(runs) > 1 else None
    if error is None:
        judge.not_tested(
            "attention_error", "fewer than two models with ORF and SimRF attention estimated"
        )
    else:
        judge.effect(
            "attention_error",
            error,
            effect="SimRF - ORF attention error, paired on each trained model's queries and keys",
            units="models",
            number=".4f",
            arms=sorted({r["run"] for r in runs}),
        )
    if len(_performer_runs(runs)) > 1:
        judge.effect(
            "random_feature_model",
            random_feature_gap(runs),
            effect="own-projection - fresh-draw test accuracy, paired by Performer run",
            units="runs",
            number=".4f",
            arms=sorted({r["run"] for r in _performer_runs(runs)}),
        )
    else:
        judge.not_tested("random_feature_model", "fewer than two Performers were trained")
    return judge


def _comparison_runs(runs: list[dict], cells: dict, comparison: str) -> list[str]:
    """The runs (arms) of a "A - B" coupling comparison on the protocols of ``cells``."""
    names = {label: name for name, label in LABELS.items()}
    couplings = [names[part.strip()] for part in comparison.split(" - ")]
    return sorted(
        {r["run"] for r in runs if r["protocol"] in cells and r["attention"] in couplings}
    )


def _primary_text(config) -> str:
    """The primary metrics of the trained protocols, in words."""
    return ", ".join(f"{p}: {METRICS[primary_metric(config, p)]}" for p in config.protocols)


def difference_text(row: dict) -> str:
    if not row:
        return "not measured"
    return tabulate.estimate_text(
        row["mean"], row["se"], (row["low"], row["high"]), details=[f"{row['n']} seeds"]
    )


def _power_text(rows: list[dict], config) -> str:
    lines = []
    for protocol in config.protocols:
        row = _find(rows, protocol, "SimRF - ORF")
        if not row:
            continue
        lines.append(
            f"- {protocol}: sd of the paired SimRF - ORF difference {row['sd']:.4f}; with "
            f"{row['n']} seeds its SE is {row['se']:.4f}; "
            f"{stats.units_for_power(row['sd'], config.target_difference)} seeds give 80% "
            f"power at {config.target_difference} ({row['seeds_for_target_at_3se']} would put "
            "it at 3 SE)."
        )
    return "\n".join(lines) or "- not measured (no SimRF - ORF pair with two or more seeds)"


def _protocol_text(config) -> str:
    """One bullet per trained protocol."""
    texts = {"fixed": "**fixed**: one projection for the whole run"}
    if is_redrawn_throughout(config, "redraw"):
        texts["redraw"] = (
            "**redraw**: a new projection at every training step to the last, so no projection "
            "is seen twice and none can be co-adapted to"
        )
    else:
        steps_after = config.train.num_train_steps - config.redraw_until_step
        texts["redraw"] = (
            f"**redraw**: redrawn every {config.model.redraw_interval} steps up to step "
            f"{config.redraw_until_step}, then kept: the last {steps_after} steps train with "
            "the projection the model is evaluated with, starting at "
            f"{lr_fraction(config, config.redraw_until_step):.2f} of the peak learning rate"
        )
    return "\n".join(f"- {texts[p]};" for p in config.protocols)


def _scores_text(config) -> str:
    if config.model.get("query_key_norm", False):
        return (
            "normalised queries and keys (cosine scores tau q^.k^ with a learned per-head "
            f"temperature, initialised at {config.model.initial_temperature})"
        )
    return "scores q.k / sqrt(H) (queries and keys not normalised)"


def _timing_text(runs: list[dict]) -> str:
    if all("load_average" in r for r in runs):
        return outputs.timing_text(runs)
    minutes = sum(r["train_seconds"] for r in runs) / 60
    return f"{len(runs)} runs took {minutes:.1f} min wall clock of training (load not recorded)"


def _claim_values(diff_rows: list[dict], runs: list[dict], config) -> dict[str, object]:
    """The differences, errors and gaps the summary's claims quote."""
    values: dict[str, object] = {}
    for name, comparison in (("simrf_orf", "SimRF - ORF"), ("orf_iid", "ORF - IID")):
        texts = [
            f"{p} {difference_text(_find(diff_rows, p, comparison))}" for p in config.protocols
        ]
        values[name] = "; ".join(texts)
    couplings = [c for c in config.attentions if c != "exact"]
    errors = [
        f"{_label(c)} {tabulate.summarise(np.array([r['attention_error'][c] for r in runs]))}"
        for c in couplings
    ]
    if all("uniform_attention_error" in r for r in runs):
        uniform = np.array([r["uniform_attention_error"] for r in runs])
        errors.append(f"uniform 1/S {tabulate.summarise(uniform)}")
    values["mean_errors"] = ", ".join(errors) + f" ({len(runs)} models)"
    gaps = []
    for protocol in config.protocols:
        mine = [r for r in _performer_runs(runs) if r["protocol"] == protocol]
        if len(mine) > 1:
            gap = random_feature_gap(mine)
            gaps.append(
                f"{protocol} {tabulate.plus_minus(gap.mean, gap.se, '+.4f')} ({gap.n} runs)"
            )
    values["gap_by_protocol"] = "; ".join(gaps) or "not measured"
    return values


def _write_files(results: dict, diff_rows: list, error_rows: list, config, workdir: str) -> None:
    """runs.csv, differences.csv, attention_error.csv and the three figures."""
    flat_runs = [
        {
            **{
                k: v
                for k, v in r.items()
                if k not in ("accuracy_draws", "attention_error", "temperatures")
            },
            **{f"attention_error_{c}": e for c, e in r["attention_error"].items()},
            **({"mean_temperature": np.mean(r["temperatures"])} if r.get("temperatures") else {}),
        }
        for r in results["runs"]
    ]
    outputs.write_csv(os.path.join(workdir, "runs.csv"), flat_runs)
    if diff_rows:
        outputs.write_csv(os.path.join(workdir, "differences.csv"), diff_rows)
        _plot_differences(diff_rows, config, os.path.join(workdir, "paired_differences.png"))
    outputs.write_csv(
        os.path.join(workdir, "attention_error.csv"),
        [{k: v for k, v in r.items() if not k.startswith("_")} for r in error_rows],
    )
    _plot_curves(results["curves"], config, os.path.join(workdir, "learning_curves.png"))
    _plot_attention_error(error_rows, config, os.path.join(workdir, "attention_error.png"))


def difference_table(diff_rows: list[dict], primary: bool) -> str:
    """The primary (SimRF - ORF) or secondary paired differences as a markdown table."""
    shown = [r for r in diff_rows if r["primary"] == primary]
    if not shown:
        return "(fewer than two paired seeds: no differences)"
    return outputs.markdown_table(
        [
            {
                "protocol": r["protocol"],
                "metric": METRICS[r["metric"]],
                "difference": r["comparison"],
                "mean ± SE": tabulate.plus_minus(r["mean"], r["se"], "+.4f"),
                "95% CI": f"[{r['low']:+.4f}, {r['high']:+.4f}]",
                "seeds": r["n"],
                "sd": f"{r['sd']:.4f}",
            }
            for r in shown
        ]
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures and the summary from ``measure``'s results."""
    runs = results["runs"]
    diff_rows = differences(runs, config)
    accuracy_rows = accuracy_table(runs, config)
    error_rows = attention_error_rows(runs, config)
    _write_files(results, diff_rows, error_rows, config, workdir)
    verdicts.write_summary(
        workdir,
        "performer_vit",
        judge(diff_rows, runs, config),
        config,
        protocols=", ".join(config.protocols),
        head_dim=config.model.hidden_size // config.model.num_heads,
        scores=_scores_text(config),
        num_train=results["num_train"],
        num_test=results["num_test"],
        seeds=", ".join(f"{p} {config.num_seeds[p]}" for p in config.protocols),
        reference=" and ".join(_label(a) for a in config.reference_attentions) or "none",
        protocol_text=_protocol_text(config),
        primary=_primary_text(config),
        **_claim_values(diff_rows, runs, config),
        power=_power_text(diff_rows, config),
        accuracy_table=outputs.markdown_table(accuracy_rows),
        difference_table=difference_table(diff_rows, True),
        secondary_difference_table=difference_table(diff_rows, False),
        attention_table=outputs.markdown_table(
            [{k: v for k, v in r.items() if not k.endswith(("_mean", "_se"))} for r in error_rows]
        ),
        timing=_timing_text(runs),
    )
    print(outputs.markdown_table(accuracy_rows))
    print(difference_table(diff_rows, True))
    return {"runs": runs, "differences": diff_rows, "attention_error": error_rows}


def lr_fraction(config: ml_collections.ConfigDict, step: int) -> float:
    """The learning rate at ``step`` as a fraction of the peak."""
    _, schedule = train.make_optimizer(config.train)
    return float(schedule(step)) / config.train.learning_rate
