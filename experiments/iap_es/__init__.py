"""Implicit-attention policies trained by evolution strategies (HRF Sec. 4.4, App. K.1).

The HRF paper (arXiv:2110.04367) replaces FAVOR+ by the angular hybrid inside an Implicit
Attention Policy (IAP, masking variant; Choromanski et al., arXiv:2102.04353) trained by ES, and
reports (App. K.1, Fig. 4) that "HRF with 8 x 8 random projections performs as well as the
softmax kernel with 256 random projections": the same policy quality for about 3x fewer FLOPs.
Its robot (a quadruped walking on stepping stones from depth images) is not available, so this
runs the same comparison on a real JAX environment with image observations: MinAtar games from
Pgx (``pgx.make("minatar-breakout")``, 10 x 10 x 4 boolean images).

Every attention kind (``config.kinds``) trains ``rfjax.nn.ImplicitAttentionPolicy`` with
OpenAI-ES (``experiments.core.train.es``) for each seed. Runs are paired: a seed fixes the initial
parameters, the ES perturbations, the episodes and the evaluation episodes for every kind, so
kinds differ only by their attention. For each run we record the evaluation return of the ES
mean over the generations, the policy evaluations (forward passes) spent and hence the
cumulative attention FLOPs (``experiments.iap_es.flops.policy_importance_flops`` per forward pass;
XLA's own count is reported beside it). The quality of a run is its mean evaluation return
over the last ``final_evals`` evaluations; kinds are compared with the reference (FAVOR+,
m = 256) by paired differences over seeds (mean, SE, a t interval and the difference detectable
with 80% power), and the paper's claim is tested as equivalence within a margin (two one-sided
t tests at 5%, i.e. a 90% interval inside +-margin).

Each finished run's measurements are recorded beside its metrics (``runs/<run>/result.json``,
with the settings they were made under), so a committed sweep can be extended by seeds without
its checkpoints: runs recorded under the same settings are reused, the new seeds are trained.
With ``config.seeds_together > 1`` (an accelerator's setting) the new seeds of a kind are trained
and measured that many at a time in one vmapped program (``measure_together``), with the same
records as one at a time.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import ml_collections
import numpy as np
import pgx

from experiments.core import cost, outputs, plots, records, stats, sweep, tabulate, verdicts
from experiments.core.study import Study
from experiments.core.train import es
from experiments.core.train import trainer as train
from experiments.core.validate import require, require_int, require_names, require_nonempty
from experiments.iap_es.flops import (
    exact_crossover_patches,
    policy_feature_shape,
    policy_importance_flops,
)
from rfjax import features as feature_maps
from rfjax.nn import IAP_ATTENTIONS, ImplicitAttentionPolicy

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=130,
    reproduces=(
        "HRF Sec. 4.4, App. K.1: implicit-attention policies trained by evolution "
        "strategies, the angular hybrid vs FAVOR+"
    ),
)

_KIND = re.compile(r"^(?P<attention>[a-z_]+)(:(?P<m>\d+)(x(?P<n>\d+))?)?$")
_FLOP_FIELDS = ("importance_flops", "xla_importance_flops")
_INFERENCE_STREAM = 7  # fold_in tag of the inference-swap episodes (training uses split(key, 3))
_NAMES = {
    "exact": "exact softmax",
    "positive": "FAVOR+",
    "trigonometric": "trigonometric",
    "angular_hybrid": "HRF angular",
    "gaussian_hybrid": "HRF Gaussian",
}


# --------------------------------------------------------------------------- kinds


def parse_kind(kind: str) -> dict:
    """``"exact"``, ``"positive:256"``, ``"angular_hybrid:8x8"`` (m x n) -> policy attributes."""
    match = _KIND.match(kind) if isinstance(kind, str) else None
    if match is None or match["attention"] not in IAP_ATTENTIONS:
        raise ValueError(
            f"kinds must hold 'exact' or '<attention>:<m>' or '<hybrid>:<m>x<n>' with attention "
            f"in {IAP_ATTENTIONS}; got {kind!r}"
        )
    attention = match["attention"]
    hybrid = attention.endswith("_hybrid")
    if (attention == "exact") != (match["m"] is None) or hybrid != (match["n"] is not None):
        raise ValueError(
            f"kind {kind!r}: exact takes no size, FAVOR+/trigonometric take ':m', hybrids ':mxn'"
        )
    spec = {"attention": attention}
    if match["m"] is not None:
        spec["num_features"] = int(match["m"])
    if match["n"] is not None:
        spec["num_sign_features"] = int(match["n"])
    return spec


def kind_label(kind: str) -> str:
    spec = parse_kind(kind)
    name = _NAMES.get(spec["attention"]) or feature_maps.info(spec["attention"]).label
    if "num_sign_features" in spec:
        return f"{name} {spec['num_features']}x{spec['num_sign_features']}"
    return f"{name} m={spec['num_features']}" if "num_features" in spec else name


def run_name(kind: str) -> str:
    return kind.replace(":", "_m")


def make_env(config: ml_collections.ConfigDict):
    if config.env not in pgx.available_envs():
        raise ValueError(f"env must be a Pgx environment, got {config.env!r}")
    return pgx.make(config.env)


def make_policy(config: ml_collections.ConfigDict, env, kind: str) -> ImplicitAttentionPolicy:
    return ImplicitAttentionPolicy(
        image_shape=tuple(env.observation_shape),
        num_actions=env.num_actions,
        **config.policy.to_dict(),
        **parse_kind(kind),
    )


def make_rollout(config: ml_collections.ConfigDict, env, policy) -> es.Rollout:
    def act(params, observation, projection):
        return jnp.argmax(policy.apply(params, observation, projection))

    return es.Rollout(env, act, policy.draw_projection, max_steps=config.max_steps)


def inference_evaluator(rollout: es.Rollout, num_episodes: int):
    """A jitted ``(params, key) -> returns`` of ``num_episodes`` episodes of one policy played
    with ``rollout``'s attention (the inference swap: any kind's trained parameters fit every
    kind's policy, they share one layout)."""

    @jax.jit
    def returns(params, key):
        totals, _ = rollout.returns(jax.tree.map(lambda x: x[None], params), key, num_episodes)
        return totals[0]

    return returns


def xla_importance_flops(policy: ImplicitAttentionPolicy) -> float:
    """XLA's FLOP count (``cost_analysis``) of one patch-importance computation."""
    count, d = policy.num_patches(), policy.embed_dim
    query = jax.ShapeDtypeStruct((count, d), jnp.float32)
    projection = jax.eval_shape(policy.draw_projection, jax.random.key(0))
    return cost.compiled_flops(policy.patch_importance, query, query, projection)


# --------------------------------------------------------------------------- measure


def initial_params(policy: ImplicitAttentionPolicy, seed: int):
    """The initial parameters of a seed: the same for every kind (they share the layout)."""
    projection = policy.draw_projection(jax.random.key(0))
    return policy.init(jax.random.key(seed), jnp.zeros(policy.image_shape), projection)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the kinds, the seeds and the sizes before anything runs (by hand only the rules
    that span fields: the evaluation schedule of ``config.es``).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_nonempty(config, "kinds", "seeds")
    for kind in config.kinds:
        parse_kind(kind)
    require_names(config, "reference", tuple(config.kinds))
    require_names(config, "claim_kind", tuple(config.kinds))
    require_int(config, "inference_episodes", "seeds_together", minimum=1)
    require(
        config.es.eval_every % config.es.log_every == 0,
        "es.eval_every",
        config.es.eval_every,
        f"a multiple of config.es.log_every = {config.es.log_every} (FLOPs are counted at each "
        "evaluation)",
    )
    evaluations = config.es.num_generations // config.es.eval_every + 1
    require_int(config, "final_evals", minimum=1, maximum=evaluations)


def _curve(run_dir: str, flops_per_pass: float) -> dict:
    metrics = train.read_metrics(run_dir)
    passes = {r["step"]: r["forward_passes"] for r in metrics if r["split"] == "train"}
    evals = [r for r in metrics if r["split"] == "eval"]
    generations = np.array([r["step"] for r in evals])
    cumulative = np.array([sum(v for s, v in passes.items() if s <= g) for g in generations])
    return {
        "generation": generations.tolist(),
        "return": [r["return"] for r in evals],
        "return_se": [r["return_se"] for r in evals],
        "forward_passes": cumulative.tolist(),
        "attention_flops": (cumulative * flops_per_pass).tolist(),
    }


def probe_observations(env, key: jax.Array, num_episodes: int, num_steps: int) -> jax.Array:
    """Observations of random-action episodes, ``(num_episodes * num_steps, H, W, C)``."""
    init_key, action_key = jax.random.split(key)

    def advance(states, step_key):
        action_key, env_key = jax.random.split(step_key)
        actions = jax.random.randint(action_key, (num_episodes,), 0, env.num_actions)
        states = jax.vmap(env.step)(states, actions, jax.random.split(env_key, num_episodes))
        return states, states.observation

    states = jax.vmap(env.init)(jax.random.split(init_key, num_episodes))
    _, frames = jax.lax.scan(advance, states, jax.random.split(action_key, num_steps))
    return frames.reshape(-1, *frames.shape[2:])


def mask_agreement(policy: ImplicitAttentionPolicy, observations: jax.Array, draws: int):
    """A jitted ``(params, key) -> agreement``: the mean fraction of exact attention's top-k
    patches that ``policy``'s estimate also keeps, over ``observations`` and ``draws``
    projections, with the same parameters (1 for exact attention)."""
    exact_policy = policy.clone(attention="exact")

    def mask(module, params, projection):
        _, state = module.apply(params, observations, projection, mutable="intermediates")
        return state["intermediates"]["mask"][0]

    @jax.jit
    def agreement(params, key):
        exact = mask(exact_policy, params, None)

        def kept_by_both(draw_key):
            estimate = mask(policy, params, policy.draw_projection(draw_key))
            return jnp.mean(jnp.sum(estimate & exact, axis=-1))

        return jnp.mean(jax.lax.map(kept_by_both, jax.random.split(key, draws))) / policy.num_kept

    return agreement


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Measures every (kind, seed) with the core sweep: a run recorded under the same settings is
    reused, any other is trained (resuming from its checkpoint if interrupted) and recorded."""
    validate_config(config)
    train.enable_compilation_cache(workdir, config.compilation_cache_dir)
    env = make_env(config)
    observations = probe_observations(env, jax.random.key(2024), 64, 16)
    kinds = {}
    for kind in config.kinds:
        policy = make_policy(config, env, kind)
        template, rollout = initial_params(policy, seed=0), make_rollout(config, env, policy)
        kinds[kind] = {
            "label": kind_label(kind),
            "policy": policy,
            "trainer": es.ESTrainer(config.es, rollout, template),
            "inference": inference_evaluator(rollout, config.inference_episodes),
            "importance_flops": policy_importance_flops(policy),
            "xla_importance_flops": xla_importance_flops(policy),
            "agreement": mask_agreement(policy, observations, config.agreement_draws),
        }
    start = time.perf_counter()
    settings = run_settings(config)
    if config.seeds_together > 1:
        measure_together(config, kinds, workdir, settings)
    runs = sweep.run(
        workdir,
        [run_name(kind) for kind in config.kinds],
        config.seeds,
        lambda arm, seed, run_dir: train_run(config, kinds, _kind_of(config, arm), seed, run_dir),
        settings,
    )
    return {
        "kinds": {
            kind: {k: v for k, v in info.items() if k in ("label", *_FLOP_FIELDS)}
            for kind, info in kinds.items()
        },
        "flops": flop_counts(config, env),
        "runs": runs,
        "seconds": time.perf_counter() - start,
    }


def run_settings(config: ml_collections.ConfigDict) -> dict:
    """What a run's record depends on: the config less the seeds, the label and how the runs
    are executed (the compilation cache, how many seeds train together)."""
    return records.settings(
        config, exclude=("seeds", "label", "compilation_cache_dir", "seeds_together")
    )


def flop_counts(config: ml_collections.ConfigDict, env) -> dict[str, dict]:
    """Per kind of ``config.kinds`` and exact attention (trained or not, the cost every
    random-feature kind is weighed against): the analytic and XLA FLOPs of one patch-importance
    computation and, for the random-feature kinds, the fewest patches at which they cost fewer
    analytic FLOPs than exact attention."""
    counts = {}
    for kind in dict.fromkeys(("exact", *config.kinds)):
        policy = make_policy(config, env, kind)
        counts[kind] = {
            "label": kind_label(kind),
            "num_patches": policy.num_patches(),
            "importance_flops": policy_importance_flops(policy),
            "xla_importance_flops": xla_importance_flops(policy),
        }
        if kind != "exact":
            width, rows = policy_feature_shape(policy)
            counts[kind]["crossover_patches"] = exact_crossover_patches(
                policy.embed_dim, feature_width=width, projection_rows=rows
            )
    return counts


def _kind_of(config: ml_collections.ConfigDict, arm: str) -> str:
    return next(kind for kind in config.kinds if run_name(kind) == arm)


def train_run(
    config: ml_collections.ConfigDict, kinds: dict, kind: str, seed: int, run_dir: str
) -> dict:
    """Trains (or resumes from ``run_dir``'s checkpoint) one (kind, seed) run and measures it:
    its curve, final return, mask agreement with exact attention and inference returns."""
    info = kinds[kind]
    began, cpu = time.perf_counter(), time.process_time()
    trainer, params = info["trainer"], initial_params(info["policy"], seed)
    trainer.train(run_dir, params, seed=seed)
    final_mean = trainer.final_mean(run_dir, params, seed=seed)
    print(f"{info['label']:>24} seed {seed}: trained ({time.perf_counter() - began:.0f} s)")
    return {
        **run_record(config, info, kind, seed, run_dir),
        "seconds": time.perf_counter() - began,
        "cpu_seconds": time.process_time() - cpu,
        "mask_agreement": float(info["agreement"](final_mean, jax.random.key(seed))),
        "inference_return": inference_returns(kinds, final_mean, run_key=(seed, kind)),
    }


def inference_returns(kinds: dict, params, *, run_key: tuple[int, str]) -> dict[str, float]:
    """Mean return of one trained policy played with every kind's attention on the same
    episodes, ``inference_key(kinds, *run_key)``."""
    key = inference_key(kinds, *run_key)
    return {kind: float(jnp.mean(info["inference"](params, key))) for kind, info in kinds.items()}


def measure_together(
    config: ml_collections.ConfigDict, kinds: dict, workdir: str, settings: dict
) -> None:
    """Measures the cells without a record as ``train_run`` does, ``config.seeds_together``
    seeds of a kind in one program (``ESTrainer.train_together``; the agreement and inference
    evaluations ``vmap`` over the group too) and records them. Groups of seeds are the outer
    loop, so an interruption leaves complete pairs. A cell's ``seconds`` and ``cpu_seconds`` are
    its group's divided by the group's size."""

    def unrecorded(kind: str, seeds) -> list[int]:
        return [
            seed
            for seed in seeds
            if sweep.read(
                sweep.run_dir(workdir, run_name(kind), seed),
                settings,
                arm=run_name(kind),
                seed=seed,
            )
            is None
        ]

    missing = [s for s in config.seeds if any(unrecorded(kind, [s]) for kind in config.kinds)]
    for first in range(0, len(missing), config.seeds_together):
        for kind, info in kinds.items():
            group = unrecorded(kind, missing[first : first + config.seeds_together])
            if not group:
                continue
            began, cpu = time.perf_counter(), time.process_time()
            dirs = [sweep.start_cell(workdir, run_name(kind), seed, settings) for seed in group]
            initial = [initial_params(info["policy"], seed) for seed in group]
            means = info["trainer"].train_together(dirs, initial, group)
            agreement = jax.vmap(info["agreement"])(
                means, jnp.stack([jax.random.key(seed) for seed in group])
            )
            keys = jnp.stack([inference_key(kinds, seed, kind) for seed in group])
            played = {
                other: jnp.mean(jax.vmap(other_info["inference"])(means, keys), axis=1)
                for other, other_info in kinds.items()
            }
            agreement, played = jax.device_get((agreement, played))
            seconds = (time.perf_counter() - began) / len(group)
            cpu_seconds = (time.process_time() - cpu) / len(group)
            for i, (seed, run_dir) in enumerate(zip(group, dirs, strict=True)):
                sweep.write(
                    run_dir,
                    settings,
                    {
                        **run_record(config, info, kind, seed, run_dir),
                        "seconds": seconds,
                        "cpu_seconds": cpu_seconds,
                        "mask_agreement": float(agreement[i]),
                        "inference_return": {k: float(v[i]) for k, v in played.items()},
                        "arm": run_name(kind),
                    },
                    arm=run_name(kind),
                    seed=seed,
                )
            print(f"{info['label']:>24} seeds {group[0]}-{group[-1]}: trained together")


def run_record(
    config: ml_collections.ConfigDict, info: dict, kind: str, seed: int, run_dir: str
) -> dict:
    """A trained run's curve (from its ``metrics.jsonl``) and final return."""
    curve = _curve(run_dir, info["importance_flops"])
    return {
        "kind": kind,
        "seed": seed,
        "final_return": float(np.mean(curve["return"][-config.final_evals :])),
        **curve,
    }


def inference_key(kinds: dict, seed: int, trained: str) -> jax.Array:
    """The episodes (environment and projection keys) on which a trained policy plays with
    every kind's attention: the run's own, independent of other runs' (the key folds in the
    seed and the training kind)."""
    return jax.random.fold_in(
        jax.random.fold_in(jax.random.key(seed), _INFERENCE_STREAM), list(kinds).index(trained)
    )


# --------------------------------------------------------------------------- statistics


def _per_seed(runs: list[dict], kind: str, seeds, name: str = "final_return") -> np.ndarray:
    """``kind``'s ``name`` at ``seeds``, in that order (every seed must have a run)."""
    values = tabulate.by_seed(runs, name, kind=kind)
    return np.array([values[seed] for seed in seeds])


def _pm(values: np.ndarray) -> str:
    return tabulate.summarise(values, ".3f")


def _difference(estimate: stats.Estimate) -> str:
    return tabulate.plus_minus(estimate.mean, estimate.se, "+.3f")


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """Equal quality of the claim kind and the reference, in training (final returns, paired by
    seed) and at inference (the same trained policies played with either attention, paired by
    run), each as equivalence within the declared fraction of the reference's return."""
    judge, values = verdicts.Verdicts(config), claim_differences(results, config)
    labels = {kind: info["label"] for kind, info in results["kinds"].items()}
    judge.check_training(checked_runs(results), "kind", label=labels.__getitem__)
    effect = f"{labels[config.claim_kind]} - {labels[config.reference]}"
    for name, difference, reference, text, units in (
        ("equal_quality", "claim", "reference_final", "final return, paired by seed", "seeds"),
        (
            "equal_at_inference",
            "inference_claim",
            "reference_played",
            "return played by the same trained policies, paired by run",
            "runs",
        ),
    ):
        judge.effect(
            name,
            values[difference],
            effect=f"{effect} {text}",
            units=units,
            reference=values[reference],
            arms=[labels[config.claim_kind], labels[config.reference]],
        )
    return judge


def checked_runs(results: dict) -> list[dict]:
    """The runs with the training check's trivial model beside each: the return of the same
    policy before ES (its evaluation at generation 0: its random initialisation)."""
    return [
        {**run, "initial_return": run["return"][0] if run["generation"][0] == 0 else None}
        for run in results["runs"]
    ]


# --------------------------------------------------------------------------- report


def inference_rows(runs: list[dict], kinds: dict) -> list[dict]:
    """The inference-swap table: trained kind x played kind, mean ± SE over seeds."""
    rows = []
    for trained, info in kinds.items():
        played_by = [r["inference_return"] for r in runs if r["kind"] == trained]
        row = {"trained with": info["label"]}
        for played, other in kinds.items():
            row[f"plays with {other['label']}"] = _pm(np.array([p[played] for p in played_by]))
        rows.append(row)
    return rows


def _band(axis, x, runs, color, label, keep):
    values = np.array([r["return"] for r in runs])[:, keep]
    plots.mean_se_band(axis, x[keep], values, color=color, label=label)


def _plot(results: dict, config, path_generations: str, path_flops: str) -> None:
    figures = {name: plt.subplots(figsize=(6.5, 4)) for name in ("generation", "attention_flops")}
    for i, (kind, info) in enumerate(results["kinds"].items()):
        runs = [r for r in results["runs"] if r["kind"] == kind]
        for name, (_, axis) in figures.items():
            x = np.mean([r[name] for r in runs], axis=0)
            keep = x >= 0 if name == "generation" else x > 0  # log axis: from the first update
            _band(axis, x, runs, f"C{i}", info["label"], keep)
    seeds = len(config.seeds)
    title = f"IAP + ES on {config.env} (mean over {seeds} seeds, band +-1 SE)"
    figures["generation"][1].set(xlabel="generation", ylabel="evaluation return", title=title)
    figures["attention_flops"][1].set(
        xlabel="cumulative attention FLOPs in training (mean over seeds)",
        ylabel="evaluation return",
        xscale="log",
        title=title,
    )
    for name, path in (("generation", path_generations), ("attention_flops", path_flops)):
        figure, axis = figures[name]
        axis.legend(fontsize=8)
        outputs.save_figure(figure, path)


def kind_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per attention kind: FLOPs, top-k agreement, final return, paired difference with
    the reference and the difference detectable with 80% power."""
    seeds, runs = list(config.seeds), results["runs"]
    reference = _per_seed(runs, config.reference, seeds)
    rows = []
    for kind, info in results["kinds"].items():
        finals = _per_seed(runs, kind, seeds)
        paired = stats.paired_difference(finals, reference)
        is_reference = kind == config.reference
        rows.append(
            {
                "kind": info["label"],
                "attention FLOPs / forward": info["importance_flops"],
                "XLA FLOPs / forward": int(info["xla_importance_flops"]),
                "top-k agreement with exact": _pm(_per_seed(runs, kind, seeds, "mask_agreement")),
                "final return (mean ± SE)": _pm(finals),
                "minus reference (paired ± SE)": "reference"
                if is_reference
                else _difference(paired),
                "detectable (80%)": ""
                if is_reference
                else f"{stats.detectable_difference(paired):.3f}",
            }
        )
    return rows


def claim_differences(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The claim kind minus the reference, paired: final returns by seed (``claim``) and the
    returns played by the same trained policies by run (``inference_claim``), with the
    reference's means."""
    seeds, runs = list(config.seeds), results["runs"]
    pair = (config.claim_kind, config.reference)
    finals = [_per_seed(runs, kind, seeds) for kind in pair]
    inference = [np.array([r["inference_return"][k] for r in runs]) for k in pair]
    return {
        "claim": stats.paired_difference(*finals),
        "inference_claim": stats.paired_difference(*inference),
        "reference_final": float(finals[1].mean()),
        "reference_played": float(inference[1].mean()),
    }


def claim_values(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """``claim_differences``, the FLOPs ratio of the reference to the claim kind, the margin and
    the top-k agreement of the two kinds by seed."""
    kinds, values = results["kinds"], claim_differences(results, config)
    pair = (config.claim_kind, config.reference)
    return {
        **values,
        "flops_ratio": kinds[config.reference]["importance_flops"]
        / kinds[config.claim_kind]["importance_flops"],
        "margin": config.equivalence_margin * abs(values["reference_final"]),
        "agreement": [
            _per_seed(results["runs"], kind, list(config.seeds), "mask_agreement") for kind in pair
        ],
    }


def endpoint_noise(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """How much of the paired training difference's variance a lower-variance endpoint (more
    evaluation episodes per policy, common random numbers across the arms) could remove.

    Per run, the final return and the same policy's return with its own attention over
    ``inference_episodes`` other episodes measure one policy with independent episode noise:
    the variance of their difference bounds the noise variance of either, so the paired
    difference of two runs carries at most twice it. What remains lies between trained
    policies, which no number of episodes removes. Returns that bound's share of the variance,
    the paired sd without it (a lower bound on any endpoint of these policies), the seeds that
    sd would need to resolve the margin at the observed mean (90% interval) and to show
    equivalence with 80% power if the true difference were 0, and the two arms' correlation
    across seeds (what common random numbers could exploit)."""
    seeds, runs = list(config.seeds), results["runs"]
    pair = (config.claim_kind, config.reference)
    values = claim_differences(results, config)
    claim, margin = values["claim"], config.equivalence_margin * abs(values["reference_final"])
    table = {(r["kind"], r["seed"]): r for r in runs}
    finals = [_per_seed(runs, kind, seeds) for kind in pair]
    played = [np.array([table[kind, s]["inference_return"][kind] for s in seeds]) for kind in pair]
    gaps = np.concatenate([f - p for f, p in zip(finals, played, strict=True)])
    noise = float(np.var(gaps, ddof=1))
    variance = claim.sd**2
    free_sd = math.sqrt(max(variance - 2 * noise, 0.0))
    free = stats.Estimate(claim.mean, free_sd / math.sqrt(claim.n), claim.n, claim.df)
    return {
        "sd": claim.sd,
        "noise_share": min(2 * noise / variance, 1.0) if variance > 0 else math.nan,
        "run_noise": noise,
        "free_sd": free_sd,
        "seeds_to_resolve": stats.units_to_resolve(free, math.copysign(margin, claim.mean), 0.90),
        "seeds_for_equivalence": stats.units_for_equivalence(free_sd, margin),
        "correlation": float(np.corrcoef(finals[0], finals[1])[0, 1]),
    }


def flops_text(results: dict, config: ml_collections.ConfigDict) -> str:
    """The FLOP argument in numbers: the reference's cost over the claim kind's (analytic and
    XLA's count), exact attention's cost beside both, and where the random features would
    start to save FLOPs against exact attention."""
    counts = results["flops"]
    exact = counts["exact"]
    claim_kind, reference = counts[config.claim_kind], counts[config.reference]

    def ratio(a: dict, b: dict) -> str:
        return (
            f"{a['importance_flops'] / b['importance_flops']:.2f}x (analytic) and "
            f"{a['xla_importance_flops'] / b['xla_importance_flops']:.2f}x (XLA)"
        )

    return (
        f"Per patch-importance computation (T = {exact['num_patches']} patches), "
        f"{reference['label']} costs {ratio(reference, claim_kind)} the FLOPs of "
        f"{claim_kind['label']} ({reference['importance_flops']:,} / "
        f"{int(reference['xla_importance_flops']):,} against {claim_kind['importance_flops']:,} / "
        f"{int(claim_kind['xla_importance_flops']):,}, analytic / XLA). Exact softmax attention "
        f"costs {exact['importance_flops']:,} / {int(exact['xla_importance_flops']):,}: "
        f"{reference['label']} costs {ratio(reference, exact)} as much, {claim_kind['label']} "
        f"{ratio(claim_kind, exact)}. By the analytic count the random features cost fewer "
        f"FLOPs than exact attention only from T = {reference['crossover_patches']} patches "
        f"({reference['label']}) and T = {claim_kind['crossover_patches']} "
        f"({claim_kind['label']}): at this T the FLOP saving holds against FAVOR+, not "
        "against exact attention"
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, ``summary.md`` and ``verdicts.json`` from ``measure``'s records."""
    kinds, runs = results["kinds"], results["runs"]
    rows, values = kind_rows(results, config), claim_values(results, config)
    claim, agreement = values["claim"], values["agreement"]
    _plot(
        results,
        config,
        os.path.join(workdir, "return_vs_generation.png"),
        os.path.join(workdir, "return_vs_flops.png"),
    )
    summary = verdicts.write_summary(
        workdir,
        "iap_es",
        judge(results, config),
        config,
        kinds=", ".join(info["label"] for info in kinds.values()),
        seeds=len(config.seeds),
        patches=_patch_text(config),
        table=outputs.markdown_table(rows),
        reference=kinds[config.reference]["label"],
        claim_kind=kinds[config.claim_kind]["label"],
        flops=flops_text(results, config),
        **_endpoint_values(endpoint_noise(results, config)),
        margin_fraction=f"{config.equivalence_margin:.0%}",
        detectable=f"{stats.detectable_difference(claim):.3f}",
        seeds_for_equivalence=stats.units_for_equivalence(claim.sd, values["margin"]),
        runs=len(runs),
        inference_table=outputs.markdown_table(inference_rows(runs, kinds)),
        agreement_claim=_pm(agreement[0]),
        agreement_reference=_pm(agreement[1]),
        agreement_difference=_difference(stats.paired_difference(*agreement)),
        minutes=f"{results['seconds'] / 60:.1f}",
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), _run_rows(runs))
    print(summary)
    return {"rows": rows, **values}


def _endpoint_values(noise: dict[str, Any]) -> dict[str, object]:
    return {
        "noise_share": f"{noise['noise_share']:.1%}",
        "endpoint_sd": f"{noise['sd']:.3f}",
        "run_noise": f"{noise['run_noise']:.4f}",
        "correlation": f"{noise['correlation']:+.2f}",
        "free_sd": f"{noise['free_sd']:.3f}",
        "seeds_to_resolve": noise["seeds_to_resolve"],
        "free_seeds_for_equivalence": noise["seeds_for_equivalence"],
    }


def _run_rows(runs: list[dict]) -> list[dict]:
    return [
        {
            "kind": r["kind"],
            "seed": r["seed"],
            "final_return": r["final_return"],
            "initial_return": r["return"][0],
            "mask_agreement": r["mask_agreement"],
            **{
                f"inference_return_{run_name(kind)}": value
                for kind, value in r["inference_return"].items()
            },
            "forward_passes": r["forward_passes"][-1],
            "attention_flops": r["attention_flops"][-1],
            "seconds_this_invocation": r["seconds"],
            "cpu_seconds_this_invocation": r["cpu_seconds"],
        }
        for r in runs
    ]


def _patch_text(config: ml_collections.ConfigDict) -> str:
    policy = config.policy
    return (
        f"{policy.patch_size}x{policy.patch_size} patches, top {policy.num_kept} kept, "
        f"query/key width {policy.embed_dim}, temperature {policy.temperature}, controller "
        f"hidden {tuple(policy.hidden_sizes)}"
    )
