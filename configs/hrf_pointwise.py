"""Pointwise relative error of softmax-kernel estimators vs angle (HRF Sec. 4.1, Fig. 2, App. G).

Command:
  python -m experiments.main --config=configs/hrf_pointwise.py        # ~2.5 min, 2 busy CPU cores
  python -m experiments.main --config=configs/hrf_pointwise.py:quick  # seconds (smoke test)

For inputs x, y on the sphere S(r) at angle theta (d = 16, r in {1, 1.5, 2, 3}), it draws
``num_draws`` i.i.d. Gaussian projections per estimator and measures the relative error
sqrt(E[(SM-hat - SM)^2]) / SM of SM(x, y) = exp(x.y) for trigonometric features (m = 16,
width 2m), antithetic positive features (m = 16, width 2m), the angular hybrid
(m = 16 per base estimator, n = 8 sign features, HRF-A(16, 8)) and the normalised Gaussian
hybrid (m = 16, n = 8 Fourier coefficient features, bandwidth tau = r), beside the closed forms
of ``rfjax.theory`` (Lemma 3.4, Theorem 3.5; the Gaussian hybrid's from Eq. 31 with the RFF
variance of its coefficient). Expected: the angular hybrid's error vanishes at theta = 0 and
theta = pi (to float64 rounding) and its max over theta (theory) is the smallest at every r
(0.31, 2.5, 67, 1.1e6 against 1.28, 15.9, 527, 1.16e7 for trig and positive); trig
vanishes at 0 only, positive at pi only, the Gaussian hybrid at pi only. The Monte Carlo
agrees with theory for the bounded estimators (trig) and underestimates it where the positive
estimator is heavy-tailed (large r, small theta): there the MSE is carried by draws rarer than
1 / num_draws.
"""

import ml_collections

from configs.common import apply_overrides, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "hrf_pointwise"
    config.dim = 16
    config.radii = (1.0, 1.5, 2.0, 3.0)
    config.num_angles = 25  # theta on linspace(0, pi, num_angles), both ends included
    config.num_features = 16  # m, projections per base estimator (trig, positive)
    config.num_coefficient_features = 8  # n, sign (angular) or Fourier (Gaussian) coefficients
    config.gaussian_bandwidth_over_radius = 1.0  # tau / r for the Gaussian hybrid
    config.coupling = "gaussian"  # i.i.d. projections, the setting of the closed forms
    # float64 (scoped with jax.enable_x64): in float32 the Lemma 2.3 dot product cancels the
    # e^{r^2}-sized trig block against itself at theta = pi, and at r = 3 that rounding error
    # is as large as SM = e^{-9} (relative error ~1 instead of 0).
    config.dtype = "float64"
    config.num_draws = 20_000
    config.draws_per_chunk = 2_000
    config.seed = 0
    if variant == "quick":
        config.radii = (3.0,)  # one compile of the Gaussian hybrid; float64 rounding at its worst
        config.num_angles = 9
        config.num_draws = 400
        config.draws_per_chunk = 400
    return apply_overrides(config, arg)
