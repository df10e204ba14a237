"""LSTM language model on Penn Treebank trained with random-feature sampled softmax (HRF Sec. 4.2).

Command:
  python -m experiments.main --config=configs/lstm_lm.py              # default (CPU, below)
  python -m experiments.main --config=configs/lstm_lm.py:quick        # seconds (smoke test)
  python -m experiments.main --config=configs/lstm_lm.py:paper        # accelerator (80 epochs;
      # about 90 GPU-hours on one H200: benchmarks/gpu_runs/2026-11-27-h200-lstm-paper/)
  python -m experiments.main --config=configs/lstm_lm.py:kl_tau       # departure: KL-chosen tau
  python -m experiments.main --config=configs/lstm_lm.py:equal_width  # departure: equal width
  python -m experiments.main --config=configs/lstm_lm.py:sharp_tau    # departure: tau = 0.1
  python -m experiments.main --config=configs/lstm_lm.py:sharp_tau_paired  # our target claim there
  python -m experiments.main --config=configs/lstm_lm.py:mid_tau      # paper's claim (2), tau = 0.3

Sets the paper's protocol (HRF App. I.1: a 2-layer LSTM of width 200, tied embeddings, 40
sampled negative classes, proposals on the normalised vectors, raw logits for the loss) at CPU
scale: kernel proposals at tau = 1; FAVOR+ and trigonometric features on m = 128 projections,
the angular (128, 8) and Gaussian (128, 4) hybrids; four arms (exact softmax proposal, FAVOR+,
angular hybrid, trigonometric) x 3 seeds for 3 epochs, and the uniform and count unigram
baselines on one seed each; the distribution metrics on 2,048 validation queries x 16 feature
draws. Training check (``trained_check``): test perplexity below the count unigram model's.

Variants: ``quick`` (smoke test); ``paper`` (80 epochs, 1024 features, 25 seeds, an
accelerator: the only powered one, so the default's verdicts are never "does not hold");
departures ``kl_tau`` (tau by held-out KL each step), ``sharp_tau`` (tau = 0.1, a one-seed,
one-epoch probe for claim (2)), ``sharp_tau_paired`` (our target claim there: exact and FAVOR+ on 3
paired seeds), ``mid_tau`` (claim (2) at tau = 0.3, the random-feature arms on 3 paired seeds)
and ``equal_width`` (the hybrids at FAVOR+'s feature width).
The paper's protocol quoted, why the default is what it is and why each departure exists:
``experiments/lstm_lm/design.md``.
"""

import ml_collections
import numpy as np

from configs.common import apply_overrides, claim, parse_variant, trained_check
from configs.training import train_config

TRAIN_WINDOWS = (929_589 - 1) // 35  # PTB training windows of 35 tokens


def _estimator(proposal: str, num_features: int, num_coefficient_features: int = 1):
    options = ml_collections.ConfigDict()
    options.proposal = proposal  # one of rfjax.sampled_softmax.feature_proposals()
    options.num_features = num_features  # m
    options.num_coefficient_features = num_coefficient_features  # n (hybrids only)
    return options


def _estimators(favor: int, angular: tuple[int, int], gaussian: tuple[int, int], **equal_width):
    """FAVOR+ and trigonometric with m = ``favor``, the hybrids at FAVOR+'s base projections
    (``angular``, ``gaussian``: (m, n)) and ``equal_width`` ones (name: (proposal, m, n))."""
    estimators = ml_collections.ConfigDict()
    estimators["favor+"] = _estimator("positive_antithetic", favor)
    estimators["trigonometric"] = _estimator("trigonometric", favor)
    estimators["angular"] = _estimator("angular_hybrid", *angular)
    estimators["gaussian"] = _estimator("gaussian_hybrid", *gaussian)
    for name, (proposal, m, n) in equal_width.items():
        estimators[name] = _estimator(proposal, m, n)
    return estimators


# The hybrids at FAVOR+'s width 256 (the ``equal_width`` departure), scored beside the default's.
EQUAL_WIDTH = {
    "angular_eqW": ("angular_hybrid", 8, 7),  # width 4 m (n + 1) = 256
    "gaussian_eqW": ("gaussian_hybrid", 9, 3),  # width 4 m (2 n + 1) = 252
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(
        arg,
        ("quick", "paper", "kl_tau", "equal_width", "sharp_tau", "sharp_tau_paired", "mid_tau"),
    )
    config = ml_collections.ConfigDict()
    config.experiment = "lstm_lm"
    config.variant = variant or "default"  # named in the summary
    # Trained arms, "<setting>:<estimator>": setting "normalised" (raw logits, the proposal on
    # the normalised vectors; the paper's PTB setting) or "cosine" (cosine logits with a learned
    # scale s, tau = 1/s; Rawat et al.); estimator "exact", "kernel", "uniform", "unigram" (the
    # count unigram model of the training words) or a key of config.estimators. The baselines:
    # the paper's uniform and exact proposals (App. I.1) and a unigram proposal.
    config.arms = (
        "normalised:exact",
        "normalised:uniform",
        "normalised:unigram",
        "normalised:favor+",
        "normalised:angular",
        "normalised:trigonometric",
    )
    # Every estimator is scored by the distribution metrics; the hybrids' (m, n) keep FAVOR+'s
    # base projections m and match the FLOPs of constructing the features (module docstring).
    config.estimators = _estimators(128, (128, 8), (128, 4), **EQUAL_WIDTH)
    config.favor_estimator = "favor+"  # the reference of the tables' paired differences
    # Claim (1): these hybrids against the other random-feature estimators (FAVOR+, trig.).
    config.hybrid_estimators = ("angular", "gaussian")
    config.seeds = (0, 1, 2)
    # The uniform and unigram baselines enter no claim (they show what a proposal that ignores
    # the query does to training): one seed each on the shared CPU.
    config.baseline_seeds = (0,)
    config.claims = ml_collections.ConfigDict(
        {
            # Effect per model: ln(competitor's mean distance / hybrid's), averaged over the
            # hybrids, competitors (FAVOR+, trigonometric) and metrics (W1, KS); paired by
            # query and draw within a model, models the units. Refuted if the hybrids' distances
            # are larger by more than 10% (ln 1.1 = 0.0953).
            "hybrids_most_accurate": claim(
                "HRFs lead to most accurate softmax distribution estimation: lower "
                "1-Wasserstein distance and KS statistic than FAVOR+ and trigonometric features "
                "(HRF Sec. 4.2, Fig. 3: between 'a true softmax distribution induced by a query "
                "on all the classes and the approximate one'; App. I: 'our hybrid variants "
                "consistently outperform Favor+ and the trigonometric random features')",
                "greater",
                margin=0.0953,
            ),
            # Test perplexity of the trained hybrid over each other random-feature proposal,
            # minus 1, paired by seed; "not very significant": every ratio within 1 +- 0.1 (an
            # intersection-union equivalence test, TOST at 5% per pair).
            "proposals_alike": claim(
                "Even though the statistical metrics for HRFs are better in Fig. 3, the "
                "difference between "
                "HRFs and other random feature estimators in this specific softmax sampling "
                "downstream task is not very significant (HRF App. I.1, Fig. 10)",
                "equivalent",
                margin=0.1,
            ),
            # Our target, not the paper's: a random-feature proposal is useful if it trains
            # about as well as the model's own softmax.
            "favor_within_20": claim(
                "Our target: FAVOR+'s test perplexity within 20% of the exact softmax "
                "proposal's (paired by seed)",
                "nonsuperior",
                margin=0.2,
            ),
        }
    )
    # Did each arm train? The task's trivial model is the count unigram model of the training
    # words (experiments/lstm_lm/unigram.py: test perplexity 639.8): an arm whose test
    # perplexity is not below it in every seed has learned nothing a frequency table does not
    # know, and a claim whose test uses it is "not tested". Declared on 2026-11-28 (issue 43),
    # after the committed default runs (whose random-feature arms sit at 4,100-4,300): it
    # changes no number and can only turn a verdict into "not tested".
    config.trained_check = trained_check(
        "test_perplexity",
        reason="a language model no better than word frequencies has not learned to use its "
        "context",
        trivial="unigram_test_perplexity",
        trivial_name="the count unigram model",
    )
    # 3 epochs are not the paper's 80: the default cannot refute a claim.
    config.powered = variant == "paper"
    config.num_train_tokens = 0  # 0: all 929,589
    config.num_eval_tokens = 0  # per split (validation, test); 0: all
    config.bptt = 35  # tokens per training window (each window starts from a zero state)

    config.model = ml_collections.ConfigDict()
    config.model.hidden_size = 200
    config.model.num_layers = 2
    config.model.dropout_rate = 0.5
    config.model.initial_logit_scale = 10.0  # s at initialisation, cosine logits only

    config.sampler = ml_collections.ConfigDict()
    config.sampler.name = "clipped"  # or "decomposition" (the fast |.| mixture)
    config.sampler.uniform_floor = 0.01  # eps of the clipped sampler
    config.sampler.num_samples = 40  # negatives per query (HRF App. I.1)
    # iid rows on CPU: the orthogonal coupling's QR costs more than the rest of a step here.
    config.sampler.coupling = "gaussian"
    config.sampler.remove_accidental_hits = True
    # The proposal's tau in the "normalised" setting: "fixed" (config.tau; 1: the paper's
    # normalised embeddings) or "heldout_kl" (every step, the tau of config.tau_grid that
    # minimises KL(model softmax || kernel softmax) on the held-out batch).
    config.tau_rule = "fixed"
    config.tau = 1.0
    # tau candidates of "heldout_kl" and of the diagnostic (exp(1/tau) must stay finite in
    # float32).
    config.tau_grid = tuple(float(t) for t in np.geomspace(0.0125, 2.0, 23))
    config.num_heldout_windows = 4  # the last validation windows select tau

    # Distribution metrics on every trained model: its queries at the first validation
    # positions, every estimator on the same queries and (per draw) the same key.
    config.num_metric_queries = 2_048
    config.num_metric_draws = 16
    config.metric_query_chunk = 512  # queries per metric batch (memory: chunk x vocabulary)
    # Diagnostic of the proposals as importance samplers (KL(model softmax || proposal)) at the
    # proposal's tau and at the held-out KL tau, on the exact-proposal models.
    config.num_diagnostic_queries = 512
    config.num_diagnostic_draws = 4

    config.num_curve_tokens = 10_000  # validation tokens evaluated during training
    config.eval_batch_size = 50  # windows per eval batch
    # JAX persistent compilation cache (relative to the workdir; "" disables): the seeds of an
    # arm share their executables.
    config.compilation_cache_dir = "jax_cache"
    config.train = train_config()
    config.train.num_train_steps = 3 * (TRAIN_WINDOWS // 20)  # 3 epochs
    config.train.batch_size = 20
    config.train.optimizer = "adam"
    config.train.learning_rate = 3e-3
    config.train.lr_schedule = "cosine"
    config.train.warmup_steps = 100
    config.train.grad_clip_norm = 0.5
    config.train.log_every_steps = 50
    config.train.eval_every_steps = 500
    config.train.checkpoint_every_steps = 500

    if variant is None:  # the variant that tests what the default's untrained arms cannot
        config.follow_up = "sharp_tau"
    if variant == "kl_tau":
        config.tau_rule = "heldout_kl"
    elif variant == "sharp_tau":
        # Declared on 2026-11-28 (issue 43), before its runs: can the random-feature proposals
        # of claim (2) train in the paper's setting at a temperature where the kernel softmax
        # is far from uniform? tau = 0.1, the held-out-KL optimum of the committed default's
        # exact-proposal models (0.0997; there the kernel softmax is closest to the trained
        # model's softmax: KL 0.30 nats, 2.92 at tau = 1). A pilot of 400 steps (seed 0; not
        # committed) trained FAVOR+ to test perplexity 16,729 at tau = 1 (the check),
        # 3,753 at 0.5, 1,002 at 0.2 and 855 at 0.1, the trigonometric proposal to 3,187 at
        # 0.5; the cosine-logit setting (Rawat et al.) was not better (FAVOR+ validation NLL
        # 7.61 at step 200, 7.16 at tau = 0.1); the count unigram proposal reaches 509 in 400
        # steps (the issue's check). At tau = 0.1 the signed estimators' noise grows like
        # e^(1/tau) (the default's diagnostic: half of their estimates negative). A probe, not
        # a test: one epoch (1,327 steps) of the three random-feature arms on one seed (one
        # such run took about 45 min at the shared machine's load of 12-14): an arm that fails
        # the training check in it cannot enter claim (2) in this setting; if all pass, claim
        # (2) needs paired seeds, and the summary says so. Not powered.
        config.tau = 0.1
        config.arms = (
            "normalised:favor+",
            "normalised:angular",
            "normalised:trigonometric",
        )
        config.seeds = (0,)
        config.train.num_train_steps = TRAIN_WINDOWS // 20  # 1 epoch
    elif variant == "sharp_tau_paired":
        # Declared on 2026-11-28 (issue 43), before its runs: our target claim
        # (favor_within_20) in the setting where FAVOR+ passed the training check (the
        # sharp_tau probe: test perplexity 605 against the unigram model's 640). The probe's
        # setting (tau = 0.1, one epoch), FAVOR+ and the exact proposal paired by seed, 3
        # seeds; the test and margin are the default's (ratio - 1 non-superior to 0.2, paired
        # by seed). One epoch is not the paper's 80: not powered, so the target reads "holds"
        # or "not resolved", never "does not hold".
        config.tau = 0.1
        config.arms = ("normalised:exact", "normalised:favor+")
        config.train.num_train_steps = TRAIN_WINDOWS // 20  # 1 epoch
    elif variant == "mid_tau":
        # Declared on 2026-11-28 (issue 43), before its runs, after a one-seed, one-epoch scan
        # of the angular hybrid's temperature (experiments/lstm_lm/design.md: test perplexity
        # 950 at tau = 0.2, 639 at 0.3, 879 at 0.4, 1,397 at 0.5; the unigram model 640): claim
        # (2) at the scan's best temperature, the sharp_tau probe's three random-feature arms on
        # 3 paired seeds, one epoch. An arm that fails the training check makes claim (2) "not
        # tested" here too. Not powered (one epoch is not the paper's 80).
        config.tau = 0.3
        config.arms = (
            "normalised:favor+",
            "normalised:angular",
            "normalised:trigonometric",
        )
        config.train.num_train_steps = TRAIN_WINDOWS // 20  # 1 epoch
    elif variant == "equal_width":
        config.arms = tuple(a.replace(":angular", ":angular_eqW") for a in config.arms)
        config.hybrid_estimators = tuple(EQUAL_WIDTH)
    elif variant == "quick":
        # One arm: the signed clipped proposal; its models also serve the metrics.
        config.arms = ("normalised:angular",)
        config.estimators = _estimators(8, (8, 2), (8, 1), angular_eqW=("angular_hybrid", 2, 1))
        config.seeds = (0,)
        config.model.num_layers = 1
        config.num_train_tokens = 3_000
        config.num_eval_tokens = 600
        config.bptt = 12
        config.model.hidden_size = 16
        config.model.dropout_rate = 0.0
        config.num_heldout_windows = 2
        config.tau_grid = (0.05, 0.2, 1.0)
        config.num_metric_queries = 24
        config.num_metric_draws = 2
        config.metric_query_chunk = 12
        config.num_diagnostic_queries = 12
        config.num_diagnostic_draws = 2
        config.num_curve_tokens = 600
        config.eval_batch_size = 25
        config.compilation_cache_dir = ""
        config.train.num_train_steps = 20
        config.train.batch_size = 16
        config.train.learning_rate = 1e-2
        config.train.warmup_steps = 3
        config.train.log_every_steps = 5
        config.train.eval_every_steps = 10
        config.train.checkpoint_every_steps = 20
    elif variant == "paper":
        config.arms = tuple(
            f"normalised:{estimator}"
            for estimator in (
                "exact",
                "uniform",
                "unigram",
                "favor+",
                "trigonometric",
                "angular",
                "gaussian",
            )
        )
        # 1024 random features (width 1024: 512 antithetic pairs, 1024 trigonometric
        # features); the hybrids keep the 512 base projections.
        config.estimators = _estimators(512, (512, 8), (512, 4))
        config.seeds = tuple(range(25))
        config.baseline_seeds = config.seeds
        config.sampler.coupling = "orthogonal"
        config.train.num_train_steps = 80 * (TRAIN_WINDOWS // 20)  # 80 epochs
        config.train.warmup_steps = 500
        config.train.log_every_steps = 500
        config.train.eval_every_steps = 5_000
        config.train.checkpoint_every_steps = 5_000
    return apply_overrides(config, arg)
