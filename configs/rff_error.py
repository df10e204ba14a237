"""Errors of the two random Fourier feature embeddings phi (sin/cos) and psi (cos + offset).

Sutherland & Schneider, "On the Error of Random Fourier Features" (seed 004): Fig. 1 (variance
per dimension), Fig. 3 (average max error within a radius) and Fig. 4 (Pr(|f|_inf > eps) on
[-3, 3] with D = 500), Gaussian kernel with sigma = 1 and d = 1 as in their numerical results.

Command:
  python -m experiments.main --config=configs/rff_error.py        # ~2 min on 2 busy CPU cores
  python -m experiments.main --config=configs/rff_error.py:quick  # seconds (smoke test)

Both embeddings have the same output width D: phi uses D/2 frequencies (sin and cos of each),
psi D frequencies with offsets b ~ U[0, 2 pi). Part 1: the variance of the estimate of k(Delta)
at distances Delta, by Monte Carlo, beside the closed forms Var phi = [1 + k(2 Delta) -
2 k(Delta)^2] / D and Var psi = [1 + k(2 Delta)/2 - k(Delta)^2] / D. Part 2: for each draw the
error f(x, y) = k_hat(x, y) - k(x, y) on a grid of [-3, 3]^2, its max within |x|, |y| <= r
(Fig. 3) and the distribution of the max over [-3, 3] (Fig. 4). Expected: Monte Carlo within
4 SE of the closed forms; phi below psi in variance at every Delta (the gap is largest at
Delta = 0, where phi is exact), in average max error at every radius and D, and its tail
probability curve to the left of psi's. The claims and their tests are declared below; the
measured numbers and verdicts are in results/rff_error/summary.md.
"""

import ml_collections

from configs.common import apply_overrides, claim, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "rff_error"
    config.dim = 1  # the seed's numerical results use d = 1
    config.lengthscale = 1.0  # sigma of k(Delta) = exp(-|Delta|^2 / (2 sigma^2))
    # Part 1: variance vs distance at output width D.
    config.variance_embedding_dim = 500
    config.distances = tuple(round(0.2 * i, 10) for i in range(21))  # Delta in [0, 4]
    config.num_variance_draws = 20_000
    # Part 2: max error over [-region_radius, region_radius]^2 on a grid, per draw.
    config.embedding_dims = (50, 100, 500)  # D values of the Fig. 3 curves
    config.tail_embedding_dim = 500  # D of the Fig. 4 tail probability
    config.region_radius = 3.0
    config.radii = tuple(
        round(0.25 * i, 10) for i in range(1, 13)
    )  # r of Fig. 3, up to region_radius
    config.grid_points = 241  # per axis: spacing 0.025
    config.num_max_draws = 5_000
    config.num_epsilons = 60
    config.draws_per_chunk = 200
    config.bootstrap_resamples = 2_000  # for the SE of the interquartile range of |f|_inf
    config.seed = 0
    config.claims = ml_collections.ConfigDict(
        {
            "closed_forms": claim(
                "The variances are Var phi = [1 + k(2 Delta) - 2 k(Delta)^2] / D and Var psi = "
                "[1 + k(2 Delta)/2 - k(Delta)^2] / D (seed, 'Variance'; rfjax.theory.rff_mse): "
                "every Monte Carlo cell within 4 SE",
                "within_se",
                k=4.0,
            ),
            "variance_theory": claim(
                "phi is lower-variance than psi for the Gaussian kernel at every Delta, by the "
                "closed forms (seed, Fig. 1; Var psi - Var phi = [k(Delta)^2 - k(2 Delta)/2] / D)",
                "fact",
            ),
            "variance": claim(
                "phi is lower-variance than psi for the Gaussian kernel (seed, Fig. 1), Monte "
                "Carlo",
                "greater",
            ),
            "max_error": claim("phi has the lower average max error (seed, Fig. 3)", "greater"),
            "mean": claim(
                'psi\'s max error has the higher mean (seed, Fig. 4: "its mean is higher")',
                "greater",
            ),
            # The interquartile range of |f|_inf, psi - phi; refuted if psi's is wider than
            # phi's by more than 10% of phi's.
            "tighter": claim(
                "psi's max error concentrates more tightly (seed, Fig. 4: \"f_psi concentrates "
                'more tightly")',
                "less",
                margin=0.1,
                relative=True,
            ),
        }
    )
    config.powered = variant != "quick"  # the quick variant is a smoke test
    if variant == "quick":
        config.variance_embedding_dim = 100
        config.distances = (0.0, 0.5, 1.0, 1.5, 2.5)
        config.num_variance_draws = 2_000
        config.embedding_dims = (100,)
        config.tail_embedding_dim = 100
        config.radii = (0.5, 1.5, 3.0)
        config.grid_points = 61
        config.num_max_draws = 300
        config.num_epsilons = 20
        config.draws_per_chunk = 300
        config.bootstrap_resamples = 200
    return apply_overrides(config, arg)
