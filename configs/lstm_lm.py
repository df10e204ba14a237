"""LSTM language model on Penn Treebank trained with random-feature sampled softmax (HRF Sec. 4.2).

Command:
  python -m experiments.main --config=configs/lstm_lm.py           # default: 18 min, 2 CPU cores
  python -m experiments.main --config=configs/lstm_lm.py:small     # ~10 min on 2 CPU cores
  python -m experiments.main --config=configs/lstm_lm.py:quick     # seconds (smoke test)
  python -m experiments.main --config=configs/lstm_lm.py:paper     # accelerator (HRF App. I sizes)

A 2-layer LSTM (hidden 200, tied embeddings) is trained for every proposal in ``proposals``
(FAVOR+ ``positive``, ``trigonometric``, ``angular_hybrid``, ``gaussian_hybrid``, ``uniform``,
``exact``) and seed in ``seeds`` with 40 sampled negatives per query; proposals come from the
softmax kernel exp(q_bar.e_bar / tau) of the normalised vectors (``sampler.temperature`` = tau),
the loss uses the un-normalised logits (HRF App. I.1, Rawat et al. 2019). Reported per
proposal: validation and test perplexity under the full softmax, and the 1-Wasserstein / KS
distances and negative-estimate fraction of its random-feature estimate of the proposal softmax
(HRF Fig. 3, Table 4), mean ± std over seeds.

Default sizes (CPU): first 100k training tokens, BPTT 35, batch 20, 600 steps (about 4.2
epochs of the truncated set), first 10k validation / test tokens, 3 seeds, m = 128 iid random
features (width 256) for FAVOR+/trigonometric, hybrids with m = 8 base and n = 8 coefficient
rows (widths 288 / 544); the 18 runs took 18 min on 2 idle cores (the committed
``results/lstm_lm``; valid perplexity: exact 605, FAVOR+ 5238, the others 3e4-5e4).
``small``: 30k training tokens, 100 steps, 3.5k eval
tokens, 2 seeds; 11 min on the shared, heavily loaded 2-core machine. Measured there (valid
perplexity, mean over 2 seeds): exact 1046, FAVOR+ 6567, angular hybrid 1.4e5, Gaussian hybrid
2.1e5, trigonometric 3.8e5, uniform 3.7e5; W1 of the proposal estimate: FAVOR+ 0.0043,
angular hybrid 0.035, Gaussian hybrid 0.062, uniform 0.075, trigonometric 0.25. After so little
training, sampled softmax with a flat proposal leaves the full-softmax perplexity above the
vocabulary size; the signed proposals sample the |.| mixture of their features (see
``rfjax.nn.sample_from_features``), which is close to flat, so they train like uniform.
``paper``: all 929k training tokens, 80 epochs, full validation/test, 1024 random features,
25 seeds (HRF App. I.1).
"""

import ml_collections

from configs.common import apply_overrides, parse_variant
from configs.training import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick", "small", "paper"))
    config = ml_collections.ConfigDict()
    config.experiment = "lstm_lm"
    config.variant = variant or "default"  # named in the summary
    # The sweep: each entry one of rfjax.nn.PROPOSALS.
    config.proposals = (
        "positive",
        "trigonometric",
        "angular_hybrid",
        "gaussian_hybrid",
        "uniform",
        "exact",
    )
    config.seeds = (0, 1, 2)
    config.num_train_tokens = 100_000  # 0: all 929,589
    config.num_eval_tokens = 10_000  # per split (validation, test); 0: all
    config.bptt = 35  # tokens per training window (each window starts from a zero state)

    config.model = ml_collections.ConfigDict()
    config.model.hidden_size = 200
    config.model.num_layers = 2
    config.model.dropout_rate = 0.5

    config.sampler = ml_collections.ConfigDict()
    config.sampler.num_samples = 40  # negatives per query (HRF App. I.1)
    config.sampler.temperature = 0.5  # tau of the proposal kernel exp(q_bar.e_bar / tau)
    config.sampler.num_features = 128  # m for positive / trigonometric (width 2m = 256)
    config.sampler.hybrid_num_features = 8  # m of the hybrids' shared base projection
    config.sampler.num_coefficient_features = 8  # n of the hybrids' coefficient
    # iid rows on CPU: the orthogonal coupling's QR costs more than the rest of a step here.
    config.sampler.coupling = "gaussian"
    config.sampler.remove_accidental_hits = True

    # Distribution metrics: queries of the trained model on validation text.
    config.num_metric_queries = 256
    config.num_metric_draws = 4  # independent feature draws averaged per run

    config.eval_batch_size = 50  # windows per eval batch
    # JAX persistent compilation cache (relative to the workdir; "" disables): the seeds of a
    # proposal share their executables.
    config.compilation_cache_dir = "jax_cache"
    config.train = train_config()
    config.train.num_train_steps = 600
    config.train.batch_size = 20
    config.train.optimizer = "adam"
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 50
    config.train.grad_clip_norm = 0.5
    config.train.log_every_steps = 50
    config.train.eval_every_steps = 200
    config.train.checkpoint_every_steps = 200

    if variant == "quick":
        config.proposals = ("angular_hybrid",)  # the signed, two-sided feature path
        config.seeds = (0,)
        config.model.num_layers = 1
        config.num_train_tokens = 6_000
        config.num_eval_tokens = 600
        config.bptt = 12
        config.model.hidden_size = 24
        config.model.dropout_rate = 0.0
        config.sampler.num_features = 16
        config.sampler.hybrid_num_features = 4
        config.sampler.num_coefficient_features = 2
        config.num_metric_queries = 32
        config.num_metric_draws = 2
        config.eval_batch_size = 25
        config.compilation_cache_dir = ""
        config.train.num_train_steps = 30
        config.train.batch_size = 16
        config.train.learning_rate = 1e-2
        config.train.warmup_steps = 3
        config.train.log_every_steps = 5
        config.train.eval_every_steps = 0
        config.train.checkpoint_every_steps = 30
    elif variant == "small":
        config.seeds = (0, 1)
        config.num_train_tokens = 30_000
        config.num_eval_tokens = 3_500
        config.num_metric_draws = 2
        config.train.num_train_steps = 100
        config.train.warmup_steps = 10
        config.train.log_every_steps = 20
        config.train.eval_every_steps = 50
        config.train.checkpoint_every_steps = 100
    elif variant == "paper":
        config.seeds = tuple(range(25))
        config.num_train_tokens = 0
        config.num_eval_tokens = 0
        config.sampler.hybrid_num_features = 64
        config.sampler.num_coefficient_features = 16
        config.sampler.num_features = 512  # width 1024 (HRF App. I.1)
        config.sampler.coupling = "orthogonal"
        config.num_metric_queries = 2_048
        config.num_metric_draws = 8
        config.train.num_train_steps = 80 * (929_589 // (20 * 35))  # 80 epochs
        config.train.warmup_steps = 500
        config.train.lr_schedule = "cosine"
        config.train.log_every_steps = 500
        config.train.eval_every_steps = 5_000
        config.train.checkpoint_every_steps = 5_000
    return apply_overrides(config, arg)
