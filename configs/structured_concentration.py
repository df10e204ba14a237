"""Concentration of structured (P-model) random Fourier features against the bounds.

Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices" (seed 003): structured
Gaussian matrices (circulant, skew-circulant, Toeplitz, Hankel, low displacement rank), with and
without the H D_3 H D_2 H D_1 preprocessing, against the unstructured Gaussian one. For each, the
empirical tail P(|K_hat - K| > eps) of the Gaussian-kernel sin/cos estimate over ``num_draws``
draws and ``num_pairs`` pairs of real points, beside Kakade's pointwise bound, the chromatic
k/chi bound of the paper's mechanism, the Gaussian-concentration bound proven for any P-model
(``rfjax.theory.structured_fourier_bound``) and Sutherland & Schneider's uniform bound; the MSE
against the budget of randomness t of each family.

Command:
  python -m experiments.main --config=configs/structured_concentration.py        # 44 min (*)
  python -m experiments.main --config=configs/structured_concentration.py:quick  # ~30 s (tests)

Data: scikit-learn digits, ``num_points`` images (seed ``seed``), centred, scaled to mean norm
1, with the pixels that are constant on the subset dropped (d = 59 at 200 points: a prime, so
the circulant P-model has odd coherence cycles, chi = 3, while with preprocessing n = 64 and
chi = 2); lengthscale = median pairwise distance. m = d projections (one full block: every row
shares the budget). Expected: every family unbiased; the empirical tails far below every proven
bound; the structured families' MSE above the unstructured one's by a factor that the
preprocessing shrinks; the uniform bound vacuous at this m.

(*) Measured runtime of the committed default run (results/structured_concentration): 43.5 min
of measurement on 2 cores shared with other jobs (load average ~25), i.e. with a small share of
the machine; measurements.json makes it resumable, and ``report`` alone takes seconds.
"""

import ml_collections

from configs.common import apply_overrides, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "structured_concentration"
    config.dataset = "digits"  # sklearn.datasets.load_digits
    config.num_points = 200
    config.num_pairs = 2000  # a fixed random subset of the pairs of points
    # Families of rfjax.projections (ldrR: low displacement rank R); each with and without HD.
    config.families = (
        "gaussian",
        "circulant",
        "skew_circulant",
        "toeplitz",
        "hankel",
        "ldr1",
        "ldr2",
        "ldr4",
    )
    config.preprocess = (False, True)
    config.num_draws = 4000
    config.draws_per_chunk = 250
    config.bound_draws = 16  # draws of the HD signs / h over which the P-model bound is averaged
    config.epsilons = (0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
    config.seed = 0
    if variant == "quick":
        config.num_points = 40
        config.num_pairs = 200
        config.families = ("gaussian", "circulant", "ldr2")
        config.num_draws = 400
        config.draws_per_chunk = 200
        config.bound_draws = 2
        config.epsilons = (0.05, 0.1, 0.2, 0.4)
    return apply_overrides(config, arg)
