"""Performer-ViT on Fashion-MNIST with the newer feature maps: FAVOR++ (OPRF) and FAVOR# (SADERF)
against FAVOR+ (positive features), all with orthogonal projections (issue 16).

Command (Fashion-MNIST as for configs/performer_vit.py):
  python -m experiments.main --config=configs/performer_vit_maps.py \
      --workdir=results/performer_vit_maps
  python -m experiments.main --config=configs/performer_vit_maps.py:quick    # seconds (tests)

Each feature map trains the ``small`` Performer-ViT of ``configs/performer_vit.py`` (same model,
data, schedule; fixed projection protocol, ORF rows) on the same paired seeds (same
initialisation and batch order: the maps have no parameters of their own, OPRF and SADERF fit
their parameters to the current queries and keys), so the maps differ only in their features.

Claims (arXiv:2205.15317, FAVOR++; arXiv:2302.00787, FAVOR#): the optimised maps approximate
softmax attention with far lower variance than FAVOR+ and the Performers built on them train to
better accuracy. Tested here: paired accuracy differences (map - FAVOR+) with 95% intervals;
``target_difference`` is the gain the seeds are sized to resolve at 3 SE (the performer_vit
pilot's sd of paired accuracy differences, ~0.004, gives 6 seeds for 0.005).
"""

import ml_collections

from configs import performer_vit
from configs.common import apply_overrides, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick",))
    base = performer_vit.get_config("quick" if variant == "quick" else "small")
    config = ml_collections.ConfigDict()
    config.experiment = "performer_vit_maps"
    config.variant = variant or "default"
    config.baseline = "positive"  # FAVOR+
    config.feature_maps = ("positive", "oprf", "saderf")
    config.coupling = "orthogonal"
    config.num_seeds = 2 if variant == "quick" else 6
    config.target_difference = 0.005
    # The Performer-ViT experiment's settings (model, data, training, evaluation) for every map.
    config.vit = base
    return apply_overrides(config, arg)
