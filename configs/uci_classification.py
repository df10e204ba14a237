"""Nonparametric classification by kernel regression on eight UCI sets (SimRF Fig. 8, Tables 2-3).

Command:
  python -m experiments.main --config=configs/uci_classification.py \
      --workdir=results/uci_classification     # 2.3 min CPU; 6.5-10 min wall on 2 cores
                                               # shared with other jobs (load 8-16)
  python -m experiments.main --config=configs/uci_classification.py:reproduce  # the main job's
                                               # scale: all sets, 100 draws (nursery 40, chess 20)
  python -m experiments.main --config=configs/uci_classification.py:quick   # ~12 s CPU (tests)

Protocol of SimRF Sec. 5.3 / App. B (see experiments/uci_classification.py): fixed 95/5 split,
inputs standardised on the training split and multiplied by the paper's sigma, prediction
argmax_c sum_{j in c} K_hat(x, x_j) with Gaussian-kernel positive random features, m/d in
{1, 2, 4, 10}, IID / ORF / SimRF / SimRF+ and the exact kernel; Table 3: fast HD-product ORF
and SimRF against the regular ones on inputs padded to a power of two.

Repetitions: the paper uses 500 draws per point. The small sets get 500 here too; nursery
(12,312 training points, d = 27) and chess (26,653, d = 40) cost 5-10x more per draw than all
the others together, so they get 200 and 100 draws. All training and test points are used (no
subsampling). Compilation (one program per data set and input width) is a large part of the
CPU time; the "rbg" PRNG keeps it about 3x smaller than threefry.

Expected (results/uci_classification/summary.md): accuracy rises with m towards the exact
kernel's; averaged over the eight sets SimRF > ORF > IID at every m/d, by several SE, the gaps
shrinking as m grows (large on nursery, wifi and banknote, within noise on yeast, car, chess);
SimRF+ about equal to SimRF; fast couplings within noise of the regular ones.
"""

import ml_collections

from configs.common import apply_overrides, parse_variant
from rfjax.data import UCI_DATASETS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, allowed=("quick", "reproduce"))
    config = ml_collections.ConfigDict()
    config.experiment = "uci_classification"
    config.datasets = UCI_DATASETS
    config.data_dir = None  # None: the copies shipped in rfjax/data/uci
    config.categorical = "onehot"
    config.test_fraction = 0.05
    config.split_seed = 42
    config.ratios = (1, 2, 4, 10)  # m / d
    config.couplings = ("gaussian", "orthogonal", "simplex", "simplex_plus")
    config.table2_ratio = 1
    config.fast_couplings = ("gaussian", "orthogonal", "hd_orthogonal", "simplex", "fast_simplex")
    config.fast_ratios = (1, 4)  # m / p on inputs padded to p = 2^ceil(log2 d)
    config.repetitions = ml_collections.ConfigDict({name: 500 for name in UCI_DATASETS})
    config.repetitions.nursery = 200
    config.repetitions.chess = 100
    config.memory_mb = 512  # per vmapped chunk of draws (training features)
    config.seed = 0
    # JAX PRNG: "rbg" (XLA RngBitGenerator) compiles the vmapped samplers ~3x faster than the
    # default "threefry2x32"; both are sound, they give different (equally valid) draws.
    config.prng_impl = "rbg"
    if variant == "reproduce":  # the main job (experiments.reproduce): all sets, fewer draws
        config.repetitions = ml_collections.ConfigDict({name: 100 for name in UCI_DATASETS})
        config.repetitions.nursery = 40
        config.repetitions.chess = 20
        config.fast_ratios = (1,)
    if variant == "quick":
        config.datasets = ("banknote", "yeast")  # d = 4 and 8: powers of two, Table 3 is cheap
        config.ratios = (1, 10)
        config.fast_couplings = ("orthogonal", "hd_orthogonal", "simplex", "fast_simplex")
        config.fast_ratios = (1,)
        config.repetitions = ml_collections.ConfigDict({"banknote": 100, "yeast": 100})
    return apply_overrides(config, arg)
