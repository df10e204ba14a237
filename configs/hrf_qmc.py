"""HRF vs QMC/structured couplings: softmax-kernel MSE on Wine and Boston (HRF Table 1).

Command:
  python -m experiments.main --config=configs/hrf_qmc.py          # ~3 min on 2 busy CPU cores
  python -m experiments.main --config=configs/hrf_qmc.py:quick    # seconds (smoke test)

Wine comes from scikit-learn (in the ``experiments`` extra), Boston housing from
``experiments/hrf_qmc/data/boston_housing.csv`` (origin and licence in
``experiments/hrf_qmc/data/SOURCE.md``).

Inputs: each data set's 13 features are standardised (zero mean, unit variance per column),
then every row is scaled to unit length (``scaling="sphere"``, the setting of the paper's
Theorem 3.5). The paper's preprocessing is not in the seed text; with ``scaling="mean_norm"``
the rows keep their spread of lengths (root-mean-square length 1), and a few outlying rows of
Boston then dominate the absolute MSE.
``num_pairs`` random pairs (x, y), x != y, per data set; ``num_draws`` independent draws of
the random features; the MSE of SM-hat(x, y) averaged over pairs and draws.

Estimators: HRF-ort / HRF-iid = the angular hybrid (m = 8 shared base projections, variant II,
n = 8 sign projections) with orthogonal / i.i.d. projections; ORF-reg, ORF-Had, Halton-R =
antithetic positive (FAVOR+) features on orthogonal, HD-product (``hd_orthogonal``) and
randomised Halton projections, with M projections matched two ways: ``projections``
(M = m + n = 16, the same number of projection vectors, i.e. the construction cost of App. L)
and ``width`` (M = 2 m (n + 1) = 144, the same feature width 4 m (n + 1) = 288).
The claims and their tests are declared below; the measured numbers and verdicts are in
results/hrf_qmc/summary.md.
"""

import ml_collections

from configs.common import apply_overrides, claim, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "hrf_qmc"
    config.datasets = ("wine", "boston")
    # After standardising: "sphere" puts every row at length input_norm; "mean_norm" scales all
    # rows by one factor to root-mean-square length input_norm.
    config.scaling = "sphere"
    config.input_norm = 1.0
    config.num_pairs = 1_000
    config.num_features = 8  # m, base projections of the hybrid (shared by ++ and trig)
    config.num_sign_features = 8  # n, sign projections of the angular coefficient
    config.methods = ("HRF-ort", "HRF-iid", "ORF-reg", "ORF-Had", "Halton-R")
    config.matchings = ("projections", "width")
    config.num_draws = 2_000
    config.draws_per_chunk = 100
    config.seed = 0
    # "Outperform all other methods": against every baseline (its gap's mean over the data
    # sets); refuted if some baseline's MSE is below the better HRF's by more than 10% of it.
    paper = (
        "HRFs outperform all other methods (HRF Sec. 4.1, 'Comparison with QMC-methods', Table 1: "
        "HRF-ort and HRF-iid against ORF-reg, ORF-Had and Halton-R on Wine and Boston)"
    )
    config.claims = ml_collections.ConfigDict(
        {
            "projections_matched": claim(
                paper + ", baselines with the same number of projections", "greater", margin=0.1
            ),
            "width_matched": claim(
                paper + ", baselines with the same feature width", "greater", margin=0.1
            ),
            # The paper's claim with its sizing unknown: decided where both matchings agree.
            "overall": claim(
                paper + ", as the paper sized the baselines (not stated in the seed)",
                "greater",
                margin=0.1,
            ),
        }
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
    if variant == "quick":
        config.num_pairs = 200
        config.num_draws = 200
        config.draws_per_chunk = 100
    return apply_overrides(config, arg)
