"""Implicit-attention policies trained by ES on MinAtar Breakout: exact vs FAVOR+ vs HRF.

Command:
  python -m experiments.main --config=configs/iap_es.py --workdir=results/iap_es
  python -m experiments.main --config=configs/iap_es.py:quick    # ~1.5 min CPU (compile-bound)
  python -m experiments.main --config=configs/iap_es.py:pair --workdir=results/iap_es_pair
  python -m experiments.main --config=configs/iap_es.py:paper    # accelerator scale

HRF paper (arXiv:2110.04367) Sec. 4.4 / App. K.1 / Fig. 4 analogue: an Implicit Attention Policy
(masking variant, arXiv:2102.04353) whose patch importance comes from exact softmax attention,
FAVOR+ (m = 256, the paper's baseline; m = 64, about the hybrid's FLOPs) or the angular hybrid
(8 x 8, the paper's HRF), trained by OpenAI-ES (evosax) on Pgx MinAtar Breakout; the paper
variant adds trigonometric features and the Gaussian hybrid (8 x 4, the angular hybrid's width).
Paper: the angular hybrid with 8 x 8 projections performs as well as FAVOR+ with 256, at about 3x
fewer FLOPs. Default: 4 kinds x 3 paired seeds, 150 generations of 64 members x 4 episodes.
Measured (committed results/iap_es/): 16-17 min of CPU time in all (compilation included; about
990 s: 3 x ~300 s for exact + FAVOR+ m=256 + angular hybrid per seed, 3 x ~48 s for FAVOR+
m=64), i.e. well under 45 min on 2 idle cores. On the shared machine (load average 20-26 on 2
cores, our processes niced) the same work took 81 min of wall time, run as 3-5 parallel
processes. Final returns (mean ± SE over the 3 seeds): FAVOR+ m=256 3.14 ± 0.91, angular hybrid
2.78 ± 0.77, FAVOR+ m=64 2.53 ± 0.51, exact 2.10 ± 0.69; the paired hybrid-minus-FAVOR+
difference -0.37 ± 1.65 is far inside the noise (80%-power detectable difference 8.9), so the
paper's equal-quality claim is neither shown nor refuted at 3 seeds: at this spread,
equivalence within 20% needs about 178 paired seeds (56 at the spread of the pair variant's
first 30 seeds). Rerun
bit-identically on 2026-11-24 (3 processes, one per seed: 14 min of wall time on 2 idle cores)
with the inference swap added (each of the 12 trained policies plays 256 episodes with every
kind's attention: 1.6 min): HRF 8x8 minus FAVOR+ m=256 played by the same policies = -0.091 ±
0.035, inside the 20% margin (±0.545) although resolved from 0: at inference the claim holds.

Variant ``pair``: the paper's pair only on 60 paired seeds (seeds 0-2 are the default's runs),
to measure the training-level difference with power. 60 was fixed before seeds 30-59 were run,
from the spread of the first 30 (which left it unresolved, -0.173 ± 0.284, and put
equivalence at about 56 seeds with 80% power); seeds 30-59 took 62 min of wall time as 3 niced
processes on 2 idle cores (176 min of run time summed), seeds 3-29 about 100 min, partly beside
the test suite (results/iap_es_pair, runs 0-29 reused from their records). Final returns
FAVOR+ m=256 3.023 ± 0.115, HRF 8x8 2.583 ± 0.141; paired HRF minus FAVOR+ **-0.441 ± 0.179**
(95% CI [-0.80, -0.08], p = 0.017, below the 0.0294 of a two-look Pocock bound for having
extended the sample after looking at 30 seeds; seeds 0-29 -0.173 ± 0.284, seeds 30-59
-0.709 ± 0.211): the hybrid-trained policies are worse, so equal quality in training does not
hold; whether the deficit exceeds the 20% margin (±0.605) is not resolved. At inference, over
the 120 trained policies, HRF minus FAVOR+ played by the same policy is -0.080 ± 0.012, inside
the margin (±0.571): the estimator swapped into a trained policy costs little, while policies
trained with the hybrid play worse with either attention (2.64 and 2.63 against 3.07 and 2.93
for FAVOR+-trained ones): the cost is in what ES learns from the noisier importance.
"""

import ml_collections

from configs.common import apply_overrides, parse_variant

PAIR_SEEDS = 60


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick", "paper", "pair"))
    config = ml_collections.ConfigDict()
    config.experiment = "iap_es"
    config.label = variant or "default"
    config.env = "minatar-breakout"  # Pgx id; 10 x 10 x 4 boolean images, 3 actions
    # The paper's pair, exact attention and FAVOR+ at about the hybrid's FLOPs (the control that
    # tells whether the attention estimate matters at all). The other kinds (trigonometric, the
    # Gaussian hybrid) are in the paper variant: on the shared 2 cores they did not fit.
    config.kinds = ("exact", "positive:256", "angular_hybrid:8x8", "positive:64")
    config.reference = "positive:256"  # the paper's baseline
    config.claim_kind = "angular_hybrid:8x8"  # the paper's HRF
    config.seeds = (0, 1, 2)
    config.max_steps = 500  # episodes are cut here
    config.final_evals = 3  # a run's quality: mean evaluation return of its last 3 evaluations
    # Top-k agreement with exact attention under each run's final policy: projections per run
    # on 1,024 frames of random-action episodes.
    config.agreement_draws = 8
    # The inference swap: each trained policy plays this many episodes with every kind's attention.
    config.inference_episodes = 256
    config.equivalence_margin = 0.2  # "equal quality": within 20% of the reference's return
    config.compilation_cache_dir = "jax_cache"  # relative to the workdir; "" disables it

    config.policy = ml_collections.ConfigDict()
    config.policy.patch_size = 2  # T = 25 patches of 2 x 2 x 4
    config.policy.num_kept = 5  # top-k patches kept by the mask
    config.policy.embed_dim = 8  # query/key width d
    config.policy.hidden_sizes = (16,)
    config.policy.coupling = "orthogonal"
    config.policy.temperature = 1.0
    config.policy.eps = 1e-6

    config.es = ml_collections.ConfigDict()
    config.es.population_size = 64  # 32 antithetic pairs
    config.es.sigma = 0.1
    config.es.learning_rate = 0.03  # Adam
    config.es.episodes_per_member = 4
    config.es.num_generations = 150
    config.es.eval_every = 10
    config.es.eval_episodes = 64
    config.es.log_every = 10
    config.es.checkpoint_every = 50
    config.es.keep_checkpoints = 1

    if variant == "quick":
        config.kinds = ("exact", "positive:16", "angular_hybrid:4x4")
        config.reference = "positive:16"
        config.claim_kind = "angular_hybrid:4x4"
        config.seeds = (0, 1)
        config.max_steps = 100
        config.final_evals = 1
        config.agreement_draws = 2
        config.inference_episodes = 8
        config.compilation_cache_dir = ""
        config.es.population_size = 16
        config.es.episodes_per_member = 2
        config.es.num_generations = 4
        config.es.eval_every = 2
        config.es.eval_episodes = 8
        config.es.log_every = 2
        config.es.checkpoint_every = 2
    elif variant == "pair":
        # The paper's pair only, on more paired seeds than the default's 3 (whose paired
        # differences are far inside the noise): PAIR_SEEDS was set from the power analysis of
        # the first 30; seeds 0-2 are the default's runs (same keys).
        config.kinds = (config.reference, config.claim_kind)
        config.seeds = tuple(range(PAIR_SEEDS))
    elif variant == "paper":
        config.kinds = (*config.kinds, "trigonometric:64", "gaussian_hybrid:8x4")
        # App. K.1's sizes were lost in extraction; pixel patches and a longer ES for accelerators.
        config.seeds = tuple(range(10))
        config.max_steps = 2_000
        config.final_evals = 5
        config.policy.patch_size = 1  # T = 100 pixels
        config.policy.num_kept = 10
        config.policy.embed_dim = 16
        config.policy.hidden_sizes = (32,)
        config.es.population_size = 256
        config.es.episodes_per_member = 8
        config.es.num_generations = 1_000
        config.es.eval_every = 20
        config.es.eval_episodes = 128
        config.es.log_every = 20
        config.es.checkpoint_every = 100
    return apply_overrides(config, arg)
