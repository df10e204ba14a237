"""FSDD loader, log-mel features, CTC decoding, the Conformer's attention kinds, the experiment."""

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import conformer_ctc as conformer_config
from experiments import conformer_ctc
from experiments.core.train import trainer as train
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from rfjax.attention import draw_projection, favor_attention
from rfjax.data import (
    concatenate_digits,
    load_fsdd,
    log_mel_spectrogram,
    mel_filterbank,
)
from rfjax.features import (
    AngularHybridFeatureMap,
    ClusterHybridFeatureMap,
    TrigonometricFeatureMap,
    cluster_hybrid_features,
    fit_cluster_hybrid,
)
from rfjax.nn import (
    ConformerEncoder,
    PerformerAttention,
)
from rfjax.projections import orthogonal
from tests.support import ROOT

needs_fsdd = pytest.mark.skipif(
    not os.path.isdir(os.environ.get("RFJAX_FSDD_DIR", "")),
    reason="FSDD not found: set RFJAX_FSDD_DIR to its recordings/ folder",
)


@pytest.fixture(scope="module")
def fsdd():
    return load_fsdd()


# One program per module and shape (eagerly, every primitive of init and apply compiles apart).
@functools.partial(jax.jit, static_argnums=0)
def _init(module, *args):
    return module.init(*args)


@functools.partial(jax.jit, static_argnums=0, static_argnames="mutable")
def _apply(module, variables, *args, **kwargs):
    return module.apply(variables, *args, **kwargs)


# --------------------------------------------------------------------------- data


@needs_fsdd
def test_load_fsdd_counts_speakers_rate(fsdd):
    assert len(fsdd["audio"]) == 3000 and fsdd["sample_rate"] == 8000
    speakers, counts = np.unique(fsdd["speaker"], return_counts=True)
    assert speakers.tolist() == ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    assert counts.tolist() == [500] * 6
    assert np.bincount(fsdd["digit"]).tolist() == [300] * 10
    assert all(a.dtype == np.float32 and a.ndim == 1 for a in fsdd["audio"])
    assert max(float(np.abs(a).max()) for a in fsdd["audio"]) <= 1.0


def test_load_fsdd_missing_folder_names_source(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="Jakobovski/free-spoken-digit-dataset"):
        load_fsdd(str(tmp_path))
    # No folder given: the environment variable, read at call time (not at import).
    monkeypatch.delenv("RFJAX_FSDD_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="RFJAX_FSDD_DIR"):
        load_fsdd()
    monkeypatch.setenv("RFJAX_FSDD_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_fsdd()


def test_concatenate_digits_deterministic_and_consistent():
    audio = [np.full(n, n, np.float32) for n in (10, 20, 30, 40)]
    digits = np.array([3, 1, 4, 0])
    waves, labels = concatenate_digits(audio, digits, 50, seed=7, min_digits=2, max_digits=5)
    again, labels_again = concatenate_digits(audio, digits, 50, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(waves, again, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(labels, labels_again, strict=True))
    lengths = {len(x) for x in labels}
    assert lengths <= {2, 3, 4, 5} and len(lengths) > 1
    recording = {3: 0, 1: 1, 4: 2, 0: 3}  # digits are unique here: label -> recording
    for wave, label in zip(waves, labels, strict=True):
        expected = np.concatenate([audio[recording[int(d)]] for d in label])
        np.testing.assert_array_equal(wave, expected)
    capped, _ = concatenate_digits(audio, digits, 5, seed=7, max_samples_per_digit=12)
    assert all(len(w) <= 5 * 12 for w in capped)
    with pytest.raises(ValueError, match="max_digits"):
        concatenate_digits(audio, digits, 5, seed=0, min_digits=3, max_digits=2)


@needs_fsdd
def test_held_out_speaker_not_in_training():
    config = conformer_config.get_config("quick")
    config.split = "speakers"
    train_arrays, test_arrays, info = conformer_ctc.make_data(config)
    assert info["test_speakers"] == ["theo"] and "theo" not in info["train_speakers"]
    assert len(info["train_speakers"]) == 5
    assert train_arrays["features"].shape[1] == info["max_frames"] and info["max_frames"] % 4 == 0
    counts = test_arrays["label_count"]
    assert counts.min() >= config.min_digits and counts.max() <= config.max_digits
    labels = test_arrays["labels"]
    width = config.max_digits
    assert labels.shape[1] == width
    assert np.all((labels > 0) == (np.arange(width)[None] < counts[:, None]))  # digits 1..10


@needs_fsdd
def test_held_out_recordings_of_the_training_speakers(fsdd):
    """split = "recordings": recordings with index >= first_test_index of every speaker are the
    test set, the others the training set; every speaker is in both."""
    config = conformer_config.get_config("quick")
    assert config.split == "recordings"
    selected = conformer_ctc._test_selection(config, fsdd)
    np.testing.assert_array_equal(selected, fsdd["index"] >= config.first_test_index)
    _, _, info = conformer_ctc.make_data(config)
    assert info["test_recordings"] == 6 * 10 * (50 - config.first_test_index)
    assert info["train_recordings"] + info["test_recordings"] == 3000
    assert info["train_speakers"] == info["test_speakers"] and len(info["test_speakers"]) == 6


def _runs(rates: dict[str, list[float]], uniform_cost: float = 0.05) -> list[dict]:
    """Runs as ``measure`` records them; uniform attention swapped in raises each model's DER
    by ``uniform_cost`` (capped at 1): the models use their attention."""
    return [
        {
            "attention": kind,
            "seed": seed,
            "digit_error_rate": rate,
            "der_uniform_attention": min(1.0, rate + uniform_cost),
        }
        for kind, values in rates.items()
        for seed, rate in enumerate(values)
    ]


def _records(rates: dict[str, list[float]]) -> dict:
    """Records as ``measure`` returns them: a kind whose DER is near 1 sits at the blank
    plateau (train CTC loss 27.5, temperature at its initial 8)."""
    runs = [
        {
            **run,
            "utterance_accuracy": 0.0,
            "test_ctc_loss": 28.0,
            "mean_temperature": 7.9 if run["digit_error_rate"] > 0.5 else 7.3,
        }
        for run in _runs(rates)
    ]
    curves = {
        kind: [
            [
                {"step": 50, "split": "train", "loss": 100.0},
                {"step": 500, "split": "train", "loss": 27.5 if rate > 0.5 else 3.0},
            ]
            for rate in values
        ]
        for kind, values in rates.items()
    }
    return {"runs": runs, "curves": curves}


def test_hybrid_ordering_is_only_tested_after_the_exact_favor_gate():
    config = conformer_config.get_config()
    same = [0.20, 0.25, 0.22, 0.27, 0.21]
    noise = [0.001, -0.002, 0.002, -0.001, 0.0]

    def judged(rates):
        return conformer_ctc.judge({"runs": _runs(rates)}, config).given["hybrid_ordering"]

    # Gate fails (FAVOR+ = exact up to noise): not tested, whatever the hybrids do.
    verdict = judged(
        {
            "exact": same,
            "positive": np.add(same, noise),
            "angular_hybrid": np.subtract(same, 0.1),
            "cluster_hybrid": np.subtract(same, 0.1),
        }
    )
    assert verdict.outcome == Outcome.NOT_TESTED and "does not resolve" in verdict.evidence
    # Gate passes (FAVOR+ clearly worse); both hybrids clearly better than FAVOR+: holds.
    worse = np.add(same, 0.1) + noise
    rates = {
        "exact": same,
        "positive": worse,
        "angular_hybrid": worse - 0.05 + np.roll(noise, 1),
        "cluster_hybrid": worse - 0.06 + np.roll(noise, 2),
    }
    assert judged(rates).outcome == Outcome.HOLDS
    # The hybrids worse than FAVOR+ by 0.05 on average, beyond the declared 0.005: refuted.
    rates["angular_hybrid"] = worse + 0.05 + np.roll(noise, 1)
    rates["cluster_hybrid"] = worse + 0.05 + np.roll(noise, 2)
    assert judged(rates).outcome == Outcome.DOES_NOT_HOLD


def test_without_the_gate_every_ordering_is_one_paired_test_over_seeds():
    """attention_context: the paper's orderings are tested whatever FAVOR+ - exact says, each
    an intersection of paired tests over seeds, one per (HRF, competitor) pair."""
    config = conformer_config.get_config("attention_context")
    same = np.array([0.20, 0.25, 0.22, 0.27, 0.21])
    noise = np.array([0.001, -0.002, 0.002, -0.001, 0.0])
    rates = {
        "exact": same,
        "positive": same + noise,  # the gate would fail
        "trigonometric": same + 0.001 + np.roll(noise, 3),
        "angular_hybrid": same - 0.02 + np.roll(noise, 1),
        "cluster_hybrid": same - 0.03 + np.roll(noise, 2),
    }
    given = conformer_ctc.judge({"runs": _runs(rates)}, config).given
    assert {v.outcome for v in given.values()} == {Outcome.HOLDS}
    assert "it holds at all 2 pairs" in given["hybrid_ordering"].evidence
    # The cluster hybrid worse than the angular one by 0.02 (> the 0.005 margin): refuted.
    rates["cluster_hybrid"] = same - 0.0 + np.roll(noise, 2)
    given = conformer_ctc.judge({"runs": _runs(rates)}, config).given
    assert given["cluster_best"].outcome == Outcome.DOES_NOT_HOLD
    # A kind not trained: that ordering is not tested, and says which.
    del rates["trigonometric"]
    given = conformer_ctc.judge({"runs": _runs(rates)}, config).given
    verdict = given["hybrids_beat_trigonometric"]
    assert verdict.outcome == Outcome.NOT_TESTED and "trigonometric" in verdict.evidence


def test_an_ordering_using_a_kind_that_did_not_train_is_not_tested():
    """The committed attention_context runs: trigonometric and angular-hybrid models stay at
    the blank plateau (DER ~0.99). The declared check (DER < 0.5 in every seed) fails them, so
    the orderings using them are not tested, with their numbers; the others are judged."""
    config = conformer_config.get_config("attention_context")
    same = np.array([0.14, 0.12, 0.16, 0.15, 0.13])
    noise = np.array([0.001, -0.002, 0.002, -0.001, 0.0])
    rates = {
        "exact": same,
        "positive": same + 0.01 + noise,
        "trigonometric": np.array([0.99, 1.0, 0.98, 1.0, 0.995]),
        "angular_hybrid": np.array([0.97, 1.0, 0.96, 1.0, 0.99]),
        "cluster_hybrid": same + 0.012 + np.roll(noise, 2),
    }
    judged = conformer_ctc.judge(_records(rates), config)
    given = judged.given
    assert judged.failed_arms() == ["trigonometric", "HRF angular hybrid"]
    assert {v.outcome for v in given.values()} == {Outcome.NOT_TESTED}
    ordering = given["hybrid_ordering"].evidence  # the angular hybrid, not the cluster one
    assert ordering.startswith("HRF angular hybrid failed the declared training check")
    assert "HRF angular hybrid: digit_error_rate 0.984 (0.96 to 1) over 5 seeds, 5 of 5" in (
        ordering
    )
    assert "HRF cluster hybrid:" not in ordering
    assert "What would test it: a variant in which HRF angular hybrid trains" in ordering
    assert "standard deviation 527 times the kernel's value" in ordering
    assert ordering.endswith(  # the variant the config declares to do it
        "the variant attention_context_tau1 does this "
        "(results/conformer_ctc_attention_context_tau1)"
    )
    config.follow_up = None  # none declared: the remedy says it was not run
    evidence = conformer_ctc.judge(_records(rates), config).given["hybrid_ordering"].evidence
    assert "What would test it: (not run) a variant in which HRF angular hybrid trains" in evidence
    trig = given["hybrids_beat_trigonometric"].evidence
    assert trig.startswith("trigonometric, HRF angular hybrid failed the declared training")
    # Only the trigonometric kind fails: the orderings without it are judged (here the
    # hybrids are worse than FAVOR+ by 0.011 and 0.002 DER: the angular one beyond the 0.005
    # margin, so the intersection does not hold; the cluster hybrid is below the angular one).
    rates["angular_hybrid"] = same + 0.03 + np.roll(noise, 1)
    given = conformer_ctc.judge(_records(rates), config).given
    assert given["hybrids_beat_trigonometric"].outcome == Outcome.NOT_TESTED
    assert given["hybrid_ordering"].outcome == Outcome.DOES_NOT_HOLD
    assert "(pairs HRF angular hybrid vs FAVOR+ (positive))" in given["hybrid_ordering"].evidence
    assert given["cluster_best"].outcome == Outcome.HOLDS
    # The summary's table says which kinds passed.
    rows = conformer_ctc._summary_rows(_records(rates), config.attentions, judged)
    assert [row["training check"] for row in rows] == [
        "passed",
        "passed",
        "failed",
        "failed",
        "passed",
    ]
    assert rows[2]["train CTC loss, first -> last log"] == "100 -> 27.5"


def test_a_task_whose_exact_models_do_not_use_attention_tests_no_ordering():
    """The committed attention_context_tau1 runs: every kind trains, but uniform attention
    swapped into the exact models changes their DER by +0.0020 +- 0.0026, against the 0.005 the
    check asks (7 of 10 seeds below it; the interval straddles it: not resolved), so the
    orderings of approximations of that attention are not tested (the reason stated); and the
    other kinds' runs, made before the swap was measured for every kind, cannot be checked."""
    config = conformer_config.get_config("attention_context_tau1")
    record = json.loads(
        (ROOT / "results" / "conformer_ctc_attention_context_tau1" / "records.json").read_text()
    )
    judged = conformer_ctc.judge(record, config)
    assert judged.failed_arms() == ["exact softmax"]
    assert judged.arm_checks["exact softmax"].outcome(judged.trained_check) == "not resolved"
    for verdict in judged.given.values():
        assert verdict.outcome == Outcome.NOT_TESTED
        assert verdict.evidence.startswith(
            "the declared training check (digit_error_rate below 0.5 and below the same model "
            "with uniform attention's by 0.005 (in every seed, or on average over seeds with 95% "
            "confidence)) is not resolved for exact softmax"
        )
        assert "7 of 10 failing; the same model with uniform attention 0.1298 (0.09179 " in (
            verdict.evidence
        )
        assert "the arm minus it -0.001993 ± 0.0026 per seed, -0.001993 (-0.01751 to +0.01329)" in (
            verdict.evidence
        )
        assert "The declared training check was not measured for " in verdict.evidence
    # The same runs with a measured uniform swap that costs every model 0.05 DER: judged.
    measured = {**record, "runs": _runs(_rates_of(record["runs"]))}
    given = conformer_ctc.judge(measured, config).given
    assert Outcome.NOT_TESTED not in {v.outcome for v in given.values()}


def _rates_of(runs: list[dict]) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {}
    for run in runs:
        rates.setdefault(run["attention"], []).append(run["digit_error_rate"])
    return rates


def test_trigonometric_relative_sd_matches_monte_carlo():
    """The closed form the not-tested verdicts quote, against 20,000 draws of the trigonometric
    estimate (m = 16 i.i.d. projections); the sample sd's SE is about sd / sqrt(2 N)."""
    draws, m = 20_000, 16
    rng = np.random.default_rng(0)
    for tau in (1.0, 8.0):
        delta = np.sqrt(tau) * np.array([1.0, -1.0] + [0.0] * 14)  # q' - k', |.|^2 = 2 tau
        w = rng.standard_normal((draws, m, 16))
        estimates = np.exp(tau) * np.cos(w @ delta).mean(axis=1)
        expected = conformer_ctc.trigonometric_relative_sd(tau, m)
        assert abs(estimates.std() - expected) < 4 * expected / np.sqrt(2 * draws)


def test_uniform_attention_swap_averages_the_values():
    """``with_uniform_attention`` sets every log-temperature to -30: exact cosine attention
    then weights every unmasked key equally (the diagnostic's "uniform weights")."""
    module = PerformerAttention(num_heads=2, attention_kind="exact", query_key_norm=True)
    x = jax.random.normal(jax.random.key(0), (1, 6, 8))
    mask = jnp.arange(6)[None] < 4
    variables = _init(module, jax.random.key(1), x)
    uniform = conformer_ctc.with_uniform_attention(variables)
    assert np.all(np.asarray(uniform["params"]["log_temperature"]) == -30.0)
    got = _apply(module, uniform, x, mask=mask)
    params = variables["params"]
    values = jnp.einsum("btd,dnh->btnh", x, params["value"]["kernel"]) + params["value"]["bias"]
    mean = values[:, :4].mean(axis=1, keepdims=True)  # the 4 unmasked keys
    expected = jnp.einsum("btnh,nhd->btd", mean, params["out"]["kernel"]) + params["out"]["bias"]
    np.testing.assert_allclose(got, jnp.broadcast_to(expected, got.shape), rtol=1e-5, atol=1e-6)


def test_log_mel_pure_tone_peaks_in_its_mel_bin():
    rate, fft_size, num_mels = 8000, 256, 40
    filters = mel_filterbank(num_mels, fft_size, rate)
    bins = np.linspace(0, rate / 2, fft_size // 2 + 1)
    centres = bins[np.argmax(filters, axis=0)]
    assert np.all(np.diff(centres) > 0) and np.all(
        filters.max(0) > 0.5
    )  # FFT bins sample the peaks
    for frequency in (300.0, 1000.0, 2500.0):
        tone = np.sin(2 * np.pi * frequency * np.arange(4000) / rate).astype(np.float32)
        features = log_mel_spectrogram(tone, num_mels=num_mels)
        assert features.shape == (1 + (4000 - 200) // 80, num_mels)
        peak = np.argmax(features.mean(0))
        # the tone's bin lies under the peak filter, next to its centre
        assert abs(centres[peak] - frequency) <= np.max(np.diff(centres)[max(peak - 1, 0) :][:2])
        assert filters[np.argmin(np.abs(bins - frequency)), peak] > 0.3


# --------------------------------------------------------------------------- decoding, metric


def _levenshtein(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def test_edit_distance_matches_python_reference():
    rng = np.random.default_rng(0)
    hyp = rng.integers(1, 4, size=(200, 9))
    ref = rng.integers(1, 4, size=(200, 5))
    hyp_len = rng.integers(0, 10, size=200)
    ref_len = rng.integers(1, 6, size=200)
    got = jax.jit(jax.vmap(conformer_ctc.edit_distance))(hyp, hyp_len, ref, ref_len)
    expected = [
        _levenshtein(h[:m], r[:n]) for h, m, r, n in zip(hyp, hyp_len, ref, ref_len, strict=True)
    ]
    assert np.asarray(got).tolist() == expected


def test_greedy_ctc_decode_merges_repeats_and_drops_blanks():
    frames = np.array([[1, 1, 0, 1, 2, 2, 0, 3, 5, 5], [4, 0, 4, 4, 0, 0, 7, 7, 7, 7]])
    logits = jax.nn.one_hot(frames, 11) * 5.0
    mask = np.array([[True] * 8 + [False] * 2, [True] * 10])
    tokens, lengths = jax.jit(conformer_ctc.greedy_ctc_decode)(logits, mask)
    assert lengths.tolist() == [4, 3]
    assert tokens[0, :4].tolist() == [1, 1, 2, 3] and tokens[1, :3].tolist() == [4, 4, 7]
    assert not np.any(np.asarray(tokens[0, 4:])) and not np.any(np.asarray(tokens[1, 3:]))


# --------------------------------------------------------------------------- feature maps


def _scaled(x):
    return x * x.shape[-1] ** -0.25


@pytest.mark.parametrize(
    "kind",
    ["angular_hybrid", "cluster_hybrid", pytest.param("trigonometric", marks=pytest.mark.slow)],
)
def test_attention_feature_maps_are_unbiased(kind):
    """Mean over independent draws of phi_Q(q').phi_K(k') vs exp(q'.k') within 4 SE, with
    q' = H^{-1/4} q as FAVOR scales them."""
    dim, draws = 4, 400
    q, k = _scaled(0.6 * jax.random.normal(jax.random.key(0), (2, 3, dim)))
    target = jnp.exp(jnp.sum(q * k, -1))
    if kind == "trigonometric":
        fmap = TrigonometricFeatureMap()
    elif kind == "angular_hybrid":
        fmap = AngularHybridFeatureMap(num_sign_features=3)
    else:
        points = jax.random.normal(jax.random.key(9), (2, 40, dim))
        fmap = ClusterHybridFeatureMap().fit(jax.random.key(8), *_scaled(points))

    def estimate(key):
        base_key, sign_key = jax.random.split(key)
        drawn = fmap.init(sign_key, dim)  # the angular hybrid's sign projection
        base = orthogonal(base_key, dim, 8)
        phi_q = drawn.features(q, base, side="query")
        return jnp.sum(phi_q * drawn.features(k, base, side="key"), -1)

    samples = jax.jit(jax.vmap(estimate))(jax.random.split(jax.random.key(1), draws))
    error = jnp.abs(samples.mean(0) - target)
    assert np.all(error <= 4 * samples.std(0) / math.sqrt(draws) + 1e-6)


@pytest.mark.parametrize("side", ["query", "key"])
def test_cluster_map_is_cluster_hybrid_features_of_its_centres(side):
    x = jax.random.normal(jax.random.key(0), (7, 4))
    points = jax.random.normal(jax.random.key(1), (2, 40, 4))
    parameters = fit_cluster_hybrid(jax.random.key(2), *points, 2, 2)
    fmap = ClusterHybridFeatureMap(
        query_centres=parameters.query_centres, key_centres=parameters.key_centres
    )
    base = orthogonal(jax.random.key(3), 4, 8)
    got = jax.jit(functools.partial(fmap.features, side=side))(x, base)
    expected = jax.jit(functools.partial(cluster_hybrid_features, side=side))(x, base, parameters)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)


def test_signed_attention_needs_a_denominator_floor():
    """Trigonometric FAVOR: a floor of the smallest normal number turns rows whose estimated
    normaliser is <= 0 into inf; the signed maps' default floor (1e-3, issue 32; before, the
    smallest normal number was every map's default) keeps them finite, as ``eps``
    (``PerformerAttention.eps``) does."""
    q, k, v = 2.0 * jax.random.normal(jax.random.key(0), (3, 2, 32, 2, 8))
    projection = draw_projection(jax.random.key(1), 8, 4, num_heads=2)
    tiny = float(np.finfo(np.float32).tiny)
    unguarded = favor_attention(q, k, v, projection, feature_map="trigonometric", eps=tiny)
    assert not np.all(np.isfinite(unguarded))
    out = favor_attention(q, k, v, projection, feature_map="trigonometric")
    assert np.all(np.isfinite(out))
    floored = favor_attention(q, k, v, projection, feature_map="trigonometric", eps=1e-3)
    np.testing.assert_array_equal(out, floored)


def test_query_key_norm_keeps_the_trigonometric_normaliser_positive():
    """The queries and keys ``PerformerAttention`` feeds FAVOR: raw, about half the rows'
    trigonometric normaliser estimates are <= 0 (and huge: the key factor e^{|k'|^2/2});
    with ``query_key_norm`` (unit vectors, tau = 1, m = 16 as in the default config) the
    kernel is >= e^{-2 tau} of its peak and every row's estimate is positive."""
    x = 2.0 * jax.random.normal(jax.random.key(0), (6, 32, 8))
    projection = draw_projection(jax.random.key(1), 8, 16)

    @jax.jit
    def normalisers(query, key):  # (B, T, 1, H) each: phi(q_t') . sum_s phi(k_s')
        fmap = TrigonometricFeatureMap()
        phi_q = fmap.features(_scaled(query[..., 0, :]), projection, side="query")
        phi_k = fmap.features(_scaled(key[..., 0, :]), projection, side="key")
        return jnp.einsum("btf,bf->bt", phi_q, phi_k.sum(1))

    fractions = {}
    for norm in (False, True):
        module = PerformerAttention(num_heads=1, attention_kind="exact", query_key_norm=norm)
        variables = _init(module, jax.random.key(2), x)
        _, state = _apply(module, variables, x, mutable="intermediates")
        sown = state["intermediates"]
        estimates = normalisers(sown["query_heads"][0], sown["key_heads"][0])
        fractions[norm] = float(jnp.mean(estimates <= 0))
    assert fractions[False] > 0.25 and fractions[True] == 0.0, fractions


# --------------------------------------------------------------------------- Conformer


def test_bad_config_raises():
    with pytest.raises(ValueError, match="attention must be one of"):
        ConformerEncoder(11, model_dim=8, num_heads=2, attention="softmax").init(
            jax.random.key(0), jnp.zeros((1, 8, 5)), jnp.ones((1, 8), bool)
        )
    with pytest.raises(ValueError, match="model_dim"):
        ConformerEncoder(11, model_dim=10, num_heads=4).init(
            jax.random.key(0), jnp.zeros((1, 8, 5)), jnp.ones((1, 8), bool)
        )
    config = conformer_config.get_config("quick")
    config.attentions = ("exact", "relu")
    with pytest.raises(ValueError, match=r"config\.attentions: 'relu' is not one of \("):
        conformer_ctc.validate_config(config)
    for field, value, message in (
        ("split", "words", r"config\.split: 'words' is not one of \('recordings', 'speakers'\)"),
        ("first_test_index", 50, r"config\.first_test_index must be an int in \[1, 49\], got 50"),
        ("num_swap_draws", 0, r"config\.num_swap_draws must be an int >= 1, got 0"),
        ("max_digits", 1, r"config\.max_digits must be >= config\.min_digits = 2, got 1"),
        ("num_train_utterances", -1, r"config\.num_train_utterances must be an int >= 1"),
        ("data_seed", -1, r"config\.data_seed must be an int >= 0, got -1"),
        ("model.model_dim", 0, r"config\.model\.model_dim must be an int >= 1, got 0"),
        ("model.num_heads", -1, r"config\.model\.num_heads must be an int >= 1, got -1"),
        ("model.num_clusters", 0, r"config\.model\.num_clusters must be an int >= 1, got 0"),
        (
            "model.dropout_rate",
            math.nan,
            r"config\.model\.dropout_rate must be finite and in \[0, 1\)",
        ),
        ("model.hybrid_eps", 0.0, r"config\.model\.hybrid_eps must be finite and > 0, got 0\.0"),
    ):
        config = conformer_config.get_config("quick")
        *parents, name = field.split(".")
        section = functools.reduce(lambda c, k: c[k], parents, config)
        section[name] = value
        with pytest.raises(ValueError, match=message):
            conformer_ctc.validate_config(config)
    config = conformer_config.get_config("quick")
    config.model.query_key_norm = False
    with pytest.raises(ValueError, match="query_key_norm"):
        conformer_ctc.validate_config(config)
    config = conformer_config.get_config("quick")
    config.attentions = ("exact", "cluster_hybrid")
    config.train.optimizer = "adamw"
    with pytest.raises(ValueError, match="weight decay"):
        conformer_ctc.validate_config(config)
    with pytest.raises(ValueError, match="variant"):
        conformer_config.get_config("huge")


@pytest.mark.integration
@needs_fsdd
def test_quick_run_trains_and_writes_outputs(tmp_path):
    config = conformer_config.get_config("quick")  # exact attention and its swap diagnostic
    result = run_experiment(config, str(tmp_path))
    for name in (
        "results.csv",
        "records.json",
        "verdicts.json",
        "summary.md",
        "config.json",
        "digit_error_rate.png",
        "learning_curves.png",
    ):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "summary.md").read_text().startswith("# Conformer-Performer")
    for attention in config.attentions:
        records = train.read_metrics(str(tmp_path / "runs" / f"{attention}_seed0"))
        losses = [r["loss"] for r in records if r["split"] == "train"]
        assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], (attention, losses)
        evals = [r for r in records if r["split"] == "eval"]
        assert [r["step"] for r in evals] == [6, 12]  # the test-DER curve of the figure
    rates = [run["digit_error_rate"] for run in result["runs"]]
    assert all(np.isfinite(rates)) and all(r >= 0 for r in rates)
    exact = next(run for run in result["runs"] if run["attention"] == "exact")
    assert exact["der_favor_swap"] >= 0
    # Every kind's model with uniform attention swapped in: the training check's trivial model.
    assert all(run["der_uniform_attention"] >= 0 for run in result["runs"])
    assert exact["mean_temperature"] > 0


@pytest.mark.parametrize(("favor_shift", "trained"), [(0.0, False), (0.1, True)])
def test_gate_first_trains_the_hybrids_only_after_a_significant_gate(
    monkeypatch, tmp_path, favor_shift, trained
):
    """``measure`` trains exact and FAVOR+ first; the other kinds only if they differ."""
    exact = np.array([0.20, 0.25, 0.22, 0.27, 0.21])
    noise = np.array([0.001, -0.002, 0.002, -0.001, 0.0])
    rates = {"exact": exact, "positive": exact + favor_shift + noise, "angular_hybrid": exact}
    order = []

    def fake_training(config, attention, seed, *_):
        if seed == 0:
            order.append(attention)
        return {"attention": attention, "seed": seed, "digit_error_rate": rates[attention][seed]}

    monkeypatch.setattr(conformer_ctc, "make_data", lambda config: ({}, {}, {}))
    monkeypatch.setattr(conformer_ctc, "train_run", lambda *a: {**fake_training(*a), "curve": []})
    config = conformer_config.get_config("quick")
    config.attentions = ("angular_hybrid", "positive", "exact")
    config.seeds = tuple(range(5))
    results = conformer_ctc.measure(config, str(tmp_path))
    assert order[:2] == ["exact", "positive"]
    assert ("angular_hybrid" in order) == trained
    assert results["skipped"] == ([] if trained else ["angular_hybrid"])


def test_attention_context_variant_changes_only_the_convolution_kernel():
    # The second committed design: attention is the only mixing across frames (kernel 1).
    default = conformer_config.get_config().to_dict()
    variant = conformer_config.get_config("attention_context").to_dict()
    assert variant["model"].pop("kernel_size") == 1 and default["model"].pop("kernel_size") == 3
    assert variant.pop("label") == "attention_context" and default.pop("label") == "default"
    # ... and tests the paper's orderings without the gate, on 10 paired seeds.
    assert variant.pop("seeds") == tuple(range(10)) and len(default.pop("seeds")) == 5
    assert variant.pop("gate_first") is False and default.pop("gate_first") is True
    # ... and names the variant that tests what it could not (a report field).
    assert variant.pop("follow_up") == "attention_context_tau1" and "follow_up" not in default
    assert variant == default


def test_attention_context_tau1_changes_only_the_initial_temperature():
    base = conformer_config.get_config("attention_context").to_dict()
    tau1 = conformer_config.get_config("attention_context_tau1").to_dict()
    assert base["model"].pop("initial_temperature") == 8.0
    assert tau1["model"].pop("initial_temperature") == 1.0
    assert base.pop("label") == "attention_context" and base.pop("follow_up")
    assert tau1.pop("label") == "attention_context_tau1"
    assert tau1 == base


def test_evaluator_sums_over_the_real_utterances_at_the_last_update_projection():
    """``evaluator``'s totals over 5 utterances in batches of 2 (the last padded): the edit
    distances of the greedy decodes, the reference digits, the utterances decoded exactly, the
    CTC losses and the count, each over the real utterances only, with the projection of the
    last update (step - 1); the DER is the edit distance over the reference digits."""
    config = conformer_config.get_config("quick")
    config.eval_batch_size = 2
    config.model.redraw_interval = 1  # a new projection every step
    rng = np.random.default_rng(0)
    frames = np.array([16, 12, 8, 16, 4], np.int32)
    count = np.array([3, 1, 2, 4, 1], np.int32)
    features = rng.standard_normal((5, 16, config.num_mels)).astype(np.float32)
    features[np.arange(16)[None] >= frames[:, None]] = 0.0
    labels = np.where(
        np.arange(config.max_digits)[None] < count[:, None],
        rng.integers(1, 11, (5, config.max_digits)),
        0,
    ).astype(np.int32)
    arrays = {"features": features, "frames": frames, "labels": labels, "label_count": count}
    model = conformer_ctc.make_model(config, "positive")
    task = conformer_ctc.make_task(model, arrays, arrays, config, seed=0)
    variables = task.init(jax.random.key(0), arrays)
    rng_key, step = jax.random.key(1), 7
    totals = conformer_ctc.evaluator(model, arrays, config)(variables, rng_key, step)

    mask = jnp.arange(16)[None] < frames[:, None]
    logits, out_mask = jax.jit(functools.partial(model.apply, train=False))(
        variables,
        features,
        mask,
        projection_step=step - 1,
        rngs=train.step_rngs(rng_key, step, per_step=()),
    )
    label_paddings = (np.arange(config.max_digits)[None] >= count[:, None]).astype(np.float32)
    losses = optax.ctc_loss(logits, 1.0 - out_mask.astype(jnp.float32), labels, label_paddings)
    tokens, lengths = conformer_ctc.greedy_ctc_decode(logits, out_mask)
    distances = np.asarray(jax.vmap(conformer_ctc.edit_distance)(tokens, lengths, labels, count))
    assert totals["count"] == 5
    assert totals["reference_digits"] == count.sum()
    assert totals["edit_distance"] == distances.sum()
    assert totals["utterance_correct"] == np.sum(distances == 0)
    assert totals["loss"] == pytest.approx(float(np.sum(losses)), rel=1e-5)
    assert conformer_ctc.digit_error_rate(totals) == distances.sum() / count.sum()
