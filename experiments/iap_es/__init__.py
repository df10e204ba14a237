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

Modules: ``kinds`` (attention kinds, environment, policy, rollout), ``flops`` (attention
FLOPs), ``reporting`` (statistics, tables, figures, summary); this module validates the config
and measures.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.core import records, sweep
from experiments.core.study import Study
from experiments.core.train import es
from experiments.core.train import trainer as train
from experiments.core.validate import (
    require_int,
    require_names,
    require_no_repeats,
    require_nonempty,
    require_positive,
)
from experiments.iap_es.flops import (
    exact_crossover_patches,
    policy_feature_shape,
    policy_importance_flops,
)
from experiments.iap_es.kinds import (
    _FLOP_FIELDS,
    _INFERENCE_STREAM,
    inference_evaluator,
    kind_label,
    make_env,
    make_policy,
    make_rollout,
    parse_kind,
    run_name,
    xla_importance_flops,
)
from experiments.iap_es.reporting import (
    checked_runs,
    claim_differences,
    claim_values,
    endpoint_noise,
    flops_text,
    inference_rows,
    judge,
    kind_rows,
    report,
)
from rfjax.nn import ImplicitAttentionPolicy

__all__ = [
    "STUDY",
    "checked_runs",
    "claim_differences",
    "claim_values",
    "endpoint_noise",
    "flop_counts",
    "flops_text",
    "inference_evaluator",
    "inference_key",
    "inference_returns",
    "inference_rows",
    "initial_params",
    "judge",
    "kind_label",
    "kind_rows",
    "make_env",
    "make_policy",
    "make_rollout",
    "mask_agreement",
    "measure",
    "measure_together",
    "parse_kind",
    "probe_observations",
    "report",
    "run_name",
    "run_record",
    "run_settings",
    "train_run",
    "validate_config",
    "xla_importance_flops",
]


STUDY = Study(
    paper="Hybrid Random Features (Choromanski et al., ICLR 2022)",
    order=130,
    reproduces=(
        "HRF Sec. 4.4, App. K.1: implicit-attention policies trained by evolution "
        "strategies, the angular hybrid vs FAVOR+"
    ),
)


# --------------------------------------------------------------------------- measure


def initial_params(policy: ImplicitAttentionPolicy, seed: int):
    """The initial parameters of a seed: the same for every kind (they share the layout)."""
    projection = policy.draw_projection(jax.random.key(0))
    return policy.init(jax.random.key(seed), jnp.zeros(policy.image_shape), projection)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the kinds, the seeds and the sizes before anything runs (by hand only the rules
    that span fields: the final evaluations within ``config.es``'s schedule), after the ES
    options (``experiments.core.train.es.validate_es_config``).

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "kinds")
    es.validate_es_config(config.es)
    require_nonempty(config, "kinds", "seeds")
    for kind in config.kinds:
        parse_kind(kind)
    require_names(config, "reference", tuple(config.kinds))
    require_names(config, "claim_kind", tuple(config.kinds))
    require_int(
        config, "inference_episodes", "seeds_together", "max_steps", "agreement_draws", minimum=1
    )
    require_positive(config, "equivalence_margin")
    policy = config.policy
    require_int(policy, "patch_size", "num_kept", "embed_dim", minimum=1, prefix="config.policy")
    if policy.hidden_sizes:  # () : no hidden layer
        require_int(policy, "hidden_sizes", minimum=1, prefix="config.policy")
    require_positive(policy, "temperature", "eps", prefix="config.policy")
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
    return records.settings(config, exclude=("seeds", "label", "seeds_together"))


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
