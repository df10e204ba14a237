"""Performer-ViT with FAVOR+, FAVOR++ and FAVOR# features (issue 16): pairing, statistics,
verdicts, and a quick run of the experiment."""

import json
import os

import numpy as np
import pytest

from configs import performer_vit_maps as maps_config
from experiments import performer_vit_maps
from experiments.core import verdicts
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from rfjax import data

requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(data.fashion_mnist_dir(), "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist (.ci/run does)",
)


def fake_runs(gain: float, noise: float, seeds: int = 6) -> list[dict]:
    """Runs of FAVOR+ and OPRF on paired seeds: seed effects shared, OPRF better by ``gain``."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(seeds):
        shared = 0.8 + 0.02 * rng.standard_normal()
        for feature_map, shift in (("positive", 0.0), ("oprf", gain)):
            value = shared + shift + noise * rng.standard_normal()
            runs.append(
                {
                    "feature_map": feature_map,
                    "seed": seed,
                    "accuracy_own": value,
                    "accuracy_uniform_attention": value - 0.05,  # the models use attention
                    "accuracy_fresh": value - 0.1,
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


def test_map_config_trains_one_coupling_fixed_on_the_requested_seeds():
    config = maps_config.get_config()
    vit = performer_vit_maps.map_config(config, "saderf", 3)
    assert vit.model.feature_map == "saderf"
    assert tuple(vit.attentions) == ("orthogonal",) and tuple(vit.protocols) == ("fixed",)
    assert vit.num_seeds.fixed == 3 and vit.num_reference_seeds == 0
    assert config.vit.model.feature_map == "positive"  # the shared settings are not changed


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


def test_validate_config_names_the_bad_field():
    config = maps_config.get_config("quick")
    config.feature_maps = ("positive", "fourier")  # not a softmax-kernel map
    with pytest.raises(ValueError, match="feature_maps"):
        performer_vit_maps.validate_config(config)
    config = maps_config.get_config("quick")
    config.baseline = "oprf_typo"
    with pytest.raises(ValueError, match="baseline"):
        performer_vit_maps.validate_config(config)


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
    differences = performer_vit_maps.differences(runs, config)
    assert {r["metric"] for r in differences} == set(performer_vit_maps.METRICS)
    summary = (tmp_path / "summary.md").read_text()
    assert "SADERF" in summary
    assert set(verdicts.read(str(tmp_path))) == set(config.claims)
    assert (tmp_path / "paired_differences.png").stat().st_size > 0
