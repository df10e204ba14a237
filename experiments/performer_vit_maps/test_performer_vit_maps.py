"""Performer-ViT with FAVOR+, FAVOR++ and FAVOR# features (issue 16): pairing, statistics,
verdicts, and a quick run of the experiment."""

import json
import math
import os

import ml_collections
import numpy as np
import pytest
import scipy.stats

from configs import performer_vit_maps as maps_config
from experiments import performer_vit_maps
from experiments.core import stats, verdicts
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment, validate_config
from experiments.performer_vit_maps import METRICS
from rfjax import data

requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(data.fashion_mnist_dir(), "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (.ci/run does)",
)


def fake_runs(
    gain: float,
    noise: float,
    seeds: int = 6,
    maps: tuple[str, ...] = ("oprf",),
    untrained: str | None = None,
) -> list[dict]:
    """Runs of FAVOR+ and ``maps`` on paired seeds: seed effects shared, each map better by
    ``gain`` with the run's own projection; fresh draws noisier and without the gain; the map
    ``untrained`` no better than with uniform attention (the training check fails)."""
    rng, fresh_rng = np.random.default_rng(0), np.random.default_rng(1)
    runs = []
    for seed in range(seeds):
        shared = 0.8 + 0.02 * rng.standard_normal()
        for feature_map in ("positive", *maps):
            shift = 0.0 if feature_map == "positive" else gain
            value = shared + shift + noise * rng.standard_normal()
            runs.append(
                {
                    "feature_map": feature_map,
                    "seed": seed,
                    "accuracy_own": value,
                    # The models use attention, except the untrained one.
                    "accuracy_uniform_attention": value - 0.05 * (feature_map != untrained),
                    "accuracy_fresh": shared - 0.1 + 0.01 * fresh_rng.standard_normal(),
                    "attention_error": 0.5 - shift + noise * rng.standard_normal(),
                }
            )
    return runs


def test_differences_are_paired_by_seed_and_verdicts_follow_the_interval():
    config = maps_config.get_config()
    config.feature_maps = ("positive", "oprf")
    # Seed effects (sd 0.02) are shared by both maps: pairing removes them, so a gain of 0.01
    # with a per-run noise of 0.001 is resolved, while the unpaired spread would hide it.
    rows = performer_vit_maps.differences(fake_runs(0.01, 0.001), config)
    accuracy = next(r for r in rows if r["metric"] == "accuracy_own")
    assert accuracy["n"] == 6 and accuracy["mean"] == pytest.approx(0.01, abs=0.002)
    assert accuracy["se"] < 0.001

    def outcomes(gain):
        runs = fake_runs(gain, 0.001)
        judged = performer_vit_maps.judge(
            performer_vit_maps.differences(runs, config), runs, config
        ).given
        return judged["better_accuracy"].outcome, judged["lower_attention_error"].outcome

    assert outcomes(0.01) == (Outcome.HOLDS, Outcome.HOLDS)
    # No gain: inside the margin, not resolved (and no error change either).
    assert outcomes(0.0)[0] == Outcome.NOT_RESOLVED
    # Worse by 0.01, beyond the declared 0.005: refuted.
    assert outcomes(-0.01)[0] == Outcome.DOES_NOT_HOLD


def two_maps_config() -> ml_collections.ConfigDict:
    config = maps_config.get_config()
    config.feature_maps = ("positive", "oprf")
    return config


def test_the_tables_show_each_maps_mean_and_se_and_the_paired_difference_with_its_interval():
    config = two_maps_config()
    runs = fake_runs(0.01, 0.003)
    oprf = {m: [r[m] for r in runs if r["feature_map"] == "oprf"] for m in METRICS}
    (row,) = [
        r for r in performer_vit_maps.accuracy_rows(runs, config) if "OPRF" in r["feature map"]
    ]
    for metric, label in METRICS.items():
        se = np.std(oprf[metric], ddof=1) / np.sqrt(6)
        assert row[label] == f"{np.mean(oprf[metric]):.4f} ± {se:.4f}", metric
    assert row["seeds"] == 6

    rows = performer_vit_maps.differences(runs, config)
    gain = np.subtract(
        *([r["accuracy_own"] for r in runs if r["feature_map"] == m] for m in ("oprf", "positive"))
    )
    mean, sd = np.mean(gain), np.std(gain, ddof=1)
    se, half = sd / np.sqrt(6), scipy.stats.t(5).ppf(0.975) * sd / np.sqrt(6)
    assert performer_vit_maps.difference_table(rows)[0] == {
        "comparison": "OPRF (FAVOR++) - FAVOR+ (positive)",
        "metric": METRICS["accuracy_own"],
        "difference": f"{mean:+.4f} ± {se:.4f}",
        "95% CI": f"[{mean - half:+.4f}, {mean + half:+.4f}]",
        "seeds": 6,
    }
    seeds = math.ceil((3 * sd / config.target_difference) ** 2)
    assert performer_vit_maps.power_lines(rows, config) == (
        f"- OPRF (FAVOR++): sd of the paired accuracy difference {sd:.4f}; 6 seeds give SE "
        f"{se:.4f} (3 SE = {3 * se:.4f}); {seeds} seeds would put +0.005 at 3 SE."
    )
    timing = performer_vit_maps.timing_text([{"train_seconds": 60}, {"train_seconds": 120}], 1.5)
    assert timing.startswith("2 runs, 3.0 min of training") and "load average 1.5 when" in timing


def test_a_map_without_two_paired_seeds_is_left_out_and_the_next_map_still_compared():
    config = maps_config.get_config()
    runs = [
        r
        for r in fake_runs(0.01, 0.001, maps=("oprf", "saderf"))
        if r["feature_map"] != "oprf" or r["seed"] == 0
    ]
    rows = performer_vit_maps.differences(runs, config)
    assert [(r["feature_map"], r["metric"]) for r in rows] == [("saderf", m) for m in METRICS]


def test_a_map_that_fails_the_training_check_leaves_the_claims_untested():
    config = two_maps_config()
    runs = fake_runs(0.01, 0.001, untrained="oprf")
    judged = performer_vit_maps.judge(performer_vit_maps.differences(runs, config), runs, config)
    assert judged.given["better_accuracy"].outcome == Outcome.NOT_TESTED


@pytest.mark.parametrize(
    ("se", "outcome"),
    # Three seeds: the Student-t interval (2 df, 4.30 SE) straddles 0 at an SE of 0.004, where a
    # normal one (1.96 SE) would not; at 0.002 it clears 0, which SD = SE sqrt(3) would not.
    [(0.004, Outcome.NOT_RESOLVED), (0.002, Outcome.HOLDS)],
)
def test_the_verdicts_use_the_paired_se_with_student_t_intervals(se, outcome):
    config = two_maps_config()
    estimate = stats.Estimate(0.01, se, 3, 2)
    rows = [
        {"feature_map": "oprf", "metric": metric, **estimate.as_dict()}
        for metric in ("accuracy_own", "attention_error")
    ]
    judged = performer_vit_maps.judge(rows, fake_runs(0.01, 0.001, seeds=3), config)
    assert judged.given["better_accuracy"].outcome == outcome


def test_map_config_trains_one_coupling_fixed_on_the_requested_seeds():
    config = maps_config.get_config()
    vit = performer_vit_maps.map_config(config, "saderf", 3)
    assert vit.model.feature_map == "saderf"
    assert tuple(vit.attentions) == ("orthogonal",) and tuple(vit.protocols) == ("fixed",)
    assert vit.num_seeds.fixed == 3 and vit.num_reference_seeds == 0
    assert config.vit.model.feature_map == "positive"  # the shared settings are not changed


def test_the_runs_seeds_start_at_the_vit_configs_training_seed(monkeypatch, tmp_path):
    """As performer_vit's: ``num_seeds`` seeds from ``vit.train.seed`` on (the study trained
    seeds 0.. whatever that field said, and stored it with every run)."""
    config = maps_config.get_config("quick,vit.train.seed=5")
    assert list(performer_vit_maps.run_seeds(config)) == [5, 6]
    swept = []
    vit = performer_vit_maps.performer_vit
    monkeypatch.setattr(vit, "load_arrays", lambda _: {"test": {"label": np.zeros(3)}})
    monkeypatch.setattr(vit.train, "enable_compilation_cache", lambda *_: None)
    monkeypatch.setattr(
        performer_vit_maps.sweep,
        "run",
        lambda _, names, seeds, *rest: swept.append(list(seeds)) or [],
    )
    performer_vit_maps.measure(config, str(tmp_path))
    assert swept == [[5, 6]]


def test_a_run_is_kept_when_only_the_target_difference_or_the_cache_folder_changes():
    """Both only report or cache: a stored run made under another value is still this run (the
    sweep measures a run again whose settings differ); a training setting is not."""

    def settings(override: str = "", feature_map: str = "oprf") -> dict:
        config = maps_config.get_config(override or None)
        return performer_vit_maps.run_settings(
            performer_vit_maps.map_config(config, feature_map, config.num_seeds)
        )

    assert settings("target_difference=0.01") == settings()
    assert settings("vit.compilation_cache_dir=elsewhere") == settings()
    assert settings("num_seeds=20") == settings()
    assert settings("vit.train.learning_rate=0.5") != settings()
    assert settings(feature_map="saderf") != settings()


def test_the_quick_variant_trains_the_full_design_at_toy_size():
    """The full study trains performer_vit's ``small`` design (raw scores); its quick variant
    trained the default's (cosine scores with a learned temperature, redrawn every step)."""
    full, quick = maps_config.get_config(), maps_config.get_config("quick")
    sizes = {"hidden_size", "num_layers", "mlp_dim", "num_features"}
    assert set(quick.vit.model) == set(full.vit.model)
    for key in set(full.vit.model) - sizes:
        assert quick.vit.model[key] == full.vit.model[key], key
    assert quick.vit.model.num_features < full.vit.model.num_features
    assert quick.vit.train.optimizer == full.vit.train.optimizer
    assert quick.vit.train.learning_rate == full.vit.train.learning_rate


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("feature_maps=(positive,fourier)", r"config\.feature_maps: 'fourier'"),  # not softmax's
        ("baseline=oprf_typo", r"config\.baseline: 'oprf_typo'"),
        ("feature_maps=(oprf,saderf)", r"config\.baseline: 'positive' is not one of"),
        ("coupling=exact", r"config\.coupling: 'exact'"),  # exact attention has no features
        ("num_seeds=0", r"config\.num_seeds must be finite and > 0"),
        ("target_difference=0", r"config\.target_difference must be finite and > 0"),
        # performer_vit's checks, naming the fields where they are: under config.vit
        ("vit.model.patch_size=5", r"config\.vit\.model\.patch_size must be a divisor"),
        ("vit.model.num_features=0", r"config\.vit\.model\.num_features must be"),
        ("vit.num_eval_draws=0", r"config\.vit\.num_eval_draws must be finite and > 0"),
    ],
)
def test_validate_config_names_the_bad_field(override, message):
    with pytest.raises(ValueError, match=message):
        performer_vit_maps.validate_config(maps_config.get_config(f"quick,{override}"))


def test_the_default_and_quick_configs_validate():
    for variant in (None, "quick"):
        validate_config(maps_config.get_config(variant))


@pytest.mark.integration
@requires_fashion_mnist
def test_quick_run_trains_every_map_on_paired_seeds(tmp_path):
    config = maps_config.get_config(
        "quick,feature_maps=(positive,saderf),vit.train.num_train_steps=4"
    )
    run_experiment(config, str(tmp_path))
    runs = json.loads((tmp_path / "records.json").read_text())["runs"]
    assert sorted((r["feature_map"], r["seed"]) for r in runs) == [
        ("positive", 0),
        ("positive", 1),
        ("saderf", 0),
        ("saderf", 1),
    ]
    for run in runs:
        assert 0.0 <= run["accuracy_own"] <= 1.0 and 0.0 < run["attention_error"] < 2.0
    # Each (map, seed) trained and evaluated its own model: the paired runs differ.
    assert len({run["attention_error"] for run in runs}) == 4
    differences = performer_vit_maps.differences(runs, config)
    assert {r["metric"] for r in differences} == set(performer_vit_maps.METRICS)
    summary = (tmp_path / "summary.md").read_text()
    assert "SADERF" in summary
    assert "Seeds 0 to 1 for every map" in summary and "; 128 test images" in summary
    assert set(verdicts.read(str(tmp_path))) == set(config.claims)
    assert (tmp_path / "paired_differences.png").stat().st_size > 0
