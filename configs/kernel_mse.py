"""MSE of the Gaussian-kernel positive-random-feature estimate per coupling (SimRF Fig. 6 style).

Command:
  python -m experiments.main --config=configs/kernel_mse.py --workdir=results/kernel_mse
      # ~1 min on 2 quiet CPU cores (14 min wall when shared with other jobs at load ~25)
  python -m experiments.main --config=configs/kernel_mse.py:quick    # seconds (smoke test)

For d = 64 and m = 64 (one block) it draws ``num_draws`` projections per coupling, measures the
MSE of phi(x).phi(y) against exp(-|x-y|^2/2) for inputs with |x+y| = v on a grid, and compares
with the closed forms (Eq. 11 with Eq. 19, 23, 24). The claims and their tests are declared
below; the measured numbers and verdicts are in results/kernel_mse/summary.md.
"""

import ml_collections

from configs.common import apply_overrides, claim, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "kernel_mse"
    config.dim = 64
    config.num_features = 64
    config.norms_of_sum = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
    config.couplings = ("gaussian", "orthogonal", "simplex", "simplex_plus")
    config.num_draws = 20_000
    config.draws_per_chunk = 2_000
    config.seed = 0
    # Orderings are judged on MSE ratios to the IID closed form, pooled over v (one test),
    # weighted by precision: the squared errors are heavy-tailed at large v, so the cells' SEs
    # span orders of magnitude and an equal-weight mean would be carried by the noisiest cells.
    config.claims = ml_collections.ConfigDict(
        {
            "exact": claim(
                "The closed-form MSEs are exact (Sec. 4, Eq. 11, 19, 23, 24): every Monte Carlo "
                "cell within 4 SE",
                "within_se",
                k=4.0,
            ),
            "order_theory": claim(
                "SimRF < ORF < IID at every v, by the closed forms (Corollaries 3.3, 4.4; Fig. 6)",
                "fact",
            ),
            "simrf_below_orf": claim(
                "SimRF below ORF (Corollary 3.3, Fig. 6), Monte Carlo",
                "greater",
                pooling="precision",
            ),
            "orf_below_iid": claim(
                "ORF below IID (Corollary 4.4, Fig. 6), Monte Carlo",
                "greater",
                pooling="precision",
            ),
            "small_v": claim(
                "SimRF's advantage is largest at small v (Sec. 5.1: its MSE goes as v^2 times a "
                "prefactor that is 0.00778 at d = 64, against 1 for IID and ORF): its MSE ratio "
                "to IID at the smallest v is the closed form's, which tends to that prefactor",
                "within_se",
                k=4.0,
            ),
            # "At or just below": refuted if SimRF+ is above SimRF by more than 0.1% of the
            # IID MSE (the ratio units), on the mean over v.
            "simrf_plus": claim(
                "SimRF+ is at or just below SimRF (Fig. 4, Sec. 3.2)",
                "nonsuperior",
                margin=0.001,
                pooling="precision",
            ),
        }
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
    if variant == "quick":
        config.dim = 8
        config.num_features = 12
        config.norms_of_sum = (0.25, 0.75, 1.5)
        config.num_draws = 1_000
        config.draws_per_chunk = 500
    return apply_overrides(config, arg)
