"""ES for implicit-attention policies: the gradient estimate, rollouts, training, resume, report."""

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pgx
import pytest
import scipy.stats

from configs import iap_es as iap_es_config
from experiments import iap_es
from experiments.core import stats, sweep, verdicts
from experiments.core.train import checkpoints, es
from experiments.core.train import trainer as train
from experiments.core.verdicts import Outcome
from experiments.iap_es.flops import (
    exact_crossover_patches,
    importance_flops,
    policy_feature_shape,
    policy_importance_flops,
)
from experiments.main import run_experiment
from tests.support.iap_policy import policy_of


@functools.partial(jax.jit, static_argnums=0)
def _quadratic(dim):
    """A, b, the mean and grad f at the mean, as one compiled program."""
    matrix = jax.random.normal(jax.random.key(0), (dim, dim))
    matrix = matrix @ matrix.T / dim + jnp.eye(dim)
    offset = jax.random.normal(jax.random.key(1), (dim,))
    mean = {"x": jax.random.normal(jax.random.key(2), (dim,))}
    truth = matrix @ mean["x"] + offset
    return matrix, offset, mean, truth


def test_es_gradient_estimate_is_unbiased_on_a_quadratic():
    # f(x) = 1/2 x^T A x + b^T x: the antithetic estimate of grad f_sigma = grad f is unbiased.
    dim, draws = 6, 400
    matrix, offset, mean, truth = _quadratic(dim)
    strategy = es.make_strategy(
        mean, population_size=8, sigma=0.3, optimizer=optax.sgd(1.0), fitness_shaping="identity"
    )
    params = strategy.default_params
    state = strategy.init(jax.random.key(3), mean, params)

    def estimate(key):
        population, _ = strategy.ask(key, state, params)
        x = population["x"]
        fitness = 0.5 * jnp.einsum("pi,ij,pj->p", x, matrix, x) + x @ offset
        new, _ = strategy.tell(key, population, fitness, state, params)
        return state.mean - new.mean  # sgd(1.0): the step is the gradient estimate

    grads = np.asarray(jax.jit(jax.vmap(estimate))(jax.random.split(jax.random.key(4), draws)))
    se = grads.std(axis=0, ddof=1) / np.sqrt(draws)
    assert np.all(np.abs(grads.mean(axis=0) - truth) <= 4 * se), (grads.mean(0), truth, se)
    assert np.all(se < 0.2 * np.abs(truth).max())  # informative: the SE is not huge


def test_make_strategy_rejects_bad_settings():
    with pytest.raises(ValueError, match="population_size must be an even int"):
        es.make_strategy({"x": jnp.zeros(2)}, population_size=5, sigma=0.1, optimizer=optax.sgd(1))
    for sigma in (0.0, float("nan")):
        with pytest.raises(ValueError, match="sigma must be > 0"):
            es.make_strategy(
                {"x": jnp.zeros(2)}, population_size=4, sigma=sigma, optimizer=optax.sgd(1)
            )
    with pytest.raises(ValueError, match="fitness_shaping must be one of"):
        es.make_strategy(
            {"x": jnp.zeros(2)},
            population_size=4,
            sigma=0.1,
            optimizer=optax.sgd(1),
            fitness_shaping="rank",
        )


def test_rollout_matches_a_step_by_step_episode():
    env = pgx.make("minatar-breakout")

    def act(params, observation, projection):  # moves right iff the parameter is positive
        return jnp.where(params["w"] > 0, 2, 0)

    rollout = es.Rollout(env, act, lambda key: None, max_steps=60)
    population = {"w": jnp.array([-1.0, 1.0])}
    totals, lengths = jax.jit(lambda p, k: rollout.returns(p, k, 2))(population, jax.random.key(7))
    init, step = jax.jit(env.init), jax.jit(env.step)
    for member in range(2):
        for episode in range(2):
            key = jax.random.fold_in(jax.random.key(7), episode)
            init_key, step_key, _ = jax.random.split(key, 3)
            state, total, steps = init(init_key), 0.0, 0
            while not (state.terminated or state.truncated) and steps < 60:
                action = 2 if population["w"][member] > 0 else 0
                state = step(state, jnp.int32(action), jax.random.fold_in(step_key, steps))
                total, steps = total + float(state.rewards[0]), steps + 1
            assert totals[member, episode] == total
            assert lengths[member, episode] == steps


def test_one_es_step_is_the_shaped_antithetic_estimate():
    """One ``sgd(1.0)`` step moves the mean by -(1 / (P sigma)) sum_i s_i eps_i (``make_strategy``'s
    docstring), every eps_i's mirror image -eps_i in the population, with s_i = f_i or the
    centred rank of f_i, rank / (P - 1) - 1/2 (0 for the smallest f)."""
    size, sigma = 6, 0.3
    mean = {"x": jnp.array([0.5, -1.0, 2.0])}
    for shaping in ("identity", "centered_rank"):
        strategy = es.make_strategy(
            mean,
            population_size=size,
            sigma=sigma,
            optimizer=optax.sgd(1.0),
            fitness_shaping=shaping,
        )
        params = strategy.default_params
        state = strategy.init(jax.random.key(0), mean, params)
        population, _ = strategy.ask(jax.random.key(1), state, params)
        eps = (np.asarray(population["x"], np.float64) - np.asarray(mean["x"])) / sigma
        mirrors = np.linalg.norm(eps[:, None, :] + eps[None, :, :], axis=-1).min(axis=1)
        np.testing.assert_allclose(mirrors, 0.0, atol=1e-5)
        fitness = np.sin(3.0 * eps).sum(axis=1)  # distinct values
        new, _ = strategy.tell(jax.random.key(2), population, jnp.asarray(fitness), state, params)
        ranks = np.argsort(np.argsort(fitness))
        shaped = fitness if shaping == "identity" else ranks / (size - 1) - 0.5
        np.testing.assert_allclose(
            np.asarray(mean["x"]) - new.mean, shaped @ eps / (size * sigma), rtol=1e-5, atol=1e-6
        )


class _Countdown(NamedTuple):
    observation: jax.Array
    t: jax.Array
    rewards: jax.Array
    terminated: jax.Array
    truncated: jax.Array


class _CountdownEnv:
    """A toy environment with Pgx's interface: a float action a ends the episode after floor(a)
    steps; a step pays a plus a uniform draw of its key, and goes on paying after the end (the
    rollout must not count it); the observation is a uniform draw of the initial key."""

    def init(self, key):
        false = jnp.bool_(False)
        return _Countdown(jax.random.uniform(key), jnp.int32(0), jnp.zeros(1), false, false)

    def step(self, state, action, key):
        t = state.t + 1
        reward = (action + jax.random.uniform(key))[None]
        done = t >= jnp.floor(action)
        return _Countdown(state.observation, t, reward, done, jnp.bool_(False))


def _countdown_rollout(max_steps=5):
    """Member w plays a = w + observation + projection (a uniform draw of the projection key)."""

    def act(params, observation, projection):
        return params["w"][0] + observation + projection

    return es.Rollout(_CountdownEnv(), act, jax.random.uniform, max_steps=max_steps)


def test_rollout_counts_each_episode_until_its_own_end_or_max_steps():
    rollout = _countdown_rollout(max_steps=5)
    population = {"w": jnp.array([[1.0], [2.0], [3.0], [7.0]])}
    totals, lengths = jax.jit(lambda p, k: rollout.returns(p, k, 3))(population, jax.random.key(7))
    env = _CountdownEnv()
    for member in range(4):
        for episode in range(3):
            key = jax.random.fold_in(jax.random.key(7), episode)
            init_key, step_key, projection_key = jax.random.split(key, 3)
            projection = jax.random.uniform(projection_key)
            state, total, steps = env.init(init_key), 0.0, 0
            member_params = {"w": population["w"][member]}
            while not (state.terminated or state.truncated) and steps < 5:
                action = rollout.act(member_params, state.observation, projection)
                state = env.step(state, action, jax.random.fold_in(step_key, steps))
                total, steps = total + float(state.rewards[0]), steps + 1
            assert totals[member, episode] == pytest.approx(total, rel=1e-6)
            assert lengths[member, episode] == steps
    # The episodes end at different steps, some cut at max_steps.
    assert set(np.asarray(lengths).ravel().tolist()) >= {1, 2, 5}


def _countdown_trainer(**overrides):
    config = ml_collections.ConfigDict(
        dict(
            population_size=4,
            sigma=0.5,
            learning_rate=0.1,
            episodes_per_member=2,
            num_generations=4,
            eval_every=2,
            eval_episodes=3,
            checkpoint_every=2,
            log_every=1,
            keep_checkpoints=1,
        )
    )
    config.update(overrides)
    es.validate_es_config(config)
    template = {"w": jnp.array([2.0])}
    return es.ESTrainer(config, _countdown_rollout(), template), template


def test_a_generation_and_an_evaluation_from_their_definitions():
    """Generation g: ask with, play the episodes of and tell with the three keys split from
    fold_in(run_key, g), fitness the member's mean return (minimised as its negative) with
    OpenAI-ES (centred ranks, Adam at ``learning_rate``: its first step is +-lr whatever the
    shaping, so two generations are checked); metrics the population's mean and best
    fitness and the summed episode lengths. Evaluation: the mean's mean return over
    ``eval_episodes`` and its standard error (ddof 1)."""
    trainer, template = _countdown_trainer()
    strategy = es.make_strategy(template, population_size=4, sigma=0.5, optimizer=optax.adam(0.1))
    params, rollout = strategy.default_params, _countdown_rollout()

    @jax.jit
    def reference(state, run_key, eval_key):  # generations 3 and 4 (Adam's second step)
        for g in (3, 4):
            ask_key, episode_key, tell_key = jax.random.split(jax.random.fold_in(run_key, g), 3)
            population, _ = strategy.ask(ask_key, state, params)
            totals, lengths = rollout.returns(population, episode_key, 2)
            fitness = jnp.mean(totals, axis=1)
            state, _ = strategy.tell(tell_key, population, -fitness, state, params)
        mean = jax.tree.map(lambda x: x[None], strategy.get_mean(state))
        return fitness, lengths, state.mean, rollout.returns(mean, eval_key, 3)[0][0]

    state = trainer.initial_state(template, seed=0)
    run_key, eval_key = jax.random.key(5), jax.random.key(9)
    fitness, lengths, mean, returns = (
        np.asarray(x, np.float64) for x in reference(state, run_key, eval_key)
    )
    assert len(set(fitness.tolist())) == 4 and np.std(returns) > 0
    for g in (3, 4):
        state, metrics = trainer.generation(state, run_key, g)
    np.testing.assert_allclose(state.mean, mean, rtol=1e-6)
    assert float(metrics["mean_return"]) == pytest.approx(fitness.mean(), rel=1e-6)
    assert float(metrics["max_return"]) == pytest.approx(fitness.max(), rel=1e-6)
    assert int(metrics["forward_passes"]) == int(np.sum(lengths))
    evaluation = trainer.evaluate(state, eval_key)
    assert float(evaluation["return"]) == pytest.approx(returns.mean(), rel=1e-5)
    se = returns.std(ddof=1) / np.sqrt(3)
    assert float(evaluation["return_se"]) == pytest.approx(se, rel=1e-4)


def test_interval_metrics_average_the_mean_take_the_best_and_sum_the_forward_passes():
    values = {
        "mean_return": [1.0, 2.0, 4.5],
        "max_return": [3.0, 9.0, 5.0],
        "forward_passes": [10, 20, 31],
    }
    assert es._interval_metrics(values) == {
        "mean_return": 2.5,
        "max_return": 9.0,
        "forward_passes": 61.0,
    }


@pytest.mark.integration
def test_a_resumed_run_and_seeds_trained_together_record_and_end_as_an_uninterrupted_run(
    tmp_path,
):
    """Stopped after generation 1 (no record or checkpoint due before 3) and started again:
    the records, result and final mean (the end's checkpoint) of the run trained in one go;
    trained together with another seed: its records and final mean up to reassociation."""
    trainer, template = _countdown_trainer(checkpoint_every=3, log_every=3, eval_every=3)
    runs = {name: str(tmp_path / name) for name in ("whole", "split", "together", "other")}
    whole = trainer.train(runs["whole"], template, seed=1)
    stopped = trainer.train(runs["split"], template, seed=1, stop_at_generation=1)
    assert stopped["generation"] == 1
    assert trainer.train(runs["split"], template, seed=1) == whole
    records = train.read_metrics(runs["whole"])
    assert [(r["split"], r["step"]) for r in records] == [
        ("eval", 0),
        ("train", 3),
        ("eval", 3),
        ("train", 4),
        ("eval", 4),
    ]
    assert train.read_metrics(runs["split"]) == records
    final = trainer.final_mean(runs["whole"], template, seed=1)["w"]
    np.testing.assert_array_equal(trainer.final_mean(runs["split"], template, seed=1)["w"], final)
    together = trainer.train_together(
        [runs["other"], runs["together"]], [template, template], [0, 1]
    )
    np.testing.assert_allclose(together["w"][1], final, rtol=1e-5)
    for mine, theirs in zip(train.read_metrics(runs["together"]), records, strict=True):
        assert mine.pop("split") == theirs.pop("split")
        assert mine == pytest.approx(theirs, rel=1e-5)


# One compiled program per policy (policies are hashable), not the initialisation op by op.
_initial_params = jax.jit(iap_es.initial_params, static_argnums=0, static_argnames="seed")


def _quick(**es_overrides):
    config = iap_es_config.get_config("quick")
    config.kinds = ("exact",)
    config.reference = config.claim_kind = "exact"
    config.es.update(es_overrides)
    return config


def _exact_trainer(config):
    """An ``ESTrainer`` of the exact-attention policy of ``config``, its initial parameters (seed
    0) and its rollout."""
    env = iap_es.make_env(config)
    policy = iap_es.make_policy(config, env, "exact")
    params = iap_es.initial_params(policy, seed=0)
    rollout = iap_es.make_rollout(config, env, policy)
    return es.ESTrainer(config.es, rollout, params), params, rollout


@pytest.mark.integration
def test_quick_run_improves_mean_return_and_resumes_bit_identically(tmp_path):
    config = _quick(
        population_size=16,
        episodes_per_member=2,
        num_generations=10,
        eval_every=10,
        eval_episodes=2,
        log_every=1,
    )
    trainer, params, rollout = _exact_trainer(config)
    trainer.train(str(tmp_path / "whole"), params, seed=0)
    records = train.read_metrics(str(tmp_path / "whole"))
    returns = [r["mean_return"] for r in records if r["split"] == "train"]
    assert len(returns) == 10
    # The population's mean return over the last 3 generations beats the first generation's.
    assert np.mean(returns[-3:]) > returns[0] + 0.2, returns
    # Interrupted after 5 generations and started again: the same metrics, bit for bit.
    trainer.train(str(tmp_path / "split"), params, seed=0, stop_at_generation=5)
    # Another run's checkpoint (other ES settings, another seed) is never continued.
    other = ml_collections.ConfigDict(config.es.to_dict())
    other.sigma *= 2
    with pytest.raises(checkpoints.SettingsMismatchError, match=r"es\.sigma: "):
        es.ESTrainer(other, rollout, params).train(str(tmp_path / "split"), params, seed=0)
    with pytest.raises(checkpoints.SettingsMismatchError, match=r"seed: 0 -> 1"):
        trainer.train(str(tmp_path / "split"), params, seed=1)
    trainer.train(str(tmp_path / "split"), params, seed=0)
    assert train.read_metrics(str(tmp_path / "split")) == records
    # One compilation per step for all of it: the initial, updated and restored states share a
    # signature (weak types and a restored state once retraced both steps).
    assert trainer.generation._cache_size() == 1 and trainer.evaluate._cache_size() == 1


@pytest.mark.integration
def test_a_run_resumed_between_records_logs_the_records_of_an_uninterrupted_run(tmp_path):
    # A record every 5 generations, stopped at 8: the resumed run wrote a record of 6-8 that
    # an uninterrupted run has not, and its record of 10 averaged generations 9 and 10 alone
    # (the unlogged generations were not in the checkpoint).
    config = _quick(
        population_size=4,
        episodes_per_member=1,
        num_generations=10,
        eval_every=10,
        eval_episodes=2,
        log_every=5,
        checkpoint_every=7,
    )
    trainer, params, _ = _exact_trainer(config)
    trainer.train(str(tmp_path / "whole"), params, seed=0)
    trainer.train(str(tmp_path / "split"), params, seed=0, stop_at_generation=8)
    trainer.train(str(tmp_path / "split"), params, seed=0)
    records = train.read_metrics(str(tmp_path / "whole"))
    assert [(r["step"], r["split"]) for r in records] == [
        (0, "eval"),
        (5, "train"),
        (10, "train"),
        (10, "eval"),
    ]
    assert train.read_metrics(str(tmp_path / "split")) == records


@pytest.mark.integration
def test_seeds_trained_together_are_recorded_as_seeds_trained_one_at_a_time(tmp_path):
    # The accelerator's path (one vmapped program per group of seeds) keeps each seed's keys,
    # episodes and metric schedule: the records equal the one-at-a-time sweep's.
    config = iap_es_config.get_config("quick")
    config.kinds, config.claim_kind = ("exact", config.reference), config.reference
    config.seeds = (0, 1)
    measured = {}
    for together in (1, 2):
        config.seeds_together = together
        runs = iap_es.measure(config, str(tmp_path / f"together{together}"))["runs"]
        measured[together] = {(r["kind"], r["seed"]): r for r in runs}
    assert measured[1].keys() == measured[2].keys() and len(measured[1]) == 4
    for cell, one in measured[1].items():
        both = measured[2][cell]
        for name in ("final_return", "return", "return_se", "forward_passes"):
            assert both[name] == one[name], (cell, name)
        assert both["mask_agreement"] == pytest.approx(one["mask_agreement"], abs=1e-6)
        assert both["inference_return"] == pytest.approx(one["inference_return"], abs=1e-6)
    # A cell without its record is measured again, alone: the other kind's cell of that seed,
    # recorded, is not retrained.
    workdir = str(tmp_path / "together2")
    redone = sweep.run_dir(workdir, iap_es.run_name(config.reference), 1)
    kept = os.path.join(sweep.run_dir(workdir, "exact", 1), "result.json")
    os.remove(os.path.join(redone, "result.json"))
    os.remove(os.path.join(redone, "metrics.jsonl"))
    before = os.path.getmtime(kept)
    runs = iap_es.measure(config, workdir)["runs"]
    assert os.path.getmtime(kept) == before
    assert {(r["kind"], r["seed"]): r["final_return"] for r in runs} == {
        cell: r["final_return"] for cell, r in measured[1].items()
    }


def test_train_together_refuses_a_started_run_and_unequal_arguments(tmp_path):
    config = _quick()
    env = iap_es.make_env(config)
    policy = iap_es.make_policy(config, env, "exact")
    params = _initial_params(policy, seed=0)
    trainer = es.ESTrainer(config.es, iap_es.make_rollout(config, env, policy), params)
    with pytest.raises(ValueError, match="equally long and non-empty"):
        trainer.train_together([str(tmp_path / "a")], [params, params], [0, 1])
    os.makedirs(tmp_path / "b" / "checkpoints")
    with pytest.raises(ValueError, match=r"holds a checkpoint.*resume that run with train"):
        trainer.train_together([str(tmp_path / "b")], [params], [0])
    config.seeds_together = 0
    with pytest.raises(ValueError, match="seeds_together must be an int >= 1, got 0"):
        iap_es.validate_config(config)


def test_parse_kind_and_bad_kinds():
    assert iap_es.parse_kind("angular_hybrid:8x8") == {
        "attention": "angular_hybrid",
        "num_features": 8,
        "num_sign_features": 8,
    }
    assert iap_es.kind_label("positive:256") == "FAVOR+ m=256"
    for bad in ("favour:256", "positive", "exact:4", "angular_hybrid:8", "positive:8x8"):
        with pytest.raises(ValueError, match="kind"):
            iap_es.parse_kind(bad)


def _runs(config, claim_returns, reference_returns):
    """Records of the claim kind and the reference on len(returns) seeds (training and
    inference returns alike)."""
    runs = []
    for seed, (claim, reference) in enumerate(zip(claim_returns, reference_returns, strict=True)):
        for kind, value in ((config.reference, reference), (config.claim_kind, claim)):
            played = {config.reference: reference, config.claim_kind: claim}
            runs.append(
                {
                    "kind": kind,
                    "seed": seed,
                    "final_return": value,
                    "inference_return": played,
                    "generation": [0, 10],  # the policy at its random initialisation, then ES
                    "return": [0.2, value],
                }
            )
    return runs


def test_equal_quality_is_equivalence_within_the_declared_fraction_of_the_reference():
    config = iap_es_config.get_config("pair")
    config.seeds = tuple(range(4))
    kinds = {k: {"label": iap_es.kind_label(k)} for k in config.kinds}
    reference = np.array([3.0, 3.2, 2.8, 3.0])  # mean 3: the 20% margin is 0.6

    def outcome(claim):
        runs = _runs(config, claim, reference)
        return iap_es.judge({"kinds": kinds, "runs": runs}, config).given["equal_quality"].outcome

    # Differences 0.1, -0.1, 0.0, 0.0: 90% CI about [-0.11, 0.11], inside +-0.6.
    assert outcome(reference + np.array([0.1, -0.1, 0.0, 0.0])) == Outcome.HOLDS
    # Worse by 1.0 +- 0.05: beyond the margin.
    assert outcome(reference - 1.0 + np.array([0.05, -0.05, 0.0, 0.0])) == Outcome.DOES_NOT_HOLD
    # Worse by 0.6 +- 0.2: the interval straddles the margin.
    assert outcome(reference - 0.6 + np.array([0.3, -0.3, 0.0, 0.0])) == Outcome.NOT_RESOLVED


def test_a_kind_that_es_did_not_move_from_its_random_initialisation_is_not_tested():
    """The declared check: a kind's final return must beat its policy at generation 0 (a random
    policy) by 0.5; a kind at 0.3 against 0.2 has not learned to play."""
    config = iap_es_config.get_config("pair")
    config.seeds = tuple(range(4))
    kinds = {k: {"label": iap_es.kind_label(k)} for k in config.kinds}
    reference = np.array([3.0, 3.2, 2.8, 3.0])
    runs = _runs(config, np.array([0.3, 0.25, 0.3, 0.35]), reference)
    judged = iap_es.judge({"kinds": kinds, "runs": runs}, config)
    label = iap_es.kind_label(config.claim_kind)
    assert judged.failed_arms() == [label]
    for verdict in judged.given.values():
        assert verdict.outcome == Outcome.NOT_TESTED
        assert verdict.evidence.startswith(f"{label} failed the declared training check")
        assert "the same policy at its random initialisation 0.2: the arm minus it +0.1" in (
            verdict.evidence
        )


def test_inference_swap_plays_the_same_episodes_with_every_kind():
    # A policy whose controller ignores its input acts alike under every attention: on the
    # same episodes (the swap's pairing) its returns are then equal, on other episodes not.
    config = iap_es_config.get_config("quick")
    env = iap_es.make_env(config)
    kinds = {}
    for kind in ("exact", "positive:16"):
        rollout = iap_es.make_rollout(config, env, iap_es.make_policy(config, env, kind))
        kinds[kind] = {"inference": iap_es.inference_evaluator(rollout, 16)}
    params = _initial_params(iap_es.make_policy(config, env, "exact"), seed=0)
    blind = jax.tree_util.tree_map_with_path(
        lambda path, x: x if "bias" in jax.tree_util.keystr(path) else jnp.zeros_like(x), params
    )
    swap = iap_es.inference_returns(kinds, blind, run_key=(0, "exact"))
    assert set(swap) == set(kinds) and swap["exact"] == swap["positive:16"]
    other = iap_es.inference_returns(kinds, blind, run_key=(1, "exact"))
    assert other["exact"] != swap["exact"]  # another run: other episodes


def test_report_writes_the_summary_figures_and_tables(tmp_path):
    config = iap_es_config.get_config("quick")
    generations = [0, 2, 4]
    runs = [
        {
            "kind": kind,
            "seed": seed,
            "seconds": 1.0,
            "cpu_seconds": 1.0,
            "final_return": 1.0 + 0.1 * seed + 0.01 * i,
            "mask_agreement": 0.8 + 0.01 * seed + 0.02 * i,
            "inference_return": {
                played: 1.0 + 0.1 * seed + 0.01 * i - 0.02 * j
                for j, played in enumerate(config.kinds)
            },
            "generation": generations,
            "return": [0.2, 0.6, 1.0 + 0.1 * seed + 0.01 * i],
            "return_se": [0.1] * 3,
            "forward_passes": [0, 100, 200],
            "attention_flops": [0.0, 100.0 * (i + 1), 200.0 * (i + 1)],
        }
        for i, kind in enumerate(config.kinds)
        for seed in config.seeds
    ]
    kinds = {
        kind: {
            "label": iap_es.kind_label(kind),
            "importance_flops": 1000 * (i + 1),
            "xla_importance_flops": 1100.0 * (i + 1),
        }
        for i, kind in enumerate(config.kinds)
    }
    flops = {
        "exact": {"label": "exact softmax", "num_patches": 25}
        | {"importance_flops": 500, "xla_importance_flops": 600.0},
        **{
            kind: {**kinds[kind], "num_patches": 25, "crossover_patches": 40 + i}
            for i, kind in enumerate(config.kinds)
            if kind != "exact"
        },
    }
    results = {"kinds": kinds, "flops": flops, "runs": runs, "seconds": 60.0}
    written = iap_es.report(results, config, str(tmp_path))
    summary = (tmp_path / "summary.md").read_text()
    assert "HRF angular 4x4" in summary
    # The FLOP ratios with exact attention's cost beside them (reference: 2000 / 600 XLA).
    assert "FAVOR+ m=16 costs 0.67x (analytic) and 0.67x (XLA) the FLOPs of HRF" in summary
    assert "FAVOR+ m=16 costs 4.00x (analytic) and 3.67x (XLA) as much" in summary
    assert "plays with HRF angular 4x4" in summary and "at inference" in summary
    stored = verdicts.read(str(tmp_path))
    assert set(stored) == {"equal_quality", "equal_at_inference"}
    assert all(v.sentence() in summary for v in stored.values())
    # The swap: the claim kind (played third) minus the reference (second), every run: -0.02.
    assert written["inference_claim"].mean == pytest.approx(-0.02)
    assert written["flops_ratio"] == pytest.approx(2000 / 3000)
    for name in ("return_vs_generation.png", "return_vs_flops.png", "results.csv"):
        assert os.path.getsize(tmp_path / name) > 0


def test_endpoint_noise_separates_episode_noise_from_policy_differences():
    config = iap_es_config.get_config("pair")
    config.seeds = tuple(range(6))
    kinds = {k: {"label": iap_es.kind_label(k)} for k in config.kinds}
    reference = np.array([3.0, 1.5, 4.0, 2.0, 3.5, 1.0])  # trained policies differ widely
    claim = reference[::-1].copy()
    runs = _runs(config, claim, reference)  # played return = final return: no episode noise
    results = {"kinds": kinds, "runs": runs}
    exact = iap_es.endpoint_noise(results, config)
    difference = claim - reference
    assert exact["noise_share"] == 0.0 and exact["run_noise"] == 0.0
    assert exact["sd"] == pytest.approx(difference.std(ddof=1))
    assert exact["free_sd"] == pytest.approx(exact["sd"])
    assert exact["correlation"] == pytest.approx(np.corrcoef(claim, reference)[0, 1])
    # Episode noise on the played returns: the gaps final - played bound it; the noise-free
    # sd is what remains of the paired variance after twice that bound.
    wobble = np.array([0.1, -0.1, 0.2, -0.2, 0.1, -0.1])
    for run, step in zip(runs, np.repeat(wobble, 2), strict=True):
        run["inference_return"] = {k: v + step for k, v in run["inference_return"].items()}
    noisy = iap_es.endpoint_noise(results, config)
    gaps = np.concatenate([-wobble, -wobble])
    assert noisy["run_noise"] == pytest.approx(gaps.var(ddof=1))
    assert noisy["noise_share"] == pytest.approx(2 * gaps.var(ddof=1) / difference.var(ddof=1))
    assert noisy["free_sd"] == pytest.approx(np.sqrt(difference.var(ddof=1) - 2 * gaps.var(ddof=1)))
    assert noisy["seeds_to_resolve"] <= exact["seeds_to_resolve"]


def _pair_results(claim: np.ndarray, reference: np.ndarray):
    """The ``pair`` config on ``len(claim)`` seeds and results of its two kinds (``_runs``),
    each run's top-k agreement 0.5 + seed / 10 for the claim kind, 1 for the reference."""
    config = iap_es_config.get_config("pair")
    config.seeds = tuple(range(len(claim)))
    kinds = {
        k: {
            "label": iap_es.kind_label(k),
            "importance_flops": 1000 * (i + 1),
            "xla_importance_flops": 1100.0 * (i + 1),
        }
        for i, k in enumerate(config.kinds)
    }
    runs = _runs(config, claim, reference)
    for run in runs:
        run["mask_agreement"] = 1.0 if run["kind"] == config.reference else 0.5 + run["seed"] / 10
    return config, {"kinds": kinds, "runs": runs}


def test_kind_rows_show_each_kinds_mean_and_se_and_the_paired_difference_with_the_reference():
    claim, reference = np.array([3.0, 2.0, 4.5, 1.0]), np.array([2.0, 2.5, 3.0, 2.2])
    config, results = _pair_results(claim, reference)
    rows = {r["kind"]: r for r in iap_es.kind_rows(results, config)}
    reference_row = rows[iap_es.kind_label(config.reference)]
    assert reference_row["final return (mean ± SE)"] == "2.425 ± 0.217"  # sd 0.435 / sqrt(4)
    assert reference_row["minus reference (paired ± SE)"] == "reference"
    assert reference_row["detectable (80%)"] == ""
    difference = claim - reference  # +1.0, -0.5, +1.5, -1.2: mean 0.2, sd 1.262, SE 0.631
    se = difference.std(ddof=1) / 2
    detectable = (scipy.stats.t(3).ppf(0.975) + scipy.stats.t(3).ppf(0.8)) * se
    assert rows[iap_es.kind_label(config.claim_kind)] == {
        "kind": iap_es.kind_label(config.claim_kind),
        "attention FLOPs / forward": 2000,
        "XLA FLOPs / forward": 2200,
        "top-k agreement with exact": "0.650 ± 0.065",  # 0.5, 0.6, 0.7, 0.8
        "final return (mean ± SE)": "2.625 ± 0.747",  # sd 1.493 / sqrt(4)
        "minus reference (paired ± SE)": f"+0.200 ± {se:.3f}",
        "detectable (80%)": f"{detectable:.3f}",
    }


def test_endpoint_noise_columns_from_the_paired_differences_and_the_episode_noise():
    reference = np.array([3.0, 1.5, 4.0, 2.0, 3.5, 1.0])
    claim = reference[::-1] - 0.3  # differences -2.3, +1.7, -2.3, +1.7, -2.3, +1.7: mean -0.3
    wobble = np.array([0.1, -0.1, 0.2, -0.2, 0.1, -0.1])  # episode noise of the played returns

    def endpoint_noise(scale: float):
        config, results = _pair_results(claim, reference)
        for run in results["runs"]:
            step = scale * wobble[run["seed"]]
            run["inference_return"] = {k: v + step for k, v in run["inference_return"].items()}
        return config, iap_es.endpoint_noise(results, config)

    config, got = endpoint_noise(1.0)
    difference = claim - reference
    free_sd = np.sqrt(difference.var(ddof=1) - 2 * np.concatenate([wobble, wobble]).var(ddof=1))
    margin = config.equivalence_margin * reference.mean()
    free = stats.Estimate(difference.mean(), free_sd / np.sqrt(6), 6, 5)
    assert got["free_sd"] == pytest.approx(free_sd)
    assert got["seeds_to_resolve"] == stats.units_to_resolve(free, -margin, 0.90)
    assert got["seeds_for_equivalence"] == stats.units_for_equivalence(free_sd, margin)
    assert got["correlation"] == pytest.approx(np.corrcoef(claim, reference)[0, 1])
    # Episode noise (variance 0.021 x 400) beyond half the paired variance (4.8): all of that
    # could be noise, none is left.
    _, swamped = endpoint_noise(20.0)
    assert swamped["noise_share"] == 1.0 and swamped["free_sd"] == 0.0


def test_flop_counts_put_exact_attention_beside_every_kind():
    config = iap_es_config.get_config("quick")
    config.kinds = ("positive:16", "angular_hybrid:4x4")  # exact attention not trained
    counts = iap_es.flop_counts(config, iap_es.make_env(config))
    assert list(counts) == ["exact", "positive:16", "angular_hybrid:4x4"]
    assert counts["exact"]["importance_flops"] == importance_flops(25, 8)
    assert "crossover_patches" not in counts["exact"]
    # FAVOR+ m = 16: w = r = 16 features from the d = 8 queries and keys.
    assert counts["positive:16"]["crossover_patches"] == exact_crossover_patches(
        8, feature_width=16, projection_rows=16
    )
    for kind in config.kinds:
        patches = counts[kind]["crossover_patches"]
        policy = iap_es.make_policy(config, iap_es.make_env(config), kind)
        width, rows = policy_feature_shape(policy)

        def cheaper(t, width=width, rows=rows):
            return importance_flops(t, 8, feature_width=width, projection_rows=rows) < (
                importance_flops(t, 8)
            )

        assert cheaper(patches) and not cheaper(patches - 1)


@pytest.mark.integration
def test_recorded_runs_are_reused_under_the_same_settings_only(tmp_path):
    config = iap_es_config.get_config("quick")
    settings = iap_es.run_settings(config)
    recorded = []
    for seed in config.seeds:  # the order measure() visits runs in
        for i, kind in enumerate(config.kinds):
            run = {"kind": kind, "seed": seed, "seconds": 1.0, "final_return": 10.0 * seed + i}
            run_dir = sweep.run_dir(str(tmp_path), iap_es.run_name(kind), seed)
            sweep.write(run_dir, settings, run, arm=iap_es.run_name(kind), seed=seed)
            recorded.append({**run, "arm": iap_es.run_name(kind)})
    measured = iap_es.measure(config, str(tmp_path))
    assert measured["runs"] == recorded
    assert os.listdir(run_dir) == ["result.json"]  # nothing was trained or checkpointed
    # A sweep extended by seeds (another label, seeds trained together) reuses the record;
    # other settings do not.
    extended = ml_collections.ConfigDict(config.to_dict())
    extended.seeds, extended.label, extended.seeds_together = (*config.seeds, 99), "more", 95
    cell = {"arm": iap_es.run_name(config.kinds[-1]), "seed": config.seeds[-1]}
    assert sweep.read(run_dir, iap_es.run_settings(extended), **cell) == run
    other = ml_collections.ConfigDict(config.to_dict())
    other.es.sigma *= 2
    assert sweep.read(run_dir, iap_es.run_settings(other), **cell) is None


@pytest.mark.slow
def test_quick_config_runs_end_to_end(tmp_path):
    config = iap_es_config.get_config("quick")
    run_experiment(config, str(tmp_path))
    assert os.path.exists(tmp_path / "summary.md")
    stored = verdicts.read(str(tmp_path))
    assert set(stored) == set(config.claims)
    assert all(v.outcome != Outcome.DOES_NOT_HOLD for v in stored.values())  # a quick variant


def test_config_variants():
    default, quick, paper = (iap_es_config.get_config(v) for v in (None, "quick", "paper"))
    assert {"exact", "positive:256", "angular_hybrid:8x8"} <= set(default.kinds)
    assert len(default.seeds) == 3 and len(paper.seeds) > len(default.seeds)
    assert quick.es.num_generations < default.es.num_generations < paper.es.num_generations
    pair = iap_es_config.get_config("pair")
    assert pair.kinds == (default.reference, default.claim_kind)
    assert set(default.seeds) < set(pair.seeds)  # the default's runs are the pair's first seeds
    for config in (default, quick, paper, pair):
        iap_es.validate_config(config)
    with pytest.raises(ValueError, match="config variant"):
        iap_es_config.get_config("fast")


def test_bad_config_is_rejected():
    config = iap_es_config.get_config("quick")
    config.es.eval_every = 3
    with pytest.raises(
        ValueError, match=r"config\.es\.eval_every must be a multiple of config\.es\.log_every = "
    ):
        iap_es.validate_config(config)
    # The ES options, each naming its field (eval_every = 0 raised a ZeroDivisionError).
    for field, value, message in [
        ("eval_every", 0, r"eval_every must be an int >= 1, got 0"),
        ("log_every", -1, r"log_every must be an int >= 1, got -1"),
        ("checkpoint_every", 0, r"checkpoint_every must be an int >= 1, got 0"),
        ("population_size", 15, r"population_size must be even \(antithetic pairs\), got 15"),
        ("eval_episodes", 1, r"eval_episodes must be an int >= 2, got 1"),
        ("sigma", float("nan"), r"sigma must be finite and > 0, got nan"),
        ("learning_rate", 0.0, r"learning_rate must be finite and > 0, got 0.0"),
    ]:
        config = iap_es_config.get_config("quick")
        config.es[field] = value
        with pytest.raises(ValueError, match=rf"config\.es\.{message}"):
            iap_es.validate_config(config)
    for section, field, value, message in [
        (None, "max_steps", 0, r"config\.max_steps must be an int >= 1, got 0"),
        (None, "agreement_draws", -1, r"config\.agreement_draws must be an int >= 1, got -1"),
        (None, "equivalence_margin", float("nan"), r"config\.equivalence_margin must be finite"),
        ("policy", "patch_size", 0, r"config\.policy\.patch_size must be an int >= 1, got 0"),
        ("policy", "num_kept", -1, r"config\.policy\.num_kept must be an int >= 1, got -1"),
        ("policy", "embed_dim", 0, r"config\.policy\.embed_dim must be an int >= 1, got 0"),
        ("policy", "hidden_sizes", (16, 0), r"config\.policy\.hidden_sizes must be an int >= 1"),
        ("policy", "temperature", float("nan"), r"config\.policy\.temperature must be finite and"),
        ("policy", "eps", -1.0, r"config\.policy\.eps must be finite and > 0, got -1\.0"),
    ]:
        config = iap_es_config.get_config("quick")
        (config[section] if section else config)[field] = value
        with pytest.raises(ValueError, match=message):
            iap_es.validate_config(config)
    config = iap_es_config.get_config("quick")
    config.policy.hidden_sizes = ()  # a controller without hidden layers
    iap_es.validate_config(config)
    config = ml_collections.ConfigDict(iap_es_config.get_config("quick").to_dict())
    config.reference = "positive:999"
    with pytest.raises(ValueError, match=r"config\.reference: 'positive:999' is not one of \("):
        iap_es.validate_config(config)
    config = iap_es_config.get_config("quick")
    config.final_evals = 10**6
    with pytest.raises(ValueError, match=r"config\.final_evals must be an int in \[1, \d+\]"):
        iap_es.validate_config(config)


def test_importance_flops_from_the_shapes():
    assert importance_flops(25, 8) == 2 * 25**2 * 8 + 4 * 25**2
    assert importance_flops(25, 8, feature_width=256, projection_rows=256) == (
        4 * 25 * 256 * 8 + 9 * 25 * 256 + 25
    )
    # widths: FAVOR+ m, trigonometric 2m, angular hybrid 4m(n + 1), Gaussian hybrid 4m(2n + 1)
    for attention, width, rows in [
        ("positive", 8, 8),
        ("trigonometric", 16, 8),
        ("angular_hybrid", 4 * 8 * 4, 11),
        ("gaussian_hybrid", 4 * 8 * 7, 11),
    ]:
        policy = policy_of(attention)
        assert policy_importance_flops(policy) == importance_flops(
            36, 4, feature_width=width, projection_rows=rows
        )
    # the paper's comparison: angular hybrid 8 x 8 against FAVOR+ m = 256, T = 25, d = 8
    hybrid = policy_of("angular_hybrid", num_features=8, num_sign_features=8, embed_dim=8)
    favor = policy_of("positive", num_features=256, embed_dim=8)
    assert policy_importance_flops(hybrid) < policy_importance_flops(favor) / 3


def test_claim_differences_are_claim_minus_reference_paired_with_the_reference_margin():
    config = iap_es_config.get_config("pair")
    config.seeds = tuple(range(6))
    reference = np.array([3.0, 1.5, 4.0, 2.0, 3.5, 1.0])
    claim = reference + np.array([0.2, 0.1, 0.3, 0.1, 0.2, 0.3])
    runs = _runs(config, claim, reference)
    for run in runs:  # played returns other than the finals: the margin is the final's
        run["inference_return"] = {k: 10 * v for k, v in run["inference_return"].items()}
        run["mask_agreement"] = 1.0
    results = {"kinds": {k: {"label": iap_es.kind_label(k)} for k in config.kinds}, "runs": runs}
    values = iap_es.claim_differences(results, config)
    difference = claim - reference
    assert values["claim"].mean == pytest.approx(difference.mean())
    assert values["claim"].se == pytest.approx(difference.std(ddof=1) / np.sqrt(6))
    assert values["reference_final"] == pytest.approx(reference.mean())
    assert values["reference_played"] == pytest.approx(10 * reference.mean())
    for kind in config.kinds:
        results["kinds"][kind] |= {"importance_flops": 100, "xla_importance_flops": 100.0}
    margin = iap_es.claim_values(results, config)["margin"]
    assert margin == pytest.approx(config.equivalence_margin * reference.mean())
