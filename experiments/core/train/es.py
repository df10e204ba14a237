"""Evolution strategies for policies on Pgx environments: jitted rollouts, checkpointed training.

The strategy is evosax's OpenAI-ES (``evosax.algorithms.Open_ES``, Salimans et al.,
arXiv:1703.03864): antithetic Gaussian perturbations theta +- sigma eps of the flat parameter
vector (``jax.flatten_util.ravel_pytree``), centred-rank fitness shaping and Adam on the
estimated gradient. One generation is one jitted function of (ES state, generation): the whole
population is evaluated at once, ``vmap`` over parameters (members) and environments
(episodes), the episodes advancing together in one ``lax.while_loop`` until all have ended or
``max_steps``. Common random numbers: in a generation every member plays the same episodes
(environment keys) with the same random projections, so fitness differences come from the
parameters.

Determinism and resume follow the trainer (``trainer``): everything random is a function of the
run's seed and the generation (``fold_in``); the trainer's ``Checkpoints`` (Orbax) in
``workdir/checkpoints`` keep the ES state (mean, Adam state, generation counter) every
``checkpoint_every`` generations and at the end, with the settings the run is made under
(``ESTrainer.run_settings``: the ES options, the seed and a sweep cell's identity); a run
started again in the same workdir under the same settings restores the latest one and continues
bit-identically (under others it refuses, naming the fields that differ);
``train.MetricsWriter`` writes ``workdir/metrics.jsonl`` (cut back to the restored generation),
with a progress bar.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from evosax.algorithms import Open_ES
from evosax.core.fitness_shaping import (
    centered_rank_fitness_shaping_fn,
    identity_fitness_shaping_fn,
)
from tqdm.auto import tqdm

from experiments.core import sweep
from experiments.core.train import trainer as train
from experiments.core.train.checkpoints import Checkpoints, TrainingProgress
from experiments.core.validate import require, require_int, require_positive

Params = Any
FitnessShaping = Literal["centered_rank", "identity"]
# ES options that change neither the run nor its metrics: a run resumed with other values of
# them continues the same run.
_OPERATIONAL_FIELDS = ("checkpoint_every", "keep_checkpoints")
_SHAPING = {
    "centered_rank": centered_rank_fitness_shaping_fn,
    "identity": identity_fitness_shaping_fn,
}


def make_strategy(
    template: Params,
    *,
    population_size: int,
    sigma: float,
    optimizer: optax.GradientTransformation,
    fitness_shaping: FitnessShaping = "centered_rank",
) -> Open_ES:
    """OpenAI-ES with antithetic sampling over the flat vector of ``template``'s pytree.

    evosax minimises: it is given -return. With ``fitness_shaping="identity"`` and
    ``optax.sgd(1.0)`` one step moves the mean by -g, where

      g = (1 / (P sigma)) sum_i f(theta + sigma eps_i) eps_i

    is the antithetic estimate of the gradient of the Gaussian smoothing of f (unbiased for
    it; for a quadratic f, unbiased for grad f itself). ``"centered_rank"`` replaces f by
    ranks scaled to [-0.5, 0.5] (the fitness shaping of Salimans et al.).

    Args:
      template: a parameter pytree (its structure and sizes).
      population_size: P, even (antithetic pairs).
      sigma: the perturbation scale, > 0.
      optimizer: applied to g (e.g. ``optax.adam``).
      fitness_shaping: ``"centered_rank"`` or ``"identity"``.

    Returns:
      The evosax strategy.
    """
    if not isinstance(population_size, int) or population_size < 2 or population_size % 2:
        raise ValueError(
            f"population_size must be an even int >= 2 (antithetic pairs), got {population_size!r}"
        )
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    if fitness_shaping not in _SHAPING:
        raise ValueError(
            f"fitness_shaping must be one of {tuple(_SHAPING)}, got {fitness_shaping!r}"
        )
    return Open_ES(
        population_size,
        template,
        use_antithetic_sampling=True,
        optimizer=optimizer,
        std_schedule=optax.constant_schedule(sigma),
        fitness_shaping_fn=_SHAPING[fitness_shaping],
    )


# --------------------------------------------------------------------------- rollouts


@dataclasses.dataclass(frozen=True)
class Rollout:
    """Plays episodes of a Pgx single-agent environment with a deterministic policy.

    Attributes:
      env: a Pgx environment (``pgx.make(...)``): ``init(key)``, ``step(state, action, key)``.
      act: ``(params, observation, projection) -> action`` for one observation.
      draw_projection: ``key -> projection`` (a pytree, or ``None``).
      max_steps: episodes are cut after this many steps.
    """

    env: Any
    act: Callable[[Params, jax.Array, Any], jax.Array]
    draw_projection: Callable[[jax.Array], Any]
    max_steps: int

    def returns(
        self, population: Params, key: jax.Array, num_episodes: int
    ) -> tuple[jax.Array, jax.Array]:
        """Returns and lengths of ``num_episodes`` episodes for every member, ``(P, E)`` each.

        Episode e (the same for every member) starts from ``fold_in(key, e)``: its environment
        key and projection key are split from it, and step t's environment key is
        ``fold_in(step_key, t)``. ``population`` is a parameter pytree with a leading P axis.
        """
        keys = jax.vmap(lambda e: jax.random.fold_in(key, e))(jnp.arange(num_episodes))
        init_keys, step_keys, projection_keys = jnp.moveaxis(
            jax.vmap(lambda k: jax.random.split(k, 3))(keys), 1, 0
        )
        projections = jax.vmap(self.draw_projection)(projection_keys)
        members = jax.tree.leaves(population)[0].shape[0]
        states = jax.tree.map(
            lambda x: jnp.broadcast_to(x, (members, *x.shape)), jax.vmap(self.env.init)(init_keys)
        )
        act = jax.vmap(jax.vmap(self.act, in_axes=(None, 0, 0)), in_axes=(0, 0, None))
        step = jax.vmap(jax.vmap(self.env.step))
        shape = (members, num_episodes)

        def running(carry):
            t, states, _, _ = carry
            return (t < self.max_steps) & ~jnp.all(states.terminated | states.truncated)

        def advance(carry):
            t, states, total, length = carry
            alive = ~(states.terminated | states.truncated)
            actions = act(population, states.observation, projections)
            keys_t = jax.vmap(lambda k: jax.random.fold_in(k, t))(step_keys)
            states = step(states, actions, jnp.broadcast_to(keys_t, shape))
            total = total + jnp.where(alive, states.rewards[..., 0], 0.0)
            return t + 1, states, total, length + alive

        init = (jnp.int32(0), states, jnp.zeros(shape), jnp.zeros(shape, jnp.int32))
        _, _, total, length = jax.lax.while_loop(running, advance, init)
        return total, length


# --------------------------------------------------------------------------- training


def _strong_types(state):
    """``state`` without weak types (evosax leaves some scalars weakly typed, e.g. ``std``):
    the initial, updated and restored states then share one signature, so the jitted steps
    compile once rather than again after the first generation and after every restore."""
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), state)


def _interval_metrics(values: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """A log interval's ``"train"`` metrics from its generations' ``mean_return``,
    ``max_return`` and ``forward_passes`` (``{name: [value per generation]}``), in float64:
    the same whether the values came from the device or from a checkpoint's JSON."""
    return {
        "mean_return": float(np.mean(values["mean_return"], dtype=np.float64)),
        "max_return": float(np.max(values["max_return"])),
        "forward_passes": float(np.sum(values["forward_passes"], dtype=np.float64)),
    }


def validate_es_config(config: ml_collections.ConfigDict, prefix: str = "config.es") -> None:
    """Checks the options ``ESTrainer`` reads (``ESTrainer``'s ``config``) before anything
    runs: counts are ints >= 1 (``eval_episodes`` >= 2: its standard error), the population
    an even int >= 2 (antithetic pairs), ``sigma`` and ``learning_rate`` finite and > 0, and
    ``eval_every`` a multiple of ``log_every``.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_int(
        config,
        "episodes_per_member",
        "num_generations",
        "eval_every",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
        minimum=1,
        prefix=prefix,
    )
    require_int(config, "eval_episodes", minimum=2, prefix=prefix)
    require_int(config, "population_size", minimum=2, prefix=prefix)
    require(
        config.population_size % 2 == 0,
        "population_size",
        config.population_size,
        "even (antithetic pairs)",
        prefix,
    )
    require_positive(config, "sigma", "learning_rate", prefix=prefix)
    require(
        config.eval_every % config.log_every == 0,
        "eval_every",
        config.eval_every,
        f"a multiple of {prefix}.log_every = {config.log_every} (the forward passes are "
        "summed at each evaluation)",
        prefix,
    )


class ESTrainer:
    """OpenAI-ES for one policy and environment; ``train`` runs one seed (resumable).

    The jitted generation and evaluation steps are built once and shared by every seed
    (keys are arguments, not closed-over constants), so a sweep compiles once per policy.

    Generation g of a run uses ``fold_in(run_key, g)`` for its perturbations and episodes, with
    ``(init_key, run_key, eval_key) = split(key(seed), 3)``. Metrics: split ``"train"`` every
    ``log_every`` generations and at the end, at step g + 1 (the generations done):
    ``mean_return`` (the population's mean fitness, averaged over the interval), ``max_return``
    (its best) and ``forward_passes`` (the policy evaluations of the interval, i.e. the summed
    episode lengths; ``eval_every`` must be a multiple of ``log_every`` so that their cumulative
    sum is known at each evaluation); split ``"eval"`` at step g (g = 0 before training, every
    ``eval_every`` generations and at the end): ``return`` of the ES mean over
    ``eval_episodes`` fixed episodes (the same at every evaluation and for every run with the
    same seed) and ``return_se``, its standard error.

    Args:
      config: ``population_size``, ``sigma``, ``learning_rate`` (Adam),
        ``episodes_per_member``, ``num_generations``, ``eval_every``, ``eval_episodes``,
        ``checkpoint_every``, ``log_every``, ``keep_checkpoints``.
      rollout: the environment and policy.
      template: a parameter pytree of the policy (its layout).
    """

    def __init__(self, config: ml_collections.ConfigDict, rollout: Rollout, template: Params):
        self.config = config
        self.strategy = make_strategy(
            template,
            population_size=config.population_size,
            sigma=config.sigma,
            optimizer=optax.adam(config.learning_rate),
        )
        strategy, params = self.strategy, self.strategy.default_params

        def generation(state, run_key, g):
            ask_key, episode_key, tell_key = jax.random.split(jax.random.fold_in(run_key, g), 3)
            population, state = strategy.ask(ask_key, state, params)
            totals, lengths = rollout.returns(population, episode_key, config.episodes_per_member)
            fitness = jnp.mean(totals, axis=1)
            state, _ = strategy.tell(tell_key, population, -fitness, state, params)
            state = _strong_types(state)  # the input's types: no retrace at the next call
            metrics = {
                "mean_return": jnp.mean(fitness),
                "max_return": jnp.max(fitness),
                "forward_passes": jnp.sum(lengths),
            }
            return state, metrics

        def evaluate(state, eval_key):
            mean = jax.tree.map(lambda x: x[None], strategy.get_mean(state))
            totals, _ = rollout.returns(mean, eval_key, config.eval_episodes)
            return {
                "return": jnp.mean(totals),
                "return_se": jnp.std(totals, ddof=1) / jnp.sqrt(totals.shape[1]),
            }

        self.generation = jax.jit(generation, donate_argnums=0)
        self.evaluate = jax.jit(evaluate)
        # Several seeds in one program (``train_together``): vmap over the state and run key.
        self.generation_together = jax.jit(
            jax.vmap(generation, in_axes=(0, 0, None)), donate_argnums=0
        )
        self.evaluate_together = jax.jit(jax.vmap(evaluate))

    def initial_state(self, init_params: Params, seed: int):
        init_key = jax.random.split(jax.random.key(seed), 3)[0]
        state = self.strategy.init(init_key, init_params, self.strategy.default_params)
        return _strong_types(state)

    def _checkpoints(self, workdir: str, seed: int) -> Checkpoints:
        """The run's checkpoints, made under (and checked against) ``run_settings``."""
        return Checkpoints(
            os.path.join(workdir, "checkpoints"),
            self.config.keep_checkpoints,
            self.run_settings(workdir, seed),
        )

    def run_settings(self, workdir: str, seed: int) -> dict:
        """What a run's checkpoints are made under: the ES options less the operational ones
        (``es``), the seed and, when ``workdir`` is a sweep cell, its identity (``cell``)."""
        options = {k: v for k, v in self.config.to_dict().items() if k not in _OPERATIONAL_FIELDS}
        return {"es": options, "seed": seed, "cell": sweep.cell(workdir)}

    def _restore(self, checkpoints: Checkpoints, init_params: Params, seed: int):
        """(ES state, generations done, per-generation metrics not yet logged): the latest
        checkpoint, or the initial state, 0 and none.

        Raises:
          SettingsMismatchError: if the checkpoint was made under other settings.
        """
        target = jax.eval_shape(self.initial_state, init_params, seed)
        restored = checkpoints.restore_latest(target)
        if restored is None:
            return self.initial_state(init_params, seed), 0, {}
        for line in restored.skipped:
            print(f"WARNING: {line}; falling back to an older checkpoint", flush=True)
        # Through the host: uncommitted arrays like the initial state's, so no recompilation.
        state = _strong_types(jax.device_get(restored.state))
        return state, restored.step, restored.progress.pending

    def final_mean(self, workdir: str, init_params: Params, *, seed: int) -> Params:
        """The ES mean (policy parameters) of the latest checkpoint in ``workdir``."""
        checkpoints = self._checkpoints(os.path.abspath(workdir), seed)
        try:
            state, _, _ = self._restore(checkpoints, init_params, seed)
        finally:
            checkpoints.close()
        return self.strategy.get_mean(state)

    def train(
        self,
        workdir: str,
        init_params: Params,
        *,
        seed: int,
        stop_at_generation: int | None = None,
    ) -> dict[str, float]:
        """Runs ES from ``init_params`` to ``num_generations``, resuming from ``workdir``.

        Args:
          workdir: checkpoints and ``metrics.jsonl``.
          init_params: the initial mean (the template's layout).
          seed: the run's seed.
          stop_at_generation: stop there (with a checkpoint), as if pre-empted (tests).

        Returns:
          ``generation`` (done), ``final_return`` and ``final_return_se`` (last evaluation).
        """
        config = self.config
        workdir = os.path.abspath(workdir)
        os.makedirs(workdir, exist_ok=True)
        _, run_key, eval_key = jax.random.split(jax.random.key(seed), 3)
        checkpoints = self._checkpoints(workdir, seed)
        state, start, unlogged = self._restore(checkpoints, init_params, seed)
        end = config.num_generations
        if stop_at_generation is not None:
            end = min(end, stop_at_generation)
        writer = train.MetricsWriter(workdir, resume_step=start)
        if start == 0:
            writer.write("eval", 0, jax.device_get(self.evaluate(state, eval_key)))
        bar = tqdm(
            total=config.num_generations, initial=start, desc="es", disable=None, leave=False
        )
        # The generations since the last record travel in the checkpoints, so that a resumed
        # run's records are those of an uninterrupted one.
        pending = train._Pending(unlogged)
        for g in range(start, end):
            state, metrics = self.generation(state, run_key, g)
            pending.append(metrics)
            done = g + 1
            bar.update()
            if done % config.log_every == 0 or done == config.num_generations:
                values = pending.take_values()
                writer.write("train", done, _interval_metrics(values))
                bar.set_postfix(mean_return=f"{values['mean_return'][-1]:.3g}")
            if done % config.eval_every == 0 or done == config.num_generations:
                writer.write("eval", done, jax.device_get(self.evaluate(state, eval_key)))
            if done % config.checkpoint_every == 0 or done == end:
                checkpoints.save(done, state, TrainingProgress(pending.values()))
        bar.close()
        checkpoints.close()
        writer.close()
        evals = [r for r in train.read_metrics(workdir) if r["split"] == "eval"]
        return {
            "generation": max(end, start),
            "final_return": evals[-1]["return"],
            "final_return_se": evals[-1]["return_se"],
        }

    def train_together(
        self, workdirs: Sequence[str], init_params: Sequence[Params], seeds: Sequence[int]
    ) -> Params:
        """Trains several seeds at once, from generation 0 to ``num_generations``.

        One jitted program advances every seed's ES state (``vmap`` over the seeds): on an
        accelerator the seeds' populations fill a device that one seed's leave mostly idle.
        Each seed uses the keys, episodes and metric schedule of ``train``, so its
        ``workdirs`` entry gets the ``metrics.jsonl`` that ``train`` writes (the same numbers up
        to floating-point reassociation in the batched arithmetic). No checkpoints are written:
        an interrupted group is trained again from the start, and a workdir that holds a
        checkpoint is refused (``train`` resumes it).

        Args:
          workdirs: one run folder per seed.
          init_params: the initial mean of each seed (the template's layout).
          seeds: the runs' seeds.

        Returns:
          The final ES means (policy parameters), stacked over the seeds (leading axis).
        """
        config = self.config
        if not len(workdirs) == len(init_params) == len(seeds) >= 1:
            raise ValueError(
                f"workdirs, init_params and seeds must be equally long and non-empty, got "
                f"{len(workdirs)}, {len(init_params)} and {len(seeds)}"
            )
        writers = []
        for workdir in map(os.path.abspath, workdirs):
            if os.path.isdir(os.path.join(workdir, "checkpoints")):
                raise ValueError(
                    f"{workdir} holds a checkpoint: train_together starts runs from generation "
                    f"0; resume that run with train"
                )
            os.makedirs(workdir, exist_ok=True)
            writers.append(train.MetricsWriter(workdir, resume_step=0, echo=lambda line: None))
        run_keys, eval_keys = (
            jnp.stack([jax.random.split(jax.random.key(seed), 3)[i] for seed in seeds])
            for i in (1, 2)
        )
        state = jax.tree.map(
            lambda *leaves: jnp.stack(leaves),
            *(self.initial_state(p, seed) for p, seed in zip(init_params, seeds, strict=True)),
        )

        def write_eval(step):
            values = jax.device_get(self.evaluate_together(state, eval_keys))
            for i, writer in enumerate(writers):
                writer.write("eval", step, {k: v[i] for k, v in values.items()})

        write_eval(0)
        pending = []
        for g in tqdm(range(config.num_generations), desc="es", disable=None, leave=False):
            state, metrics = self.generation_together(state, run_keys, g)
            pending.append(metrics)
            done = g + 1
            if done % config.log_every == 0 or done == config.num_generations:
                values = jax.device_get(pending)
                for i, writer in enumerate(writers):
                    seed_values = {k: [float(value[k][i]) for value in values] for k in values[0]}
                    writer.write("train", done, _interval_metrics(seed_values))
                pending = []
            if done % config.eval_every == 0 or done == config.num_generations:
                write_eval(done)
        for writer in writers:
            writer.close()
        return jax.vmap(self.strategy.get_mean)(state)
