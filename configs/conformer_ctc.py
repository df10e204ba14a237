"""Conformer-Performer with CTC on FSDD digit strings: digit error rate per attention kind.

Command (the FSDD recordings/ folder from --config.data_dir=<folder> or $RFJAX_FSDD_DIR):
  python -m experiments.main --config=configs/conformer_ctc.py --workdir=results/conformer_ctc
  python -m experiments.main --config=configs/conformer_ctc.py:quick    # ~2 min (compile-bound)
  python -m experiments.main --config=configs/conformer_ctc.py:attention_context \
      --workdir=results/conformer_ctc_attention_context    # convolution kernel 1 (below)
  python -m experiments.main --config=configs/conformer_ctc.py:attention_context_tau1 \
      --workdir=results/conformer_ctc_attention_context_tau1    # and initial temperature 1
  python -m experiments.main --config=configs/conformer_ctc.py:attention_context_tau2 \
      --workdir=results/conformer_ctc_attention_context_tau2    # and initial temperature 2
  python -m experiments.main --config=configs/conformer_ctc.py:paper    # accelerator

HRF paper (arXiv:2110.04367) Sec. 4.3 / App. J / Table 2 analogue (see
``experiments/conformer_ctc/``): one ConformerEncoder per attention kind (exact, FAVOR+,
trigonometric, angular hybrid, cluster hybrid) and paired seed, trained with CTC on utterances
of 10-12 concatenated Free Spoken Digit Dataset recordings; the test set is the held-out
recordings (index >= 40) of the training speakers. Attention starts peaked (cosine scores, a
learned per-head temperature initialised at 8) and the convolutions are short (kernel 3), so
that long-range context must come from attention. Gate: FAVOR+ - exact over 5 paired seeds
first; the hybrids' ordering against FAVOR+ is tested only if that difference is significant.
Paper's claim: hybrids <= FAVOR+ / trigonometric in error (its WER values were lost in the
seed's extraction).

``attention_context`` sets the convolution kernel to 1, so that attention is the only mixing
across frames, and tests the paper's orderings without the gate on 10 paired seeds (see the
variant below). The claims, their tests and the check that each attention kind trained
(``trained_check``: a claim using a kind that fails it is not tested) are declared below; the
measured numbers and verdicts are in results/conformer_ctc*/summary.md.
"""

import ml_collections
from ml_collections import config_dict

from configs.common import apply_overrides, claim, parse_variant, trained_check
from configs.training import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(
        arg,
        (
            "quick",
            "attention_context",
            "attention_context_tau1",
            "attention_context_tau2",
            "paper",
        ),
    )
    config = ml_collections.ConfigDict()
    config.experiment = "conformer_ctc"
    config.label = variant or "default"
    config.data_dir = config_dict.placeholder(str)  # FSDD recordings/; None: $RFJAX_FSDD_DIR
    # "recordings": test utterances are new recordings (index >= first_test_index) of the
    # training speakers; "speakers": whole speakers (test_speakers) are held out.
    config.split = "recordings"
    config.first_test_index = 40  # of 0..49 per speaker and digit: 20% of the recordings
    config.test_speakers = ("theo",)  # split = "speakers" only
    config.num_train_utterances = 2_000
    config.num_test_utterances = 300
    config.min_digits = 10
    config.max_digits = 12
    config.max_samples_per_digit = 4_500  # 0.56 s at 8 kHz (the median recording is 0.42 s)
    config.num_mels = 40
    config.data_seed = 0
    config.attentions = ("exact", "positive", "trigonometric", "angular_hybrid", "cluster_hybrid")
    config.seeds = (0, 1, 2, 3, 4)  # paired across kinds
    # The paper (HRF Sec. 4.3): "HRFs produce smallest WER models and the clustering-based
    # variants [...] turn out to be the best." Each ordering is refuted if the claimed-better
    # side's error is above the other's by more than half a point of DER.
    config.claims = ml_collections.ConfigDict(
        {
            "hybrid_ordering": claim(
                "Hybrid random features give a lower error than FAVOR+ (HRF Sec. 4.3, Table 2: "
                "'HRFs produce smallest WER models')",
                "greater",
                margin=0.005,
            ),
            "hybrids_beat_trigonometric": claim(
                "Hybrid random features give a lower error than trigonometric features (HRF "
                "Sec. 4.3, Table 2: 'HRFs produce smallest WER models')",
                "greater",
                margin=0.005,
            ),
            "cluster_best": claim(
                "The clustering-based HRF gives a lower error than the angular HRF (HRF Sec. "
                "4.3, Table 2: 'the clustering-based variants fully exercising the most general "
                "formulation on HRFs (with general complex estimators) turn out to be the best')",
                "greater",
                margin=0.005,
            ),
        }
    )
    # Did each attention kind train, and does it use its attention? A claim whose test uses a
    # kind that fails this is "not tested". Every model first falls to the CTC loss's blank
    # plateau (train loss ~27 here, test DER 1.0: it emits blanks only) and then learns digits;
    # transcripts that ignore the audio score about 0.85 or more against references of 10-12
    # uniformly drawn digits (random 10-12-digit strings 0.87, the best fixed string a local
    # search found 0.85): a test DER below 0.5 in every seed means the model reads the digits.
    # The task's trivial model is the same model with uniform attention swapped in at inference
    # (every temperature at e^-30): a model whose DER it does not raise by at least the claims'
    # margin (0.005) in every seed does not use its attention, so no ordering of attention kinds
    # can be resolved at that margin on it. (A ratio of last to first logged train loss is no
    # test: the first log includes the fall to the blank plateau, e.g. 100 -> 27.5, that even a
    # model emitting blanks makes.) The limit was declared on 2026-11-27 and the uniform-
    # attention swap on 2026-11-28 (issue 43), both after the committed runs of
    # results/conformer_ctc* were trained, whose records hold the swap for the exact models
    # only: they change no number and can only turn a verdict into "not tested"; runs from then
    # on measure the swap for every kind.
    config.trained_check = trained_check(
        "digit_error_rate",
        limit=0.5,
        trivial="der_uniform_attention",
        trivial_name="the same model with uniform attention",
        margin=0.005,
        reason="a model at or above half an error per digit in some seed has not learned to read "
        "the digits (one that emits blanks only scores 1.0, transcripts that ignore the audio "
        "about 0.85 or more), and one that uniform attention serves as well does not use its "
        "attention",
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
    config.eval_batch_size = 100
    config.cluster_points = 512  # frames sampled for each k-means fit (cluster hybrid)
    config.num_swap_draws = 3  # FAVOR+ projection draws of the exact models' swap diagnostic
    # Train the other kinds only if exact and FAVOR+ differ significantly (paired t-test).
    config.gate_first = True
    config.compilation_cache_dir = "jax_cache"  # relative to the workdir; "" disables it

    config.model = ml_collections.ConfigDict()
    config.model.model_dim = 64
    config.model.num_layers = 2
    config.model.num_heads = 4  # head dim H = 16
    config.model.ff_expansion = 4
    config.model.kernel_size = 3  # short convolutions leave long-range context to attention
    config.model.dropout_rate = 0.1
    config.model.num_features = 16  # m per head
    config.model.num_sign_features = 4  # n (angular hybrid: width 4 m (n + 1))
    config.model.num_clusters = 2  # k query and k key clusters (cluster hybrid: width k^2 m)
    config.model.coupling = "orthogonal"
    config.model.redraw_interval = 100
    config.model.hybrid_eps = 1e-3
    config.model.query_key_norm = True  # cosine attention, learned temperature: every kind
    config.model.initial_temperature = 8.0  # peaked attention at initialisation

    config.train = train_config()
    config.train.optimizer = "adam"  # cluster centres are frozen variables: no weight decay
    config.train.num_train_steps = 500
    config.train.batch_size = 16
    config.train.learning_rate = 2e-3
    config.train.warmup_steps = 50
    config.train.log_every_steps = 50
    config.train.eval_every_steps = 100  # the test-DER curves
    config.train.checkpoint_every_steps = 250

    if variant == "quick":
        # Exact attention: its run also evaluates the swap diagnostic (uniform and FAVOR+).
        config.attentions = ("exact",)
        config.num_train_utterances = 64
        config.num_test_utterances = 16
        config.min_digits = 2
        config.max_digits = 3
        config.num_swap_draws = 1
        config.max_samples_per_digit = 3_000
        config.seeds = (0,)
        config.eval_batch_size = 16
        config.cluster_points = 64
        config.compilation_cache_dir = ""
        config.model.model_dim = 16
        config.model.num_layers = 1
        config.model.num_heads = 2
        config.model.ff_expansion = 2
        config.model.kernel_size = 5
        config.model.dropout_rate = 0.0
        config.model.num_features = 8
        config.model.num_sign_features = 2
        config.model.redraw_interval = 5
        config.train.num_train_steps = 12
        config.train.batch_size = 16
        config.train.learning_rate = 3e-3
        config.train.warmup_steps = 2
        config.train.log_every_steps = 4
        config.train.eval_every_steps = 6
        config.train.checkpoint_every_steps = 12
    elif variant in ("attention_context", "attention_context_tau1", "attention_context_tau2"):
        # The convolution module's kernel is 1: attention is the only mixing across frames
        # after the subsampling front end, so that the model must use it (the default's
        # exact models barely do). In the first, gated run of this variant (5 seeds of exact and
        # FAVOR+, commit 5adc4b4), swapping the trained exact models' attention for FAVOR+ at
        # inference cost +0.026 +- 0.006 DER, so the kind of attention matters to these models,
        # although FAVOR+ and exact models trained each with its own attention reached the same
        # DER (the gate, p = 0.95): the paper's ordering is a claim about models trained with
        # each kind, so it is tested directly, without the gate, on 10 paired seeds. Sized from
        # that run's FAVOR+ - exact spread (paired sd 0.0125): 10 seeds give SE ~0.004, so an
        # ordering of 0.01 DER is resolved (t ~ 2.5) and one of 0.005 reversed beyond the margin
        # would show as "does not hold" only if clear of 0.005 + 2.3 SE. The committed run
        # (results/conformer_ctc_attention_context: 50 runs, 73 min wall of training on 2
        # shared cores) trains exact, FAVOR+ and the cluster hybrid, but the trigonometric and
        # angular-hybrid kinds fail ``trained_check`` (they stay at the blank plateau), so
        # every ordering, each using one of them, is not tested there; its summary says what
        # would test them.
        config.model.kernel_size = 1
        config.seeds = tuple(range(10))
        config.gate_first = False
        if variant == "attention_context":  # what the summary names to test its open claims
            config.follow_up = "attention_context_tau1"
    if variant == "attention_context_tau1":
        # attention_context with the attention's initial temperature at 1 instead of 8, a
        # departure run beside it (named, not the default) so that every kind trains: at tau = 8
        # the trigonometric estimate of exp(tau q^.k^) for orthogonal unit q, k has a standard
        # deviation 527 times the kernel's value (m = 16), 0.42 times at tau = 1, and in
        # attention_context the trigonometric and angular-hybrid kinds never left the CTC blank
        # plateau. Declared on 2026-11-27 before its runs, after a one-seed pilot of those two
        # kinds (trigonometric seed 0 trained to test DER 0.118). Same claims, margins, seeds.
        config.model.initial_temperature = 1.0
    elif variant == "attention_context_tau2":
        # Declared on 2026-11-28 (issue 43), before its runs: a temperature between the two
        # committed ones, where both might hold. At tau = 8 (attention_context) the exact
        # models use their attention (uniform attention swapped in raises their DER by
        # +0.048 +- 0.009) but the trigonometric and angular-hybrid kinds never leave the
        # blank plateau (the trigonometric estimate's sd 527 times the kernel's value, m = 16);
        # at tau = 1 (attention_context_tau1) every kind trains (sd 0.42 times) but the exact
        # models do not use their attention (+0.0020 +- 0.0026, below the check's 0.005). At
        # tau = 2 the sd is 1.28 times the kernel's value. The paper's Conformer setting (HRF
        # App. J) states no temperature or query/key normalisation (its sizes were lost in
        # extraction), so it does not decide between them. A probe, not a test: the five kinds
        # on 3 paired seeds (15 runs; attention_context_tau1's 50 took 68 min at load 4): the
        # training check (every kind's uniform-attention swap, measured from now on) says which
        # kinds train and use their attention; not powered.
        config.model.initial_temperature = 2.0
        config.seeds = (0, 1, 2)
        config.powered = False
    elif variant == "paper":
        # HRF App. J sizes are partly lost in extraction; a larger Conformer for accelerators.
        config.num_train_utterances = 20_000
        config.num_test_utterances = 2_000
        config.max_samples_per_digit = 10_000
        config.seeds = (0, 1, 2, 3, 4)
        config.model.model_dim = 256
        config.model.num_layers = 8
        config.model.num_heads = 8  # H = 32
        config.model.kernel_size = 31
        config.model.num_features = 64
        config.model.num_sign_features = 8
        config.model.num_clusters = 3
        config.model.redraw_interval = 1_000
        config.train.num_train_steps = 20_000
        config.train.batch_size = 128
        config.train.learning_rate = 1e-3
        config.train.warmup_steps = 1_000
        config.train.log_every_steps = 200
        config.train.checkpoint_every_steps = 2_000
    return apply_overrides(config, arg)
