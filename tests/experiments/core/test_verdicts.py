"""The one verdict rule (experiments.core.verdicts) on fixed estimates whose outcomes are
derived by hand from their intervals (t quantiles from scipy)."""

import json
import math

import ml_collections
import pytest

from configs.common import claim, trained_check
from experiments.core import verdicts
from experiments.core.stats import Estimate
from experiments.core.verdicts import Outcome


def make(powered=True, **claims):
    config = ml_collections.ConfigDict({"claims": claims, "powered": powered})
    return verdicts.Verdicts(config)


# SimRF - ORF accuracy over 15 paired seeds: 95% CI = 0.0021 -+ 2.1448 * 0.0015
# = [-0.00112, +0.00532], straddling 0.
STRADDLING = Estimate(0.0021, 0.0015, 15, 14.0)
REVERSED = Estimate(-0.01, 0.001, 15, 14.0)  # CI [-0.0121, -0.0079]


def test_an_ordering_resolved_above_zero_holds():
    judge = make(gain=claim("A beats B", "greater", margin=0.005))
    verdict = judge.effect("gain", Estimate(0.01, 0.001, 15, 14.0), effect="A - B", units="seeds")
    assert verdict.outcome == Outcome.HOLDS and verdict.claim == "A beats B"
    assert verdict.sentence().startswith("**holds**: A - B = +0.01 ± 0.001 (95% CI")


def test_a_straddling_interval_is_not_resolved_with_the_seeds_that_would_resolve_it():
    judge = make(gain=claim("A beats B", "greater", margin=0.005))
    verdict = judge.effect("gain", STRADDLING, effect="A - B", units="seeds")
    assert verdict.outcome == Outcome.NOT_RESOLVED
    # The t interval at the observed spread sd = 0.0015 sqrt(15): at 31 seeds 2.042 sd / sqrt(31)
    # = 0.00213 > 0.0021, at 32 2.040 sd / sqrt(32) = 0.00209 (the normal count said 30).
    assert "about 32 seeds would resolve it" in verdict.evidence


def test_an_unpowered_straddle_against_the_claim_says_more_seeds_cannot_refute_it():
    # lstm_lm sharp_tau_paired, FAVOR+ / exact - 1 over 3 seeds: +0.67 +- 0.13, 95% CI
    # [+0.10, +1.24] straddling the margin 0.2 of a non-superiority claim.
    within = claim("FAVOR+ within 20% of exact", "nonsuperior", margin=0.2)
    estimate = Estimate(0.6701, 0.1321, 3, 2.0)
    unpowered = make(powered=False, within=within).effect("within", estimate, effect="r", units="s")
    assert unpowered.outcome == Outcome.NOT_RESOLVED
    assert "would resolve it against the claim, but this variant is not sized" in (
        unpowered.evidence
    )
    powered = make(within=within).effect("within", estimate, effect="r", units="s")
    assert powered.outcome == Outcome.NOT_RESOLVED and "not sized" not in powered.evidence
    # On the claimed side of the margin, more seeds would resolve it for the claim: no note.
    near = make(powered=False, within=within).effect(
        "within", Estimate(0.1, 0.06, 3, 2.0), effect="r", units="s"
    )
    assert near.outcome == Outcome.NOT_RESOLVED and "not sized" not in near.evidence


def test_does_not_hold_needs_a_margin_a_resolved_effect_beyond_it_and_a_powered_variant():
    with_margin = make(gain=claim("A beats B", "greater", margin=0.005))
    assert with_margin.effect("gain", REVERSED, effect="d", units="seeds").outcome == (
        Outcome.DOES_NOT_HOLD
    )
    # The same numbers with no margin declared: a reversal cannot refute the claim.
    no_margin = make(gain=claim("A beats B", "greater"))
    verdict = no_margin.effect("gain", REVERSED, effect="d", units="seeds")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "no margin is declared" in verdict.evidence
    # Reversed, but inside the margin (CI [-0.0031, -0.0009] against -0.005): not resolved.
    small = with_margin.effect("gain", Estimate(-0.002, 0.0005, 15, 14.0), effect="d", units="s")
    assert small.outcome == Outcome.NOT_RESOLVED
    assert "between 0 and the margin against the claim, -0.005" in small.evidence
    # The same on the other side for a "less" claim.
    smaller = make(gain=claim("A costs less", "less", margin=0.005))
    rise = smaller.effect("gain", Estimate(0.002, 0.0005, 15, 14.0), effect="d", units="s")
    assert rise.outcome == Outcome.NOT_RESOLVED
    assert "between 0 and the margin against the claim, +0.005" in rise.evidence
    # A quick variant never refutes.
    quick = make(powered=False, gain=claim("A beats B", "greater", margin=0.005))
    verdict = quick.effect("gain", REVERSED, effect="d", units="seeds")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "not sized" in verdict.evidence


def test_the_iap_es_training_pair_is_not_resolved_under_its_declared_20_percent_margin():
    # Issue 30: -0.441 +- 0.179 over 60 paired seeds against a 20% margin of 3.025 (0.605):
    # 90% CI = -0.441 -+ 1.6711 * 0.179 = [-0.740, -0.142] straddles -0.605.
    judge = make(equal=claim("HRF = FAVOR+", "equivalent", margin=0.2, relative=True))
    estimate = Estimate(-0.441, 0.179, 60, 59.0)
    verdict = judge.effect("equal", estimate, effect="d", units="seeds", reference=-3.025)
    assert verdict.outcome == Outcome.NOT_RESOLVED
    assert "90% CI [-0.74, -0.142]" in verdict.evidence
    # 60 (1.645 * 0.179 / (0.605 - 0.441))^2 = 193.4 -> 194 seeds by the normal quantile; the
    # t quantile of 195 df (1.6527) needs 196.
    assert "about 196 seeds" in verdict.evidence
    assert verdict.margin == "20% of the reference = 0.605"
    # At the 440 seeds declared from that spread: -0.151 +- 0.0606 against 20% of 2.822 (0.564):
    # 90% CI = -0.151 -+ 1.6483 * 0.0606 = [-0.251, -0.051], inside +-0.564, though clear of 0.
    at_440 = Estimate(-0.151, 0.0606, 440, 439.0)
    verdict = judge.effect("equal", at_440, effect="d", units="seeds", reference=2.822)
    assert verdict.outcome == Outcome.HOLDS and "inside [-0.564, 0.564]" in verdict.evidence
    inference = judge.effect(
        "equal", Estimate(-0.080, 0.012, 120, 119.0), effect="d", units="runs", reference=-3.0
    )
    assert inference.outcome == Outcome.HOLDS  # [-0.100, -0.060] inside +-0.6
    far = Estimate(-2.0, 0.1, 60, 59.0)
    beyond = judge.effect("equal", far, effect="d", units="s", reference=3.0)
    assert beyond.outcome == Outcome.DOES_NOT_HOLD
    with pytest.raises(ValueError, match="relative margin"):
        judge.effect("equal", estimate, effect="d", units="seeds")


def test_non_inferiority_of_the_redraw_pair():
    # Issue 30: redraw SimRF - ORF CI [-0.0027, +0.0024] against a 0.005 margin: never worse.
    judge = make(never_worse=claim("SimRF never worse", "noninferior", margin=0.005))
    estimate = Estimate(-0.0001, 0.0012, 15, 14.0)
    assert judge.effect("never_worse", estimate, effect="d", units="seeds").outcome == (
        Outcome.HOLDS
    )
    worse = judge.effect("never_worse", Estimate(-0.02, 0.001, 15, 14.0), effect="d", units="s")
    assert worse.outcome == Outcome.DOES_NOT_HOLD


def test_within_k_se():
    judge = make(
        exact=claim("closed form is exact", "within_se", k=4),
        exact_margin=claim("closed form is exact", "within_se", k=4, margin=0.5),
    )
    assert judge.effect("exact", Estimate(0.5, 0.2, 100), effect="d", units="draws").outcome == (
        Outcome.HOLDS
    )
    off = Estimate(2.0, 0.2, 100)  # 10 SE off
    assert judge.effect("exact", off, effect="d", units="draws").outcome == Outcome.NOT_RESOLVED
    # 2.0 - 4 * 0.2 = 1.2 beyond 4 SE, more than the 0.5 margin.
    assert judge.effect("exact_margin", off, effect="d", units="draws").outcome == (
        Outcome.DOES_NOT_HOLD
    )


def test_an_ordering_over_cells_is_one_pooled_test():
    # Two cells shown, one reversed within the noise: the pooled mean (0.4 + 0.4 - 0.1) / 3 =
    # 0.2333 with SE sqrt(3 * 0.01) / 3 = 0.0577 is above 0 by 4 SE: holds, although not every
    # cell passes.
    judge = make(order=claim("A below B", "greater"))
    cells = {1: Estimate(0.4, 0.1, 1000), 2: Estimate(0.4, 0.1, 1000), 3: Estimate(-0.1, 0.1, 1000)}
    verdict = judge.ordering("order", cells, effect="B - A", cell_name="v", units="draws")
    assert verdict.outcome == Outcome.HOLDS
    assert "mean over 3 v = +0.233 ± 0.0577" in verdict.evidence
    # The same cells measured on shared draws: SE 0.1 (any correlation), CI [0.037, 0.43].
    shared = judge.ordering(
        "order", cells, effect="B - A", cell_name="v", units="draws", shared_units=True
    )
    assert shared.outcome == Outcome.HOLDS and "± 0.1 (95% CI [+0.0373" in shared.evidence
    assert "beyond 3 SE the claimed way at 2 of 3 v, the other way at none" in verdict.evidence
    # For a "less" claim the cells' directions swap.
    less = make(order=claim("A below B", "less"))
    flipped = {k: Estimate(-e.mean, e.se, e.n) for k, e in cells.items()}
    verdict = less.ordering("order", flipped, effect="A - B", cell_name="v", units="draws")
    assert verdict.outcome == Outcome.HOLDS and "claimed way at 2 of 3" in verdict.evidence
    # Precision weights: a noisy cell counts less. Weights 100 and 1: (100 * 0.1 + 1 * -1.0) /
    # 101 = 0.0891, SE sqrt(100^2 * 0.01 + 1) / 101 = 0.0995.
    noisy = {1: Estimate(0.1, 0.1, 100), 2: Estimate(-1.0, 1.0, 100)}
    weighted = make(order=claim("A below B", "greater", pooling="precision"))
    verdict = weighted.ordering("order", noisy, effect="d", cell_name="v", units="draws")
    assert "= +0.0891 ± 0.0995" in verdict.evidence


def test_the_claims_are_checked_and_every_declared_claim_needs_a_verdict(tmp_path):
    with pytest.raises(ValueError, match="needs a margin > 0"):
        make(equal=claim("x", "equivalent"))  # the claims' own checks: test_claims.py
    judge = make(a=claim("A", "fact"), b=claim("B", "less"))
    judge.exact("a", 0.5, effect="gap")
    with pytest.raises(ValueError, match=r"without a verdict: \['b'\]"):
        verdicts.write(str(tmp_path), judge)
    with pytest.raises(KeyError, match="not declared"):
        judge.not_tested("c", "no design")
    judge.not_tested("b", "the design has no B")
    verdicts.write(str(tmp_path), judge)
    stored = json.loads((tmp_path / verdicts.VERDICTS_FILE).read_text())
    assert stored["b"] == {
        "claim": "B",
        "outcome": "not tested",
        "evidence": "the design has no B",
        "margin": "—",
    }
    assert verdicts.read(str(tmp_path))["a"].outcome == Outcome.HOLDS


def test_no_interval_is_not_tested():
    # One seed gives no interval: the design cannot test the claim (performer_lm's one seed).
    judge = make(gain=claim("A beats B", "greater", margin=1.0))
    verdict = judge.effect("gain", Estimate(-5.0, math.nan, 1, 0.0), effect="d", units="seeds")
    assert verdict.outcome == Outcome.NOT_TESTED
    assert "no interval (1 seeds: an interval needs at least 2" in verdict.evidence
    cells = {"a": Estimate(0.1, 0.01, 5, 4.0), "b": Estimate(0.1, math.nan, 1, 0.0)}
    verdict = judge.every("gain", cells, effect="d", cell_name="pairs", units="seeds")
    assert verdict.outcome == Outcome.NOT_TESTED and "no interval at 1 (pairs b)" in (
        verdict.evidence
    )


def test_a_fact_is_decided_without_noise():
    judge = make(order=claim("closed forms ordered", "fact"), gain=claim("A beats B", "greater"))
    verdict = judge.exact("order", -0.002, effect="smallest gap")
    assert verdict.outcome == Outcome.DOES_NOT_HOLD and verdict.evidence == (
        "smallest gap = -0.002 (exact)"
    )
    assert judge.fact("order", True, "every cycle odd").outcome == Outcome.HOLDS
    with pytest.raises(ValueError, match="not a 'fact'"):
        judge.fact("gain", True, "no")
    # A quick variant computed it at its own sizes: false there, it cannot refute the claim.
    quick = make(powered=False, order=claim("closed forms ordered", "fact"))
    verdict = quick.exact("order", -0.002, effect="smallest gap")
    assert verdict.outcome == Outcome.NOT_RESOLVED
    assert verdict.evidence.startswith("smallest gap = -0.002 (exact); false here, but this")


def test_a_claim_about_every_cell_is_an_intersection_union_test():
    judge = make(same=claim("A = B on every set", "equivalent", margin=0.01))
    # 90% CIs 0.002 -+ 0.0033 and -0.001 -+ 0.0033: both inside +-0.01.
    cells = {"a": Estimate(0.002, 0.002, 500), "b": Estimate(-0.001, 0.002, 500)}
    verdict = judge.every("same", cells, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.HOLDS and "it holds at all 2 sets" in verdict.evidence
    # A third set 0.05 +- 0.002: beyond the margin even at the Bonferroni-corrected
    # 1 - 0.1 / 3 = 96.7% confidence.
    cells["c"] = Estimate(0.05, 0.002, 500)
    verdict = judge.every("same", cells, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.DOES_NOT_HOLD and "(sets c)" in verdict.evidence
    assert "intervals at 96.67%" in verdict.evidence
    # Opposite deviations do not cancel, as they would in a pooled mean.
    cells = {"a": Estimate(0.012, 0.002, 500), "b": Estimate(-0.012, 0.002, 500)}
    pooled = make(same=claim("A = B", "equivalent", margin=0.01))
    assert pooled.ordering("same", cells, effect="d", cell_name="s", units="d").outcome == (
        Outcome.HOLDS
    )
    verdict = judge.every("same", cells, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED
    # The sentence says, per unresolved set, how many draws would resolve it.
    for cell in ("a", "b"):
        assert f"{cell}: the interval straddles" in verdict.evidence
    assert verdict.evidence.count("draws would resolve it") == 2


def test_the_pooling_is_declared_with_the_claim():
    cells = {1: Estimate(1.0, 0.1, 100), 2: Estimate(-3.0, 10.0, 100)}
    equal = make(order=claim("A above B", "greater"))
    verdict = equal.ordering("order", cells, effect="d", cell_name="v", units="draws")
    assert "d, mean over 2 v = -1 ± 5" in verdict.evidence  # (1 - 3) / 2, sqrt(0.01 + 100) / 2
    precision = make(order=claim("A above B", "greater", pooling="precision"))
    verdict = precision.ordering("order", cells, effect="d", cell_name="v", units="draws")
    assert (
        verdict.outcome == Outcome.HOLDS and "precision-weighted mean over 2 v" in verdict.evidence
    )
    with pytest.raises(ValueError, match="pooling must be one of"):
        make(order=claim("A", "greater", pooling="median"))


def model_study(check=None, **claims):
    """A config that trains models (a ``train`` section) with ``claims`` and ``check``."""
    config = ml_collections.ConfigDict({"claims": claims, "train": {"num_train_steps": 10}})
    if check is not None:
        config.trained_check = check
    return config


PERPLEXITY_CHECK = trained_check(
    "test_perplexity",
    reason="no better than word frequencies",
    trivial="unigram",
    trivial_name="the count unigram model",
)


def test_a_model_study_without_a_declared_training_check_is_refused():
    config = model_study(order=claim("A below B", "greater"))
    with pytest.raises(ValueError, match="trained_check is missing: a config that trains"):
        verdicts.Verdicts(config)  # the check's own rules: test_training_check.py


def test_a_model_study_must_name_and_check_the_arms_of_every_claim():
    judge = verdicts.Verdicts(model_study(PERPLEXITY_CHECK, order=claim("A below B", "greater")))
    gain = Estimate(0.01, 0.001, 3, 2.0)
    with pytest.raises(ValueError, match="must name the arms it uses"):
        judge.effect("order", gain, effect="d", units="seeds")
    with pytest.raises(ValueError, match=r"uses arms \['A'\] without a training-check result"):
        judge.effect("order", gain, effect="d", units="seeds", arms=["A"])
    for method in (judge.every, judge.ordering):
        with pytest.raises(ValueError, match="must name the arms"):
            method("order", {"c": gain}, effect="d", cell_name="c", units="seeds")
    # A study that trains nothing cannot name arms.
    plain = make(order=claim("A below B", "greater"))
    with pytest.raises(ValueError, match="declares no trained_check"):
        plain.effect("order", gain, effect="d", units="seeds", arms=["A"])
    with pytest.raises(ValueError, match="needs a declared config"):
        plain.check_training([], "arm")


def test_a_claim_entered_by_an_arm_that_failed_the_check_is_not_tested_and_stated():
    judge = verdicts.Verdicts(model_study(PERPLEXITY_CHECK, order=claim("A below B", "greater")))
    runs = [
        {"arm": arm, "seed": seed, "test_perplexity": value, "unigram": 640.0}
        for arm, values in (
            ("exact", (190, 195, 200, 205, 650)),  # one seed above the unigram model, the mean
            ("favor+", (4000, 4200, 4100)),  # below it with 95% confidence
            ("trig", (4000, 4200, 600)),  # one seed below: the interval straddles
        )
        for seed, value in enumerate(values)
    ]
    checks = judge.check_training(runs, "arm", remedy=lambda arms: f"a colder tau for {arms}")
    assert list(checks) == ["exact", "favor+", "trig"]
    assert [c.outcome(judge.trained_check) for c in checks.values()] == [
        "passed",
        "failed",
        "not resolved",
    ]
    assert judge.passed_arms() == ["exact"] and judge.failed_arms() == ["favor+", "trig"]
    verdict = judge.effect(
        "order", Estimate(5.0, 0.1, 3, 2.0), effect="d", units="seeds", arms=["exact", "favor+"]
    )
    assert verdict.outcome == Outcome.NOT_TESTED and verdict.margin == "—"
    # The finding: which arm, how many seeds, how far from the trivial model.
    assert verdict.evidence.startswith("favor+ failed the declared training check")
    assert "test_perplexity 4100 (4000 to 4200) over 3 seeds, 3 of 3 failing" in (verdict.evidence)
    assert (
        "the count unigram model 640: the arm minus it +3460 ± 58 per seed, +3460 (+3360 to "
        "+3560), 6.41 times it"
    ) in verdict.evidence
    assert verdict.evidence.endswith("What would test it: a colder tau for ['favor+']")
    unresolved = judge.effect(
        "order", Estimate(5.0, 0.1, 3, 2.0), effect="d", units="seeds", arms=["exact", "trig"]
    )
    assert unresolved.outcome == Outcome.NOT_TESTED
    assert "is not resolved for trig, so the claim cannot rest on them" in unresolved.evidence
    # trig minus the unigram model: [3360, 3560, -40], sd 2023: the t interval excludes 0 from
    # 6 seeds (2.571 x 2023 / sqrt(6) = 2123 < 2293; 5 seeds: 2512), the normal count said 4.
    assert "straddles 0 at 95%: not resolved (about 6 seeds would resolve it" in (
        unresolved.evidence
    )
    text = judge.training_text()
    assert "Passed by exact. **Failed by favor+** (a finding" in text
    assert "**Not resolved for trig**" in text
    # An arm that passed leaves the claim to the interval rule.
    assert judge.effect(
        "order", Estimate(5.0, 0.1, 3, 2.0), effect="d", units="seeds", arms=["exact"]
    ).outcome == (Outcome.HOLDS)


def test_an_arm_whose_runs_lack_the_trivial_models_field_is_not_measured():
    """Claims over it are not tested (runs made before the check was declared)."""
    check = trained_check("der", reason="r", limit=0.5, trivial="der_uniform", trivial_name="u")
    judge = verdicts.Verdicts(model_study(check, order=claim("A below B", "greater")))
    judge.check_training([{"arm": "A", "der": 0.1}], "arm")  # within the limit
    verdict = judge.effect("order", Estimate(1, 0.1, 3, 2.0), effect="d", units="s", arms=["A"])
    assert verdict.outcome == Outcome.NOT_TESTED
    assert "not measured for A" in verdict.evidence and "no `der_uniform`" in verdict.evidence


def test_each_run_is_checked_against_its_own_trivial_model():
    judge = verdicts.Verdicts(model_study(PERPLEXITY_CHECK, order=claim("A below B", "greater")))
    runs = [  # every seed beats its own unigram model, none beats seed 0's 300
        {"arm": "A", "test_perplexity": value, "unigram": unigram}
        for value, unigram in ((290.0, 300.0), (390.0, 400.0), (490.0, 500.0))
    ]
    check = judge.check_training(runs, "arm")["A"]
    assert check.thresholds == (300.0, 400.0, 500.0)
    assert check.outcome(judge.trained_check) == "passed"
    # Runs without the trivial model's field are still failed by the limit alone.
    limited = trained_check("der", reason="r", limit=0.5, trivial="der_uniform", trivial_name="u")
    judge = verdicts.Verdicts(model_study(limited, order=claim("A below B", "greater")))
    runs = [{"arm": "A", "der": value} for value in (0.7, 0.71, 0.72)]  # [-0.235, -0.185]
    check = judge.check_training(runs, "arm")["A"]
    assert check.outcome(judge.trained_check) == "failed"
    # Without a limit, such runs cannot be checked at all.
    judge = verdicts.Verdicts(model_study(PERPLEXITY_CHECK, order=claim("A below B", "greater")))
    check = judge.check_training([{"arm": "A", "test_perplexity": 90.0}], "arm")["A"]
    assert check.outcome(judge.trained_check) == "not measured"


def test_a_claim_over_several_competitors_holds_only_where_every_pair_does():
    # LSTM claim (1) as committed: the hybrids far better than trigonometric features, the
    # Gaussian hybrid worse than FAVOR+ beyond ln 1.1 in 12 of 12 models.
    cells = {
        "gaussian vs favor+": Estimate(-0.346, 0.027, 12, 11.0),
        "gaussian vs trigonometric": Estimate(0.455, 0.048, 12, 11.0),
        "angular vs trigonometric": Estimate(0.699, 0.043, 12, 11.0),
    }
    judge = make(best=claim("hybrids most accurate", "greater", margin=0.0953))
    pooled = judge.ordering("best", cells, effect="d", cell_name="pairs", units="models")
    assert pooled.outcome == Outcome.HOLDS  # the pooled mean hides the pair going the other way
    verdict = judge.every("best", cells, effect="d", cell_name="pairs", units="models")
    assert verdict.outcome == Outcome.DOES_NOT_HOLD
    assert "at 1 (pairs gaussian vs favor+)" in verdict.evidence
    rows = judge.cell_rows("best", cells, cell_name="pair", units="models")
    assert [r["interval lies"] for r in rows] == [
        "against, beyond the margin",
        "the claimed side",
        "the claimed side",
    ]
    assert rows[0]["mean ± 1 SE"] == "-0.346 ± 0.027" and rows[0]["models"] == 12


def test_an_interval_inside_the_margin_reports_its_equivalence_bound():
    # structured_concentration's chi order: 95% CI [-0.0553, +0.0733] inside ln 1.1 = 0.0953.
    judge = make(order=claim("chi 2 below chi 3", "greater", margin=0.0953))
    verdict = judge.effect("order", Estimate(0.009, 0.0328, 4000), effect="d", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED
    assert verdict.evidence.endswith(
        "; equivalence bound: the interval puts the effect within ±0.0733, inside the margin "
        "±0.0953"
    )
    # Not where the interval reaches beyond the margin.
    wide = judge.effect("order", Estimate(0.009, 0.1, 4000), effect="d", units="draws")
    assert "equivalence bound" not in wide.evidence


def test_a_model_study_summary_states_the_training_check(tmp_path, monkeypatch):
    from experiments.core import outputs

    monkeypatch.setattr(outputs, "EXPERIMENTS", str(tmp_path))
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "summary.md").write_text("# Toy\n\n$verdict_order\n")
    config = model_study(PERPLEXITY_CHECK, order=claim("A below B", "greater"))
    config.experiment = "toy"
    judge = verdicts.Verdicts(config)
    judge.not_tested("order", "why")
    with pytest.raises(ValueError, match=r"values without placeholders \['training_check'\]"):
        verdicts.write_summary(str(tmp_path), "toy", judge, config)


def test_the_closed_form_agreement_is_judged_at_the_worst_cell_of_the_kept_rows():
    judge = make(exact=claim("closed form is exact", "within_se", k=4))
    rows = [
        {"v": 1.0, "mc": 1.02, "theory": 1.0, "se": 0.01},  # 2 SE off
        {"v": 2.0, "mc": 1.9, "theory": 2.0, "se": 0.01},  # 10 SE off, left out by where
        {"v": 3.0, "mc": 3.03, "theory": 3.0, "se": 0.01},  # 3 SE off: the worst kept
    ]
    verdict = judge.closed_form_agreement(
        "exact",
        rows,
        measured="mc",
        closed_form="theory",
        se="se",
        draws=500,
        cell=lambda r: f"v = {r['v']:g}",
        where=lambda r: r["v"] != 2.0,
        cell_name="grid points",
    )
    assert verdict.outcome == Outcome.HOLDS
    assert "Monte Carlo - closed form at the worst of 2 grid points (v = 3)" in verdict.evidence
    assert "(3.00 SE)" in verdict.evidence and "500 draws" in verdict.evidence
    everything = judge.closed_form_agreement(
        "exact", rows, measured="mc", closed_form="theory", se="se", draws=500, cell=str
    )
    assert everything.outcome == Outcome.NOT_RESOLVED  # 10 SE off, no margin declared


def _below_bound(judge, rows, *, effect: str):
    """The claim "bound" over rows of (eps, tail, bound, se), 4,000 draws each."""
    return judge.below_bound(
        "bound",
        rows,
        measured="tail",
        bound="bound",
        se="se",
        draws=4000,
        cell=lambda r: f"eps {r['eps']:g}",
        effect=effect,
        cell_name="eps",
    )


def test_a_bound_is_judged_where_the_measured_value_comes_closest():
    judge = make(bound=claim("the tail is below the bound", "less", margin=0.005))
    rows = [  # (tail - bound) / SE: -30, -2.5, -40: the second cell is the closest
        {"eps": 0.1, "tail": 0.2, "bound": 0.5, "se": 0.01},
        {"eps": 0.2, "tail": 0.1, "bound": 0.125, "se": 0.01},
        {"eps": 0.3, "tail": 0.1, "bound": 2.0, "se": 0.0475},
    ]
    verdict = _below_bound(judge, rows, effect="empirical tail - bound")
    assert verdict.outcome == Outcome.HOLDS  # -0.025 ± 0.01: below 0.005
    assert "empirical tail - bound at the closest of 3 eps (eps 0.2) = -0.025" in verdict.evidence
    # Bounds below 1: 0.5 / 0.2 = 2.5 and 0.125 / 0.1 = 1.25 (the third, 2.0, says nothing).
    assert "Smallest bound / empirical ratio where the bound is < 1: 1.25" in verdict.evidence


@pytest.mark.parametrize("test", ["noninferior", "nonsuperior", "equivalent"])
def test_a_relative_margin_of_a_zero_reference_never_refutes(test):
    """A relative margin times a reference of 0 is a zero margin, which must not yield "does
    not hold" (it did: the interval lay "beyond the margin 0")."""
    judge = make(claimed=claim("level with the reference", test, margin=0.05, relative=True))
    sign = 1.0 if test == "nonsuperior" else -1.0
    estimate = Estimate(sign * 0.22, 0.01, 4, df=3)  # far on the refuting side of 0
    verdict = judge.effect("claimed", estimate, effect="x", units="seeds", reference=0.0)
    assert verdict.outcome == Outcome.NOT_TESTED
    assert "zero margin cannot refute" in verdict.evidence
    # A non-zero reference still refutes it.
    refuted = judge.effect("claimed", estimate, effect="x", units="seeds", reference=1.0)
    assert refuted.outcome == Outcome.DOES_NOT_HOLD


def test_a_closed_form_check_of_a_non_finite_estimate_is_not_tested():
    """A NaN SE read "not resolved ... inf SE off" before."""
    judge = make(exact=claim("closed form is exact", "within_se", k=4))
    for estimate in (Estimate(0.5, math.nan, 1), Estimate(math.nan, 0.1, 10)):
        verdict = judge.effect("exact", estimate, effect="x", units="draws")
        assert verdict.outcome == Outcome.NOT_TESTED and "not finite" in verdict.evidence


def test_a_claim_over_cells_quotes_the_cell_that_decides_it():
    """ "does not hold" quoted the cell farthest from 0 in either direction: one that supports
    the claim (+5.06, CI [+4.91, +5.22] in hrf_clustered) beside the verdict against it."""
    judge = make(gain=claim("A beats B everywhere", "greater", margin=0.1))
    cells = {"small": Estimate(5.06, 0.08, 10, 9.0), "large": Estimate(-2.74, 0.12, 10, 9.0)}
    verdict = judge.every("gain", cells, effect="d", cell_name="settings", units="seeds")
    assert verdict.outcome == Outcome.DOES_NOT_HOLD
    assert verdict.evidence.startswith("d at the settings farthest against it (large) = -2.74")
    unresolved = {"small": Estimate(5.06, 0.08, 10, 9.0), "large": Estimate(0.02, 0.1, 10, 9.0)}
    verdict = judge.every("gain", unresolved, effect="d", cell_name="settings", units="seeds")
    assert verdict.evidence.startswith("d at the farthest unresolved settings (large)")
    # Where it holds everywhere, the cell nearest to not holding bounds it (the strongest cell,
    # quoted before, said least: hrf_qmc quoted a baseline 10 SE off beside one 5.4 SE off).
    holding = {"small": Estimate(5.06, 0.08, 10, 9.0), "large": Estimate(0.6, 0.1, 10, 9.0)}
    verdict = judge.every("gain", holding, effect="d", cell_name="settings", units="seeds")
    assert verdict.outcome == Outcome.HOLDS
    assert verdict.evidence.startswith("d at the settings nearest to not holding (large) = +0.6")


def test_identical_results_without_spread_neither_show_nor_refute_an_ordering():
    # A difference of exactly 0 (identical paired results): not above 0, so "A beats B" does not
    # hold; exactly at -margin is not beyond it, so it is not refuted either.
    judge = make(gain=claim("A beats B", "greater", margin=0.005))
    for mean in (0.0, -0.005):
        verdict = judge.effect("gain", Estimate(mean, 0.0, 15, 14.0), effect="d", units="seeds")
        assert verdict.outcome == Outcome.NOT_RESOLVED, (mean, verdict.evidence)


def test_the_one_sided_regions_of_less_and_nonsuperior_claims():
    # nonsuperior, margin 0.2: CI 0.1 -+ 2.145 x 0.02 = [0.057, 0.143] lies below +0.2: holds
    # (though above 0).
    judge = make(
        within=claim("B within 0.2 of A", "nonsuperior", margin=0.2),
        lower=claim("A below B", "less", margin=0.005),
    )
    within = judge.effect("within", Estimate(0.1, 0.02, 15, 14.0), effect="d", units="seeds")
    assert within.outcome == Outcome.HOLDS and "below 0.2" in within.evidence
    # less, margin 0.005: CI [+0.0079, +0.0121] lies above +0.005: refuted; its mirror holds.
    above = judge.effect("lower", Estimate(0.01, 0.001, 15, 14.0), effect="d", units="seeds")
    assert above.outcome == Outcome.DOES_NOT_HOLD
    below = judge.effect("lower", Estimate(-0.01, 0.001, 15, 14.0), effect="d", units="seeds")
    assert below.outcome == Outcome.HOLDS


def test_within_k_se_refutes_only_by_more_than_the_margin_beyond_k_se():
    # 1.0 +- 0.2 with k = 4: 5 SE off, beyond 4 SE by 1.0 - 0.8 = 0.2, less than the margin 0.5.
    judge = make(exact=claim("closed form is exact", "within_se", k=4, margin=0.5))
    verdict = judge.effect("exact", Estimate(1.0, 0.2, 100), effect="d", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "by less than the margin" in (
        verdict.evidence
    )


def test_an_ordering_leaves_out_a_cell_without_a_finite_estimate():
    judge = make(order=claim("A below B", "greater"))
    cells = {
        1: Estimate(0.4, 0.1, 1000),
        2: Estimate(0.4, 0.1, 1000),
        3: Estimate(math.nan, 0.1, 1),
    }
    verdict = judge.ordering("order", cells, effect="B - A", cell_name="v", units="draws")
    assert verdict.outcome == Outcome.HOLDS  # (0.4 + 0.4) / 2 +- 0.0707, the NaN cell out
    assert "mean over 2 v = +0.4 ± 0.0707" in verdict.evidence
    assert "1 v without a finite estimate left out" in verdict.evidence
    # For a nonsuperior claim, as for less, the claimed way is below 0.
    within = make(order=claim("A within 0.5 of B", "nonsuperior", margin=0.5))
    cells = {1: Estimate(-0.4, 0.1, 1000), 2: Estimate(-0.4, 0.1, 1000), 3: Estimate(0.1, 0.1, 1)}
    verdict = within.ordering("order", cells, effect="A - B", cell_name="v", units="draws")
    assert "beyond 3 SE the claimed way at 2 of 3 v, the other way at none" in verdict.evidence


def test_every_cell_refutes_only_at_the_bonferroni_level_and_holds_without_it():
    judge = make(same=claim("A = B on every set", "equivalent", margin=0.01))
    # Cell c: 90% CI low 0.0135 - 1.645 x 0.002 = 0.0102 > 0.01, but at the 96.67% that
    # refuting in one of 3 cells needs, 0.0135 - 2.128 x 0.002 = 0.0092: not refuted.
    cells = {
        "a": Estimate(0.0, 0.002, 500),
        "b": Estimate(0.0, 0.002, 500),
        "c": Estimate(0.0135, 0.002, 500),
    }
    verdict = judge.every("same", cells, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED
    assert "beyond the margin at 90% but not at the 96.67%" in verdict.evidence
    rows = judge.cell_rows("same", cells, cell_name="set", units="draws")
    assert rows[2]["interval lies"] == (
        "against at 90%, not at the 96.67% (Bonferroni) that refuting needs"
    )
    # Two cells 0.0065 +- 0.002: 90% CIs up to 0.0098, inside the margin: it holds (an
    # intersection-union test needs no correction; at 95% they would reach 0.0104).
    inside = {"a": Estimate(0.0065, 0.002, 500), "b": Estimate(-0.0065, 0.002, 500)}
    verdict = judge.every("same", inside, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.HOLDS
    # Beyond the margin even at the corrected level, a variant not sized for it cannot refute.
    cells["c"] = Estimate(0.05, 0.002, 500)
    quick = make(powered=False, same=claim("A = B on every set", "equivalent", margin=0.01))
    verdict = quick.every("same", cells, effect="A - B", cell_name="sets", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "not sized" in verdict.evidence


def test_the_worst_and_the_closest_cells_are_found_in_standard_errors():
    # a: 0.5 +- 0.01 is 50 SE off, b: 2.0 +- 1.0 only 2: a decides (not the larger b).
    judge = make(
        exact=claim("closed form is exact", "within_se", k=4),
        bound=claim("the tail is below the bound", "less", margin=0.005),
    )
    cells = {"a": Estimate(0.5, 0.01, 1000), "b": Estimate(2.0, 1.0, 1000)}
    verdict = judge.worst_cell("exact", cells, effect="d", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "(a)" in verdict.evidence
    rows = [  # (tail - bound) / SE: -100 and -1: the second is the closest, not the first
        {"eps": 0.1, "tail": 0.4, "bound": 0.5, "se": 0.001},
        {"eps": 0.2, "tail": 0.1, "bound": 0.6, "se": 0.5},
    ]
    verdict = _below_bound(judge, rows, effect="tail - bound")
    assert verdict.outcome == Outcome.NOT_RESOLVED and "(eps 0.2)" in verdict.evidence


def test_no_equivalence_bound_is_claimed_for_an_interval_reaching_past_the_margin():
    # [0.0257, 0.474] lies above 0 (holds) but not inside +-0.1: no equivalence bound.
    judge = make(gain=claim("A beats B", "greater", margin=0.1))
    verdict = judge.effect("gain", Estimate(0.25, 0.1, 10, 9.0), effect="d", units="seeds")
    assert verdict.outcome == Outcome.HOLDS and "equivalence bound" not in verdict.evidence
    # A mean of exactly 0 with no margin lies on the boundary, not on the other side of 0.
    plain = make(gain=claim("A beats B", "greater"))
    verdict = plain.effect("gain", Estimate(0.0, 0.1, 10, 9.0), effect="d", units="seeds")
    assert "the estimate lies on the boundary 0" in verdict.evidence


def test_a_quick_variant_cannot_refute_agreement_within_k_se():
    quick = make(powered=False, exact=claim("closed form is exact", "within_se", k=4, margin=0.5))
    verdict = quick.effect("exact", Estimate(2.0, 0.2, 100), effect="d", units="draws")
    assert verdict.outcome == Outcome.NOT_RESOLVED
