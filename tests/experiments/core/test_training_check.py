"""The declared training check (experiments.core.training_check): the threshold a run must
beat, which configs must declare one, and the fields it refuses. Its use in judging claims (an
arm that failed it leaves a claim not tested): test_verdicts.py."""

import ml_collections
import pytest

from experiments.core import training_check


def trains_models(check=None):
    """A config with a ``train`` section (it trains models) and ``check``."""
    config = ml_collections.ConfigDict({"claims": {}, "train": {"num_train_steps": 10}})
    if check is not None:
        config.trained_check = check
    return config


def test_the_threshold_is_the_stricter_of_the_limit_and_the_trivial_model_by_its_margin():
    der = training_check.TrainedCheck(
        "der",
        reason="r",
        limit=0.5,
        trivial="der_uniform",
        trivial_name="uniform attention",
        margin=0.005,
    )
    assert der.threshold(0.2) == pytest.approx(0.195) and der.threshold(0.9) == 0.5
    assert der.beats(0.19, 0.195) and not der.beats(0.196, 0.195)
    assert not der.beats(0.195, 0.195)  # equal to the threshold does not beat it
    assert not der.beats(float("nan"), 0.5)  # a NaN fails
    relative = training_check.TrainedCheck(
        "ppl", reason="r", trivial="u", trivial_name="u", margin=0.1, relative=True
    )
    assert relative.threshold(640.0) == pytest.approx(576.0)
    # A negative trivial value (a random policy's return): beaten by 10% of its size, -180.
    higher = training_check.TrainedCheck(
        "r", reason="r", trivial="u", trivial_name="u", margin=0.1, relative=True, better="higher"
    )
    assert higher.threshold(-200.0) == pytest.approx(-180.0)
    returns = training_check.TrainedCheck(
        "return",
        reason="r",
        trivial="random",
        trivial_name="a random policy",
        better="higher",
        margin=1.0,
    )
    assert returns.threshold(2.0) == 3.0 and returns.beats(3.5, 3.0) and not returns.beats(3, 3)
    assert returns.describe() == (
        "return above a random policy's by 1 (in every seed, or on average over seeds with 95% "
        "confidence)"
    )


def test_a_config_that_trains_models_must_declare_one_and_others_need_none():
    with pytest.raises(
        ValueError, match=r"trained_check is missing: a config that trains models \(config.train\)"
    ):
        training_check.declared(trains_models())
    # Evolution strategies train models too, and so does a nested study's trainer.
    es = ml_collections.ConfigDict({"claims": {}, "es": {"num_generations": 3}})
    with pytest.raises(ValueError, match=r"config.es\)"):
        training_check.declared(es)
    nested = ml_collections.ConfigDict({"claims": {}, "vit": {"train": {"num_train_steps": 1}}})
    with pytest.raises(ValueError, match=r"config.vit.train\)"):
        training_check.declared(nested)
    assert training_check.declared(ml_collections.ConfigDict({"claims": {}})) is None


def test_malformed_checks_are_refused_naming_the_field():
    for bad, message in (
        ({"metric": "", "reason": "r", "limit": 0.5}, "metric"),
        ({"metric": "e", "reason": "r", "limit": float("inf")}, "limit"),
        ({"metric": "e", "reason": "r"}, "needs a limit, a trivial model"),
        ({"metric": "e", "reason": "r", "trivial": "u"}, "go together"),
        ({"metric": "e", "limit": 0.5}, "metric and reason required"),
        ({"metric": "e", "reason": "r", "limit": 0.5, "better": "up"}, "better"),
    ):
        with pytest.raises(ValueError, match=message):
            training_check.declared(trains_models(ml_collections.ConfigDict(bad)))


def test_an_arm_with_a_failing_seed_is_judged_by_the_t_interval_of_its_mean_excess():
    # Below a limit of 0.5: excess 0.1, 0.05, 0.02, 0.2, -0.2 (one seed fails), mean 0.034,
    # SE 0.066, 95% t interval (4 df) [-0.149, +0.217]: not resolved, not passed.
    check = training_check.TrainedCheck("error", reason="r", limit=0.5)
    arm = training_check.ArmCheck("A", (0.4, 0.45, 0.48, 0.3, 0.7), (0.5,) * 5)
    assert arm.failing(check) == 1 and arm.outcome(check) == "not resolved"
    # Above a limit of 0 (higher is better): excess 1.0, 2.0, 1.5, -0.1, 1.2, mean 1.12, SE
    # 0.348, interval [+0.153, +2.087] above 0: passed although one seed fails.
    returns = training_check.TrainedCheck("return", reason="r", limit=0.0, better="higher")
    arm = training_check.ArmCheck("B", (1.0, 2.0, 1.5, -0.1, 1.2), (0.0,) * 5)
    assert arm.excess(returns).mean == pytest.approx(1.12)
    assert arm.failing(returns) == 1 and arm.outcome(returns) == "passed"
