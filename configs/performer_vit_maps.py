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
better accuracy. The claims and their tests are declared below; ``target_difference`` is the
gain the seeds are sized to resolve at 3 SE (from the spread of the paired differences of the
first 6 seeds, with a margin). The measured numbers and verdicts are in
results/performer_vit_maps/summary.md.

Cost: about a minute per run on 2 CPU cores once the first run of each map has filled the JAX
compilation cache (the first: mostly compilation).
"""

import ml_collections

from configs import performer_vit
from configs.common import apply_overrides, claim, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg, ("quick",))
    base = performer_vit.get_config("small")
    if variant == "quick":  # the same design (raw scores), at toy size
        performer_vit.toy_size(base)
        base.variant = "quick"
    config = ml_collections.ConfigDict()
    config.experiment = "performer_vit_maps"
    config.variant = variant or "default"
    config.baseline = "positive"  # FAVOR+
    config.feature_maps = ("positive", "oprf", "saderf")
    config.coupling = "orthogonal"
    config.num_seeds = 2 if variant == "quick" else 16
    config.target_difference = 0.005
    config.claims = ml_collections.ConfigDict(
        {
            # Refuted if the optimised maps' Performers are worse by more than half a point.
            "better_accuracy": claim(
                "Performers built on the optimised maps train to better accuracy than FAVOR+'s "
                "(FAVOR++, FAVOR#)",
                "greater",
                margin=0.005,
            ),
            "lower_attention_error": claim(
                "The optimised maps approximate softmax attention better than FAVOR+ on the "
                "trained queries and keys (FAVOR++, FAVOR#)",
                "less",
                margin=0.005,
            ),
        }
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
    # Each map's Performers must beat the same model with uniform attention swapped in
    # (configs/performer_vit.py's check, declared there on 2026-11-28, issue 43).
    config.trained_check = base.trained_check
    # The Performer-ViT experiment's settings (model, data, training, evaluation) for every map.
    config.vit = base
    return apply_overrides(config, arg)
