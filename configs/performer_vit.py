"""Performer-ViT on Fashion-MNIST: SimRF vs ORF Performers (and exact softmax) by test accuracy.

Command (Fashion-MNIST from --config.data_dir=<folder>, $RFJAX_FASHION_MNIST_DIR or the Debian
package dataset-fashion-mnist):
  python -m experiments.main --config=configs/performer_vit.py --workdir=results/performer_vit
  python -m experiments.main --config=configs/performer_vit.py:short \
      --workdir=results/performer_vit_short    # the earlier 1,000-step design (below)
  python -m experiments.main --config=configs/performer_vit.py:quick    # seconds (tests)
  python -m experiments.main --config=configs/performer_vit.py:paper    # accelerator, days

Trains, per paired seed (same initialisation and batch order for every variant), one Performer
per (projection protocol, coupling) and, on the first ``num_reference_seeds``, the references
(``reference_attentions``), with the shared trainer (``experiments.core.train.trainer``:
resumable, data parallel over all devices). Protocols: ``fixed`` (one projection per run) and
``redraw`` (redrawn every ``model.redraw_interval`` steps until ``redraw_until_step``, then
kept). Performers are evaluated over ``num_eval_draws`` fresh projections; paired differences
over seeds, and the attention-matrix error of each coupling on every trained model's queries and
keys (see ``experiments/performer_vit/``).

Paper: SimRF (Reid et al., ICML 2023, arXiv:2301.13856), Sec. 5.4: SimRF-Performers beat
ORF-Performers, never worse. Default: a Performer that approximates softmax attention (queries
and keys normalised, ``model.query_key_norm``; features redrawn at every step to the end,
``redraw_interval`` 1; 10,000 steps; m = 32 features per head of dimension 16, the paper's
m / d ~ 2). Why, and what the earlier 1,000-step design showed:
``experiments/performer_vit/design.md``.

Primary metric: accuracy averaged over ``num_eval_draws`` fresh projections (the expected
accuracy of the random-feature model; ``primary_metric``). Seeds: 10 paired seeds of ORF and
SimRF; exact softmax (the same normalised model) on the first 2, as the accuracy the Performers
approximate. Power: the committed 1,000-step design's paired SimRF - ORF spread (sd 0.0046,
redraw protocol) gives non-inferiority at the 0.005 margin with 80% power at 9 paired seeds
(``experiments.core.stats.units_for_power``, the paired t test's power; its normal approximation
said 7), 10 seeds about 86%; the summary recomputes it from the measured spread.

Variants: ``short``, the earlier 1,000-step design (2 layers, width 32, m = 32, raw scores,
protocols fixed and redraw-to-step-500, IID/ORF/SimRF/exact; results/performer_vit_short; not
powered); ``small``, ``short`` with fewer seeds (the model ``configs/performer_vit_maps.py``
trains); ``quick``, the default's protocol at toy size (the test suite); ``paper``, the paper's
ViT for an accelerator. Cost of the default: 22 runs of 10,000 steps, about 5-8 min each on 2
shared CPU cores (measured times in the summary).
"""

import ml_collections
from ml_collections import config_dict

from configs.common import apply_overrides, claim, parse_variant, trained_check
from configs.training import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick", "short", "small", "paper"))
    config = _short_design(variant)
    if variant in (None, "quick", "paper"):
        _approximating_design(config)
    if variant == "quick":
        toy_size(config)
    elif variant == "small":
        config.num_seeds = ml_collections.ConfigDict({"fixed": 6, "redraw": 6})
        config.num_reference_seeds = 1
    elif variant == "paper":
        _paper(config)
    return apply_overrides(config, arg)


def _short_design(variant: str | None) -> ml_collections.ConfigDict:
    """The earlier default (variant ``short``): raw scores, protocols fixed and
    redraw-to-step-500, 1,000 steps, IID/ORF/SimRF on 15 seeds per protocol, exact and IID on 5."""
    config = ml_collections.ConfigDict()
    config.experiment = "performer_vit"
    config.variant = variant or "default"  # named in the summary
    # The four idx .gz files; None: $RFJAX_FASHION_MNIST_DIR, else the Debian package's folder.
    config.data_dir = config_dict.placeholder(str)
    config.num_train_examples = 0  # 0: all 60,000
    config.num_test_examples = 0  # 0: all 10,000 (learning curve and final accuracy)
    # "exact" or a coupling name (a Performer with that coupling; see rfjax.projections).
    config.attentions = ("exact", "gaussian", "orthogonal", "simplex")
    config.protocols = ("fixed", "redraw")  # see experiments/performer_vit/
    config.redraw_until_step = 500  # last redraw (protocol "redraw")
    # Seeds 0..n-1 per protocol for ORF and SimRF, sized so that target_difference is 3 SE of
    # the paired SimRF - ORF difference (power estimate from the first seeds: see the summary);
    # the references (exact attention, IID) train on the first num_reference_seeds.
    config.num_seeds = ml_collections.ConfigDict({"fixed": 15, "redraw": 15})
    config.reference_attentions = ("exact", "gaussian")
    config.num_reference_seeds = 5
    config.target_difference = 0.005  # the paper's SimRF - ORF gain, to be resolved at 3 SE
    # Accuracy claims are refuted beyond the paper's gain (half a point), the attention error
    # claim beyond 0.005 of relative error.
    config.claims = ml_collections.ConfigDict(
        {
            "simrf_beats_orf": claim(
                "The SimRF-Performer beats the ORF-Performer (SimRF Sec. 5.4, Fig. 9)",
                "greater",
                margin=0.005,
            ),
            "simrf_never_worse": claim(
                "The SimRF-Performer is never worse than the ORF-Performer (SimRF Sec. 5.4)",
                "noninferior",
                margin=0.005,
            ),
            "orf_beats_iid": claim(
                "The ORF-Performer beats the IID-Performer (Performers use ORFs because they "
                "estimate the kernel better, Choromanski et al. 2020; SimRF Sec. 1)",
                "greater",
                margin=0.005,
            ),
            "attention_error": claim(
                "Mechanism: lower kernel MSE gives a more accurate attention matrix (SimRF Sec. "
                "3-4): SimRF's attention matrix is more accurate than ORF's on the trained "
                "queries and keys",
                "less",
                margin=0.005,
            ),
            # Declared before any run of the default finished (issue 30's check that the
            # model is not a co-adapted random layer): refuted beyond 1 point.
            "random_feature_model": claim(
                "Design check: the trained Performers are random-feature models of softmax "
                "attention, not random layers co-adapted to one projection: their accuracy "
                "with fresh projections is within 1 point of that with their own (issue 30)",
                "nonsuperior",
                margin=0.01,
            ),
        }
    )
    # Did each run's model train and use its attention? The task's trivial model is the same
    # model with uniform attention swapped in at inference (every learned temperature at e^-30,
    # or, without cosine scores, the query and key projections at 0: all scores equal); a run
    # whose test accuracy is not above it by the claims' margin (half a point) in every seed
    # does not use its attention, so no claim about attention estimators can rest on it.
    # Declared on 2026-11-28 (issue 43), after the committed runs of results/performer_vit*,
    # which do not hold the swap: it changes no number, and their claims are "not tested"
    # until a rerun measures it.
    config.trained_check = trained_check(
        "accuracy_own",
        reason="a model that uniform attention serves as well does not use its attention",
        trivial="accuracy_uniform_attention",
        trivial_name="the same model with uniform attention",
        margin=0.005,
        better="higher",
    )
    # quick: a smoke test; short and small: undertrained (accuracy still rising at step 1,000)
    # and co-adapted to their projections, so they cannot refute a claim.
    config.powered = variant in (None, "paper")
    config.num_eval_draws = 10  # fresh projections per Performer at the final evaluation
    config.num_attention_images = 128
    config.num_attention_draws = 20
    config.eval_seed = 1234
    config.eval_batch_size = 500
    # JAX persistent compilation cache (relative to the workdir; "" disables): the runs of one
    # variant share their executables, saving the compile time of every seed after the first.
    config.compilation_cache_dir = "jax_cache"

    config.model = ml_collections.ConfigDict()
    config.model.patch_size = 7
    config.model.hidden_size = 32
    config.model.num_layers = 2
    config.model.num_heads = 2
    config.model.mlp_dim = 64
    config.model.dropout_rate = 0.0
    config.model.pooling = "cls"
    config.model.representation_size = None
    config.model.num_features = 32  # m per head (head dim H = 16)
    config.model.feature_map = "positive"
    config.model.redraw_interval = 100

    config.train = train_config()
    config.train.num_train_steps = 1_000
    config.train.batch_size = 128
    config.train.learning_rate = 2e-3
    config.train.warmup_steps = 100
    config.train.log_every_steps = 100
    config.train.eval_every_steps = 250
    config.train.checkpoint_every_steps = 500

    return config


def _approximating_design(config: ml_collections.ConfigDict) -> None:
    """The default: a Performer that approximates softmax attention (see the module doc)."""
    config.attentions = ("exact", "orthogonal", "simplex")
    config.protocols = ("redraw",)
    config.num_seeds = ml_collections.ConfigDict({"redraw": 10})
    config.reference_attentions = ("exact",)
    config.num_reference_seeds = 2
    config.model.query_key_norm = True  # cosine scores, learned per-head temperature
    config.model.initial_temperature = 1.0
    config.model.redraw_interval = 1  # a new projection at every step...
    config.train.num_train_steps = 10_000
    config.redraw_until_step = config.train.num_train_steps - 1  # ...to the last one
    config.train.warmup_steps = 500
    config.train.log_every_steps = 500
    config.train.eval_every_steps = 1_000
    config.train.checkpoint_every_steps = 2_000


def toy_size(config: ml_collections.ConfigDict) -> None:
    """``config``'s design at toy size, seconds (the test suite): the ``quick`` variant of the
    default, and of ``configs/performer_vit_maps.py``'s ``small`` design."""
    config.num_train_examples = 256
    config.num_test_examples = 128
    config.attentions = ("orthogonal", "simplex")
    config.num_seeds = ml_collections.ConfigDict({"redraw": 2})
    config.reference_attentions = ()
    config.num_reference_seeds = 0
    config.num_eval_draws = 2
    config.num_attention_images = 8
    config.num_attention_draws = 4
    config.eval_batch_size = 128
    config.model.hidden_size = 16
    config.model.num_layers = 1
    config.model.mlp_dim = 32
    config.model.num_features = 8
    config.train.num_train_steps = 12
    config.redraw_until_step = config.train.num_train_steps - 1
    config.train.batch_size = 32
    config.train.warmup_steps = 2
    config.train.log_every_steps = 6
    config.train.eval_every_steps = 6
    config.train.checkpoint_every_steps = 12


def _paper(config: ml_collections.ConfigDict) -> None:
    """The paper's ViT (SimRF Sec. 5.4: 12 layers, 12 heads, mlp 3072, dropout 0.1, 130
    features per head) with the default's protocol, for an accelerator."""
    config.num_seeds = ml_collections.ConfigDict({"redraw": 10})
    config.num_reference_seeds = 2
    config.model.patch_size = 4
    config.model.hidden_size = 768
    config.model.num_layers = 12
    config.model.num_heads = 12
    config.model.mlp_dim = 3072
    config.model.dropout_rate = 0.1
    config.model.num_features = 130
    config.train.num_train_steps = 20_000
    config.redraw_until_step = config.train.num_train_steps - 1
    config.train.batch_size = 256
    config.train.learning_rate = 3e-4
    config.train.warmup_steps = 1_000
    config.train.weight_decay = 0.05
    config.train.log_every_steps = 200
    config.train.eval_every_steps = 2_000
    config.train.checkpoint_every_steps = 1_000
