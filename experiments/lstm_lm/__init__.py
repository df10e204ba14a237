"""LSTM language model on Penn Treebank with random-feature sampled softmax (HRF Sec. 4.2, App. I).

Two settings (``SETTINGS``) make the kernel proposal consistent with the model it serves:

* ``"normalised"`` (the HRF paper's PTB setting, App. I.1): the model keeps raw logits q.e, the
  proposal is the softmax kernel exp(q_bar.e_bar / tau) of the normalised vectors. tau is chosen
  every step on a fixed held-out batch of validation windows: the tau of ``config.tau_grid`` that
  minimises KL(model softmax || kernel softmax) (``rfjax.nn.select_temperature``) under the
  current parameters (eval mode, no gradient).
* ``"cosine"`` (Rawat et al. 2019, and HRF App. I on WikiText2): the model's logits are
  s q_bar.e_bar with a learned scale s (``LSTMLanguageModel(logits="cosine")``), so the kernel
  softmax at tau = 1/s *is* the model's softmax; only the random-feature error separates a
  kernel proposal from the exact one.

Each arm ``"<setting>:<estimator>"`` of ``config.arms`` trains an ``rfjax.nn.LSTMLanguageModel``
per seed with the shared trainer (``experiments.core.train.trainer``; resumable runs in
``workdir/runs/<setting>-<estimator>_seed<k>``) on the sampled-softmax loss with M negatives
(``rfjax.nn.sample_proposal``; projections redrawn every step from ``fold_in(rng, step)``).
Estimators are named in ``config.estimators`` (a proposal, m and n); ``exact`` (the model's
softmax) and ``uniform`` are proposals without features. Seeds are paired: seed k gives every
arm of a setting the same initialisation, dropout masks and batch order. Evaluation: full
softmax perplexity on the validation and test windows (zero initial state per window).

Distribution metrics (HRF Fig. 3, Table 4) are measured on the same queries for every
estimator: for each seed, the queries of the model trained with ``config.metric_arm_proposal``
in each setting on ``num_metric_queries`` validation positions, against the kernel softmax
softmax(q_bar.e_bar / tau) (tau selected on the held-out batch for ``"normalised"``, 1/s for
``"cosine"``), over ``num_metric_draws`` feature draws; per model the median over queries and
draws (``experiments.lstm_lm.metrics``: W1 and KS of the clipped, normalised estimate, and the
fraction of negative estimates). The cost of every estimator is measured with XLA's cost
analysis at the training shapes (``proposal_flops``).

``measure`` trains and evaluates; ``report`` writes ``results.csv`` (one row per run),
``metrics.csv`` (one row per model and estimator), ``results.json``, ``summary.md`` (template
``experiments/lstm_lm/summary.md``), ``perplexity.png``, ``distribution_metrics.png`` and
``temperature.png``.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np

from experiments.core import cost, outputs, records, stats, sweep, verdicts
from experiments.core.train import distributed
from experiments.core.train import trainer as train
from experiments.lstm_lm.metrics import distribution_metrics
from rfjax.data import PTB_SOURCE, load_ptb
from rfjax.nn import (
    PLAIN_PROPOSALS,
    SAMPLERS,
    LSTMLanguageModel,
    feature_proposals,
    kernel_softmax_divergence,
    logit_temperature,
    normalize_for_proposal,
    proposal_features,
    sample_from_features,
    sample_proposal,
    sampled_softmax_loss,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SETTINGS = ("normalised", "cosine")
# Estimators without random features: the model's softmax, the kernel softmax computed exactly
# (the limit of many features), and uniform.
SETTING_LABELS = {
    "normalised": "raw logits, normalised proposal (HRF PTB)",
    "cosine": "cosine logits (Rawat et al.)",
}
METRICS = ("wasserstein", "ks", "negative_fraction")
SIGNIFICANCE = 0.05


# --------------------------------------------------------------------------- config


def parse_arm(arm: str) -> tuple[str, str]:
    """``"<setting>:<estimator>"`` -> (setting, estimator)."""
    setting, _, estimator = arm.partition(":")
    return setting, estimator


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ``ValueError`` naming the field for unknown arms, estimators or bad sizes."""
    if not config.arms or not config.seeds:
        raise ValueError("config.arms and config.seeds must be non-empty")
    known = (*PLAIN_PROPOSALS, *config.estimators.keys())
    for arm in config.arms:
        setting, estimator = parse_arm(arm)
        if setting not in SETTINGS or estimator not in known:
            raise ValueError(
                f"config.arms: {arm!r} must be '<setting>:<estimator>' with a setting in "
                f"{SETTINGS} and an estimator in {known}"
            )
    for name, options in config.estimators.items():
        if options.proposal not in feature_proposals():
            raise ValueError(
                f"config.estimators.{name}.proposal must be one of {feature_proposals()}, got "
                f"{options.proposal!r}"
            )
    if config.sampler.name not in SAMPLERS:
        raise ValueError(
            f"config.sampler.name must be one of {SAMPLERS}, got {config.sampler.name}"
        )
    for name in (
        "bptt",
        "num_metric_queries",
        "num_metric_draws",
        "eval_batch_size",
        "num_heldout_windows",
        "num_curve_tokens",
    ):
        if int(config[name]) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    if config.sampler.num_samples < 1:
        raise ValueError(
            f"config.sampler.num_samples must be >= 1, got {config.sampler.num_samples}"
        )
    if min(config.tau_grid) <= 0:
        raise ValueError(f"config.tau_grid must hold positive temperatures, got {config.tau_grid}")


def estimator_options(config: ml_collections.ConfigDict, estimator: str) -> dict:
    """``proposal`` and the ``proposal_features`` options of a named estimator."""
    if estimator in PLAIN_PROPOSALS:
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


def proposal_temperature(model, params, setting: str, inputs: np.ndarray, tau_grid) -> jax.Array:
    """tau of the kernel proposal: selected on the held-out batch (``"normalised"``) or the
    model's own 1/s (``"cosine"``, floored at the grid's smallest tau so that exp(1/tau) stays
    finite in float32; the logged tau shows when the floor binds); a constant for the
    gradient."""
    params = jax.lax.stop_gradient(params)
    if setting == "cosine":
        return jnp.maximum(logit_temperature(params), min(tau_grid))
    grid = jnp.asarray(tau_grid)
    return grid[jnp.argmin(divergence_curve(model, params, inputs, grid))]


# --------------------------------------------------------------------------- task


def make_model(config: ml_collections.ConfigDict, setting: str, vocab_size: int):
    return LSTMLanguageModel(
        vocab_size=vocab_size,
        logits="cosine" if setting == "cosine" else "dot",
        **config.model.to_dict(),
    )


def make_task(model, arrays, config, setting: str, estimator: str, seed: int) -> train.Task:
    """The trainer task: sampled-softmax loss (logging the proposal's tau); eval: full-softmax
    NLL and token count sums on the learning-curve validation windows (``curve_windows``)."""
    options = estimator_options(config, estimator)
    sampler = config.sampler
    heldout = jnp.asarray(heldout_inputs(arrays, config))
    tau_grid = tuple(config.tau_grid)

    def loss(params, batch, rng, step):
        rngs = train.step_rngs(rng, step, per_step=("dropout", "proposal"), fixed=())
        queries, table = model.apply(params, batch["inputs"], train=True, rngs=rngs)
        queries = queries.reshape(-1, queries.shape[-1])
        targets = batch["targets"].reshape(-1)
        extra, temperature = {}, jnp.float32(jnp.nan)
        if options["proposal"] in (*feature_proposals(), "kernel"):
            temperature = proposal_temperature(model, params, setting, heldout, tau_grid)
            extra["temperature"] = temperature
        if options["proposal"] in feature_proposals():
            extra.update(sampler=sampler.name, uniform_floor=sampler.uniform_floor)
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
        return {"nll": jnp.sum(jnp.where(mask, nll, 0.0)), "count": jnp.sum(mask)}

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


def perplexity(eval_fn, params, arrays: dict[str, np.ndarray], batch_size: int) -> float:
    """exp(mean NLL per token) over all windows of a split, full softmax (batches split over
    all devices of all processes: the same value on every process)."""
    totals = distributed.evaluate(eval_fn, params, train.padded_batches(arrays, batch_size))
    return float(np.exp(totals["nll"] / totals["count"]))


# --------------------------------------------------------------------------- estimator metrics


def proposal_flops(config: ml_collections.ConfigDict, estimator: str, vocab_size: int) -> dict:
    """XLA-measured FLOPs (compiled cost analysis) of one training step's proposal for a batch
    of B T queries with each sampler: the features of the vocabulary and the queries, then the
    draws."""
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
            key, queries, embeddings, proposal=proposal, temperature=jnp.float32(0.1), **options
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
        name: cost.compiled_flops(functools.partial(draw, sampler=name), *shapes)
        for name in SAMPLERS
    }


def estimator_metrics(
    model, params, inputs: np.ndarray, temperature: float, config, key: jax.Array
) -> dict[str, dict[str, float]]:
    """Median (and mean) W1, KS and negative fraction of every estimator's estimate of
    softmax(q_bar.e_bar / tau), over ``num_metric_queries`` queries and ``num_metric_draws``
    feature draws; ``uniform`` is scored as the flat estimate."""
    queries, table = model.apply(params, inputs, train=False)
    queries = queries.reshape(-1, queries.shape[-1])[: config.num_metric_queries]
    probabilities = jax.nn.softmax(
        normalize_for_proposal(queries, temperature) @ normalize_for_proposal(table, temperature).T,
        axis=-1,
    )
    results = {}
    uniform = distribution_metrics(probabilities, jnp.ones_like(probabilities))
    results["uniform"] = _summarise({k: np.asarray(v) for k, v in uniform.items()})
    for estimator in config.estimators:
        options = estimator_options(config, estimator)

        # Arrays enter as arguments, not closure constants (XLA would constant-fold them).
        @jax.jit
        def draws(keys, queries, table, probabilities, options=options):
            def one_draw(draw_key):
                query_features, class_features = proposal_features(
                    draw_key, queries, table, temperature=temperature, **options
                )
                return distribution_metrics(probabilities, query_features @ class_features.T)

            return jax.lax.map(one_draw, keys)

        keys = jax.random.split(jax.random.fold_in(key, len(results)), config.num_metric_draws)
        values = draws(keys, queries, table, probabilities)
        results[estimator] = _summarise({k: np.asarray(v) for k, v in values.items()})
    return results


def _summarise(values: dict[str, np.ndarray]) -> dict[str, float]:
    summary = {}
    for name, value in values.items():
        summary[f"{name}_median"] = float(np.median(value))
        summary[f"{name}_mean"] = float(np.mean(value))
    return summary


# --------------------------------------------------------------------------- measure


def train_run(config, arm: str, seed: int, context: dict, workdir: str) -> dict:
    """Trains (or resumes) one (arm, seed) run and measures it: its row, learning curve and,
    for the models of ``metric_arm_proposal``, the distribution metrics of every estimator (and
    the divergence curve of the normalised setting)."""
    arrays, vocab_size, heldout = context["arrays"], context["vocab_size"], context["heldout"]
    setting, estimator = parse_arm(arm)
    model = make_model(config, setting, vocab_size)
    task = make_task(model, arrays, config, setting, estimator, seed)
    cpu_start = time.process_time()
    _, run_dir, seconds = train.train_seed(config.train, workdir, run_name(arm), seed, task)
    params = train.final_params(run_dir)
    if task.eval_metrics is None:
        raise ValueError("the language-model task has no eval_metrics")
    eval_fn = task.eval_metrics
    tau = float(proposal_temperature(model, params, setting, heldout, config.tau_grid))
    row = {
        "arm": arm,
        "setting": setting,
        "estimator": estimator,
        "seed": seed,
        **{
            f"{split}_perplexity": perplexity(
                eval_fn, params, arrays[split], config.eval_batch_size
            )
            for split in ("valid", "test")
        },
        "final_temperature": tau,
        **outputs.run_cost(seconds, cpu_start),
    }
    print(
        f"{arm:>32} seed {seed}: valid ppl {row['valid_perplexity']:.1f}, test ppl "
        f"{row['test_perplexity']:.1f}, tau {tau:.3g} ({seconds:.0f} s)"
    )
    record = {"row": row, "curve": train.read_metrics(run_dir), "metrics": [], "divergence": None}
    if estimator == config.metric_arm_proposal:
        if setting == "normalised":
            record["divergence"] = np.asarray(
                divergence_curve(model, params, heldout, config.tau_grid)
            ).tolist()
        per_estimator = estimator_metrics(
            model, params, context["metric_inputs"], tau, config, jax.random.key(1000 + seed)
        )
        record["metrics"] = [
            {"setting": setting, "seed": seed, "estimator": name, "tau": tau, **values}
            for name, values in per_estimator.items()
        ]
    return record


def run_name(arm: str) -> str:
    """The run folder name of an arm: ``"<setting>-<estimator>"``."""
    setting, estimator = parse_arm(arm)
    return f"{setting}-{estimator}"


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains every (arm, seed) with the core sweep; returns runs, learning curves, estimator
    costs and metrics."""
    validate_config(config)
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    arrays, vocab_size = load_arrays(config)
    context = {
        "arrays": arrays,
        "vocab_size": vocab_size,
        "heldout": heldout_inputs(arrays, config),
        "metric_inputs": arrays["valid"]["inputs"][: -(-config.num_metric_queries // config.bptt)],
    }
    flops = {
        name: proposal_flops(config, name, vocab_size)
        for name in outputs.progress(config.estimators, "measuring proposal FLOPs")
    }
    arms = {run_name(arm): arm for arm in config.arms}
    cells = sweep.run(
        workdir,
        list(arms),
        config.seeds,
        lambda name, seed, _: train_run(config, arms[name], seed, context, workdir),
        records.settings(config, exclude=("variant", "arms", "seeds", "compilation_cache_dir")),
    )
    cells.sort(key=lambda r: (list(arms).index(r["arm"]), r["seed"]))  # arm-major, as the tables
    curves: dict[str, list] = {}
    for cell in cells:
        curves.setdefault(cell["row"]["arm"], []).append(cell["curve"])
    return {
        "runs": [cell["row"] for cell in cells],
        "curves": curves,
        "metrics": [m for cell in cells for m in cell["metrics"]],
        "divergences": [
            {"seed": cell["seed"], "divergence": cell["divergence"]}
            for cell in cells
            if cell["divergence"] is not None
        ],
        "flops": flops,
        "vocab_size": vocab_size,
        "tokens": {split: int(value["inputs"].size) for split, value in arrays.items()},
    }


# --------------------------------------------------------------------------- statistics


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error (ddof 1; nan for one value) of ``values``."""
    mean, se = stats.mean_se(np.asarray(values, float))
    return float(mean), float(se)


def _format(mean: float, se: float, digits: int = 4) -> str:
    return f"{mean:.{digits}g} ± {se:.2g}"


def _values(rows: list[dict], name: str, **where) -> np.ndarray:
    chosen = [r for r in rows if all(r[k] == v for k, v in where.items())]
    return np.array([r[name] for r in sorted(chosen, key=lambda r: r["seed"])], float)


# --------------------------------------------------------------------------- report


def ratio_rows(runs: list[dict], config) -> list[dict]:
    """Per setting: test perplexity FAVOR+ / model-softmax proposal, paired by seed."""
    rows = []
    favor, exact = config.favor_estimator, config.metric_arm_proposal
    for setting in SETTINGS:
        values = [
            _values(runs, "test_perplexity", setting=setting, estimator=e) for e in (favor, exact)
        ]
        if len(values[0]) and len(values[0]) == len(values[1]):
            rows.append(
                {
                    "setting": SETTING_LABELS[setting],
                    "test ppl FAVOR+ / exact (mean ± 1 SE, paired seeds)": _format(
                        *mean_se(values[0] / values[1])
                    ),
                }
            )
    return rows


def perplexity_rows(runs: list[dict], arms) -> list[dict]:
    rows = []
    for arm in arms:
        setting, estimator = parse_arm(arm)
        rows.append(
            {
                "setting": SETTING_LABELS[setting],
                "proposal": estimator,
                "seeds": len(_values(runs, "seed", arm=arm)),
                "valid perplexity": _format(*mean_se(_values(runs, "valid_perplexity", arm=arm))),
                "test perplexity": _format(*mean_se(_values(runs, "test_perplexity", arm=arm))),
                "final tau": float(np.mean(_values(runs, "final_temperature", arm=arm))),
            }
        )
    return rows


def estimator_rows(results: dict, config) -> list[dict]:
    """Per setting and estimator: width, measured FLOPs, median W1/KS (mean ± SE over seeds)
    and the paired difference against FAVOR+."""
    metrics, flops, rows = results["metrics"], results["flops"], []
    favor = config.favor_estimator
    for setting in SETTINGS:
        if not any(m["setting"] == setting for m in metrics):
            continue
        for estimator in ("uniform", *config.estimators):
            where = {"setting": setting, "estimator": estimator}
            row = {"setting": setting, "estimator": estimator}
            if estimator in config.estimators:
                options = estimator_options(config, estimator)
                cost = flops[estimator]
                row.update(
                    {
                        "m, n": f"{options['num_features']}, {options['num_coefficient_features']}"
                        if options["proposal"].endswith("hybrid")
                        else f"{options['num_features']}",
                        "width W": feature_width(options),
                        "GFLOP/step clipped": cost["clipped"] / 1e9,
                        "GFLOP/step decomposition": cost["decomposition"] / 1e9,
                    }
                )
            else:
                row.update(
                    {
                        "m, n": "—",
                        "width W": "—",
                        "GFLOP/step clipped": "—",
                        "GFLOP/step decomposition": "—",
                    }
                )
            for name, label in (("wasserstein", "W1"), ("ks", "KS")):
                values = _values(metrics, f"{name}_median", **where)
                row[f"median {label}"] = _format(*mean_se(values), digits=3)
                if estimator != favor:
                    reference = _values(metrics, f"{name}_median", setting=setting, estimator=favor)
                    test = stats.paired_difference(values, reference)
                    row[f"{label} - FAVOR+"] = (
                        f"{test.mean:+.3g} ± {test.se:.2g} (p = {test.p:.2g})"
                    )
                else:
                    row[f"{label} - FAVOR+"] = "—"
            row["negative fraction"] = float(
                np.mean(_values(metrics, "negative_fraction_mean", **where))
            )
            rows.append(row)
    return rows


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares."""
    judge = verdicts.Verdicts(config)
    runs, metrics, favor = results["runs"], results["metrics"], config.favor_estimator
    exact = config.metric_arm_proposal

    def ppl(setting, estimator):
        return _values(runs, "test_perplexity", setting=setting, estimator=estimator)

    def ratio(setting: str, estimator: str, reference: str):
        """Test perplexity estimator / reference - 1, paired by seed."""
        values, base = ppl(setting, estimator), ppl(setting, reference)
        if not len(values) or len(values) != len(base):
            return None
        return stats.sample_estimate(values / base - 1)

    within = {s: ratio(s, favor, exact) for s in SETTINGS}
    within = {s: e for s, e in within.items() if e is not None}
    judge.ordering(
        "favor_within_20",
        within,
        effect="test perplexity FAVOR+ / model softmax - 1, paired by seed",
        cell_name="settings",
        units="seeds",
    )
    random_feature = [e for e in config.estimators if e != favor]
    others = {
        (SETTING_LABELS[s], e): r
        for s in SETTINGS
        for e in random_feature
        if (r := ratio(s, e, favor)) is not None
    }
    judge.every(
        "proposals_alike",
        others,
        effect="test perplexity / FAVOR+'s - 1, paired by seed",
        cell_name="(setting, proposal)",
        units="seeds",
    )
    cells = {}
    for setting in SETTINGS:
        for estimator in config.equal_flops_estimators:
            for name, label in (("wasserstein", "W1"), ("ks", "KS")):
                values = _values(metrics, f"{name}_median", setting=setting, estimator=estimator)
                reference = _values(metrics, f"{name}_median", setting=setting, estimator=favor)
                if len(values) and len(values) == len(reference):
                    cells[(SETTING_LABELS[setting], estimator, label)] = stats.paired_difference(
                        reference, values
                    )
    judge.ordering(
        "hybrids_more_accurate",
        cells,
        effect="median distance FAVOR+ - hybrid at equal FLOPs, paired by seed",
        cell_name="(setting, hybrid, metric)",
        units="seeds",
    )
    return judge


def _bar_axis(axis, labels, means, errors, title, log):
    axis.bar(range(len(labels)), means, yerr=errors, capsize=3, color="C0")
    axis.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    axis.set(title=title, yscale="log" if log else "linear")


def _plot_perplexity(runs, curves, arms, path: str) -> None:
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
    settings = [s for s in SETTINGS if any(m["setting"] == s for m in metrics)]
    estimators = ("uniform", *config.estimators)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(len(settings), 1)
    for axis, (name, label) in zip(axes, (("wasserstein", "W1"), ("ks", "KS")), strict=True):
        for j, setting in enumerate(settings):
            stats_ = [
                mean_se(_values(metrics, f"{name}_median", setting=setting, estimator=e))
                for e in estimators
            ]
            axis.bar(
                np.arange(len(estimators)) + j * width,
                [m for m, _ in stats_],
                width,
                yerr=[0 if np.isnan(s) else s for _, s in stats_],
                capsize=2,
                label=SETTING_LABELS[setting],
            )
        axis.set_xticks(np.arange(len(estimators)) + width * (len(settings) - 1) / 2)
        axis.set_xticklabels(estimators, rotation=35, ha="right", fontsize=8)
        axis.set(
            yscale="log",
            title=f"median {label} of the clipped estimate vs the kernel softmax\n"
            "(bars: mean over seeds ± 1 SE)",
        )
        axis.legend(fontsize=7)
    outputs.save_figure(figure, path)


def _plot_temperature(results: dict, config, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    grid = np.asarray(config.tau_grid)
    for row in results["divergences"]:
        curve = np.asarray(row["divergence"])
        (line,) = left.plot(grid, curve, label=f"seed {row['seed']}")
        left.plot(grid[np.argmin(curve)], curve.min(), "o", color=line.get_color())
    left.set(
        xscale="log",
        yscale="log",
        xlabel="tau",
        ylabel="KL(model softmax || kernel softmax), nats",
        title=f"held-out divergence of the trained {config.metric_arm_proposal}-proposal models"
        "\n(raw logits; dot: the selected tau)",
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
    return (
        f"Data: {PTB_SOURCE}; vocabulary V = {results['vocab_size']}. {tokens['train']:,} "
        f"training tokens, {tokens['valid']:,} validation and {tokens['test']:,} test tokens, "
        f"non-overlapping windows of {config.bptt} tokens, each from a zero LSTM state. Model: "
        f"{model.num_layers}-layer LSTM, hidden {model.hidden_size}, tied embeddings, dropout "
        f"{model.dropout_rate}; {config.train.optimizer}, lr {config.train.learning_rate} "
        f"({config.train.lr_schedule}), {steps} steps of {config.train.batch_size} windows "
        f"({epochs:.2f} epochs); seeds {tuple(config.seeds)}, paired across arms. Sampled "
        f"softmax: {sampler.num_samples} negatives with replacement, log-proposal correction, "
        f"accidental hits {'removed' if sampler.remove_accidental_hits else 'kept'}; kernel "
        f"proposals use the `{sampler.name}` sampler (uniform floor {sampler.uniform_floor}) and "
        f"{sampler.coupling} projections redrawn every step. tau grid: "
        f"{len(config.tau_grid)} values from {min(config.tau_grid):.3g} to "
        f"{max(config.tau_grid):.3g} (log-spaced); held-out batch: the last "
        f"{config.num_heldout_windows} validation windows. Distribution metrics: "
        f"{config.num_metric_queries} validation queries x {config.num_metric_draws} feature "
        f"draws per model."
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, the summary and the verdicts of ``measure``'s records."""
    runs, arms = results["runs"], tuple(config.arms)
    ppl_rows = perplexity_rows(runs, arms)
    metric_rows = estimator_rows(results, config)
    if results["metrics"]:
        outputs.write_csv(os.path.join(workdir, "metrics.csv"), results["metrics"])
        _plot_metrics(results, config, os.path.join(workdir, "distribution_metrics.png"))
    _plot_perplexity(runs, results["curves"], arms, os.path.join(workdir, "perplexity.png"))
    _plot_temperature(results, config, os.path.join(workdir, "temperature.png"))
    text = verdicts.write_summary(
        workdir,
        "lstm_lm",
        judge(results, config),
        config,
        setup=_setup_text(config, results),
        perplexity_table=outputs.markdown_table(ppl_rows),
        ratio_table=outputs.markdown_table(ratio_rows(runs, config))
        if ratio_rows(runs, config)
        else "not run",
        metric_table=outputs.markdown_table(metric_rows) if metric_rows else "not run",
        timing=outputs.timing_text(runs),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), runs)
    print(text)
    return {"runs": runs, "perplexity": ppl_rows, "metrics": metric_rows}
