"""ES for implicit-attention policies: the gradient estimate, rollouts, training, resume, report."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pgx
import pytest

from configs import iap_es as iap_es_config
from experiments import es, iap_es, train
from experiments.main import run_experiment


def test_es_gradient_estimate_is_unbiased_on_a_quadratic():
    # f(x) = 1/2 x^T A x + b^T x: the antithetic estimate of grad f_sigma = grad f is unbiased.
    dim, draws = 6, 400
    matrix = jax.random.normal(jax.random.key(0), (dim, dim))
    matrix = matrix @ matrix.T / dim + jnp.eye(dim)
    offset = jax.random.normal(jax.random.key(1), (dim,))
    mean = {"x": jax.random.normal(jax.random.key(2), (dim,))}
    truth = matrix @ mean["x"] + offset
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


def _quick(**es_overrides):
    config = iap_es_config.get_config("quick")
    config.kinds = ("exact",)
    config.reference = config.claim_kind = "exact"
    config.es.update(es_overrides)
    return config


def test_quick_run_improves_mean_return_and_resumes_bit_identically(tmp_path):
    config = _quick(
        population_size=16,
        episodes_per_member=2,
        num_generations=10,
        eval_every=10,
        eval_episodes=2,
        log_every=1,
    )
    env = iap_es.make_env(config)
    policy = iap_es.make_policy(config, env, "exact")
    params = iap_es.initial_params(policy, seed=0)
    trainer = es.ESTrainer(config.es, iap_es.make_rollout(config, env, policy), params)
    trainer.train(str(tmp_path / "whole"), params, seed=0)
    records = train.read_metrics(str(tmp_path / "whole"))
    returns = [r["mean_return"] for r in records if r["split"] == "train"]
    assert len(returns) == 10
    # The population's mean return over the last 3 generations beats the first generation's.
    assert np.mean(returns[-3:]) > returns[0] + 0.2, returns
    # Interrupted after 5 generations and started again: the same metrics, bit for bit.
    trainer.train(str(tmp_path / "split"), params, seed=0, stop_at_generation=5)
    trainer.train(str(tmp_path / "split"), params, seed=0)
    assert train.read_metrics(str(tmp_path / "split")) == records
    # One compilation per step for all of it: the initial, updated and restored states share a
    # signature (weak types and a restored state once retraced both steps).
    assert trainer.generation._cache_size() == 1 and trainer.evaluate._cache_size() == 1


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


def test_paired_comparison_matches_a_paired_t_test():
    from scipy import stats

    values, reference = np.array([3.0, 2.5, 4.0, 3.2]), np.array([2.0, 2.7, 3.1, 3.0])
    result = iap_es.paired_comparison(values, reference, margin=10.0)
    test = stats.ttest_rel(values, reference)
    half = result["ci95"][1] - result["mean"]
    assert result["mean"] / result["se"] == pytest.approx(test.statistic)
    assert half == pytest.approx(stats.t.ppf(0.975, 3) * result["se"])
    assert result["equivalent"] and not result["different"]
    tight = iap_es.paired_comparison(values, reference, margin=0.1)
    assert not tight["equivalent"]
    assert "does not hold** in this run, because equal quality is not shown" in iap_es.verdict(
        tight, 3.0, 0.1
    )
    slightly_lower = iap_es.paired_comparison(
        reference - 0.05 + 0.001 * np.arange(4), reference, margin=0.5
    )
    assert slightly_lower["equivalent"] and slightly_lower["different"]
    assert "resolved from 0" in iap_es.verdict(slightly_lower, 3.0, 0.5)
    worse = iap_es.paired_comparison(reference - 1.0, reference + 0.01 * np.arange(4), margin=0.1)
    assert "worse by" in iap_es.verdict(worse, 3.0, 0.1)
    assert "by more than the margin" in iap_es.verdict(worse, 3.0, 0.1)
    # Worse (95% interval about [-0.50, -0.30]) but not surely by more than a margin of 0.45.
    deficit = iap_es.paired_comparison(
        reference - 0.4 + 0.05 * np.arange(4) - 0.075, reference, margin=0.45
    )
    assert deficit["different"] and not deficit["equivalent"]
    assert "whether the deficit exceeds the margin" in iap_es.verdict(deficit, 3.0, 0.45)


def test_inference_swap_plays_the_same_episodes_with_every_kind():
    # A policy whose controller ignores its input acts alike under every attention: on the
    # same episodes (the swap's pairing) its returns are then equal, on other episodes not.
    config = iap_es_config.get_config("quick")
    env = iap_es.make_env(config)
    kinds = {}
    for kind in ("exact", "positive:16"):
        rollout = iap_es.make_rollout(config, env, iap_es.make_policy(config, env, kind))
        kinds[kind] = {"inference": iap_es.inference_evaluator(rollout, 16)}
    params = iap_es.initial_params(iap_es.make_policy(config, env, "exact"), seed=0)
    blind = jax.tree_util.tree_map_with_path(
        lambda path, x: x if "bias" in jax.tree_util.keystr(path) else jnp.zeros_like(x), params
    )
    swap = iap_es.inference_returns(kinds, blind, run_key=(0, "exact"))
    assert set(swap) == set(kinds) and swap["exact"] == swap["positive:16"]
    other = iap_es.inference_returns(kinds, blind, run_key=(1, "exact"))
    assert other["exact"] != swap["exact"]  # another run: other episodes


def test_seeds_for_equivalence_give_the_stated_power():
    # TOST at 5% with the returned number of pairs, true difference 0: power about 80%.
    sd, margin = 1.0, 0.3
    values = np.array([sd, -sd, 0.0])  # standard deviation sd
    n = iap_es.paired_comparison(values, np.zeros(3), margin=margin)["units_for_equivalence"]
    assert n == int(np.ceil(((1.6449 + 1.2816) * sd / margin) ** 2))
    draws = 2000
    differences = np.random.default_rng(0).normal(0.0, sd, size=(draws, n))
    shown = [
        iap_es.paired_comparison(d, np.zeros(n), margin=margin)["equivalent"] for d in differences
    ]
    se = np.sqrt(0.8 * 0.2 / draws)
    assert abs(np.mean(shown) - 0.8) <= 4 * se + 0.01, np.mean(shown)  # + t vs z at n ~ 95


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
    written = iap_es.report({"kinds": kinds, "runs": runs, "seconds": 60.0}, config, str(tmp_path))
    with open(written["summary"]) as handle:
        summary = handle.read()
    assert "HRF angular 4x4" in summary and "Verdict" in summary
    assert "plays with HRF angular 4x4" in summary and "at inference" in summary
    # The swap: the claim kind (played third) minus the reference (second), every run: -0.02.
    assert written["inference_claim"]["mean"] == pytest.approx(-0.02)
    assert written["flops_ratio"] == pytest.approx(2000 / 3000)
    for name in ("return_vs_generation.png", "return_vs_flops.png", "results.csv"):
        assert os.path.getsize(tmp_path / name) > 0


def test_recorded_runs_are_reused_under_the_same_settings_only(tmp_path):
    config = iap_es_config.get_config("quick")
    recorded = []
    for seed in config.seeds:  # the order measure() visits runs in
        for i, kind in enumerate(config.kinds):
            run = {"kind": kind, "seed": seed, "seconds": 1.0, "final_return": 10.0 * seed + i}
            run_dir = tmp_path / "runs" / f"{iap_es.run_name(kind)}_seed{seed}"
            iap_es.write_run_record(str(run_dir), config, run)
            recorded.append(run)
    measured = iap_es.measure(config, str(tmp_path))
    assert measured["runs"] == recorded
    assert os.listdir(run_dir) == ["result.json"]  # nothing was trained or checkpointed
    # A sweep extended by seeds (another label) reuses the record; other settings do not.
    extended = ml_collections.ConfigDict(config.to_dict())
    extended.seeds, extended.label = (*config.seeds, 99), "more seeds"
    assert iap_es.read_run_record(str(run_dir), extended) == run
    other = ml_collections.ConfigDict(config.to_dict())
    other.es.sigma *= 2
    assert iap_es.read_run_record(str(run_dir), other) is None
    assert iap_es.read_run_record(str(tmp_path / "runs" / "never_run"), config) is None


@pytest.mark.slow
def test_quick_config_runs_end_to_end(tmp_path):
    summary = run_experiment(iap_es_config.get_config("quick"), str(tmp_path))
    assert os.path.exists(summary["summary"])


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
    with pytest.raises(ValueError, match=r"multiple of es\.log_every"):
        iap_es.validate_config(config)
    config = ml_collections.ConfigDict(iap_es_config.get_config("quick").to_dict())
    config.reference = "positive:999"
    with pytest.raises(ValueError, match="reference"):
        iap_es.validate_config(config)
