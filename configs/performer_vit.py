"""Performer-ViT on Fashion-MNIST: exact softmax vs Performers with IID, ORF and SimRF features.

Command (Fashion-MNIST from --config.data_dir=<folder>, $RFJAX_FASHION_MNIST_DIR or the Debian
package dataset-fashion-mnist):
  python -m experiments.main --config=configs/performer_vit.py --workdir=results/performer_vit
  python -m experiments.main --config=configs/performer_vit.py:small --workdir=results/performer_vit
  python -m experiments.main --config=configs/performer_vit.py:quick    # seconds (tests)
  python -m experiments.main --config=configs/performer_vit.py:paper    # accelerator, days

Trains, per paired seed (same initialisation and batch order for every variant), one exact ViT
and one Performer per (projection protocol, coupling) with the shared trainer
(``experiments.core.train.trainer``: resumable, data parallel over all devices). Protocols:
``fixed`` (one projection per run) and ``redraw`` (redrawn every ``model.redraw_interval`` steps
until ``redraw_until_step``, then kept for the remaining steps). Performers are evaluated over
``num_eval_draws`` fresh projections; paired differences over seeds with 95% intervals, and the
attention-matrix error of each coupling on the trained queries and keys (see
``experiments/performer_vit/``).

Claim (SimRF paper arXiv:2301.13856, Sec. 5.4): the SimRF-Performer beats the ORF-Performer
(+0.5% on one data set), which beats IID. The seeds are sized so that 0.5% is 3 SE of the paired
SimRF - ORF difference (power estimate in results/performer_vit/summary.md).

Cost: the default's 75 runs (exact 5, IID 5 + 5, ORF and SimRF 15 + 15 each) take about an hour
on 2 CPU cores. ``small`` keeps the default's model, data and schedule and both protocols, with
ORF and SimRF on 6 paired seeds per protocol and exact attention and IID on seed 0 only. The
claims and their tests are declared below; the measured numbers and verdicts are in
results/performer_vit/summary.md.
"""

import ml_collections
from ml_collections import config_dict

from configs.common import apply_overrides, claim, parse_variant
from configs.training import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick", "small", "paper"))
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
                "The ORF-Performer beats the IID-Performer (Choromanski et al. 2020)",
                "greater",
                margin=0.005,
            ),
            "attention_error": claim(
                "SimRF's attention matrix is more accurate than ORF's on the trained queries "
                "and keys (SimRF Sec. 3-4)",
                "less",
                margin=0.005,
            ),
        }
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
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

    if variant == "quick":
        config.num_train_examples = 256
        config.num_test_examples = 128
        config.attentions = ("orthogonal", "simplex")
        config.protocols = ("fixed",)  # the redraw schedule is tested without training
        config.redraw_until_step = 8
        config.num_seeds = ml_collections.ConfigDict({"fixed": 2})
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
        config.model.redraw_interval = 4
        config.train.num_train_steps = 12
        config.train.batch_size = 32
        config.train.warmup_steps = 2
        config.train.log_every_steps = 6
        config.train.eval_every_steps = 6
        config.train.checkpoint_every_steps = 12
    elif variant == "small":
        config.num_seeds = ml_collections.ConfigDict({"fixed": 6, "redraw": 6})
        config.num_reference_seeds = 1
    elif variant == "paper":
        config.num_seeds = ml_collections.ConfigDict({"fixed": 5, "redraw": 5})
        config.num_reference_seeds = 5
        config.redraw_until_step = 12_000
        config.model.patch_size = 4
        config.model.hidden_size = 768
        config.model.num_layers = 12
        config.model.num_heads = 12
        config.model.mlp_dim = 3072
        config.model.dropout_rate = 0.1
        config.model.num_features = 130
        config.model.redraw_interval = 1_000
        config.train.num_train_steps = 20_000
        config.train.batch_size = 256
        config.train.learning_rate = 3e-4
        config.train.warmup_steps = 1_000
        config.train.weight_decay = 0.05
        config.train.log_every_steps = 200
        config.train.eval_every_steps = 2_000
        config.train.checkpoint_every_steps = 1_000
    return apply_overrides(config, arg)
