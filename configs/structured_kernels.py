"""Kernel estimation error of structured (circulant, Toeplitz, Hankel, HD) projections.

Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices" (seed 003,
docs/maths/structured.md): the paper proves that structured Gaussian matrices (with the
H D_3 H D_2 H D_1 preprocessing of its Step 1) estimate the angular, arc-cosine and Gaussian
kernels about as well as an unstructured Gaussian matrix; it reports no experiment, so this one
measures it.

Command:
  python -m experiments.main --config=configs/structured_kernels.py        # ~2.5 min, 2 busy cores
  python -m experiments.main --config=configs/structured_kernels.py:quick  # seconds (smoke test)

Data: scikit-learn's digits (8 x 8 images, d = 64, bundled with scikit-learn), a fixed random
subset of ``num_points`` images, centred and scaled to mean norm 1; the Gaussian kernel uses the
median pairwise distance as lengthscale. For each method (coupling, with or without the HD
preprocessing) and number of projections m, ``num_draws`` vmapped draws give the relative
squared Frobenius error |K_hat - K|_F^2 / |K|_F^2 of the Gram matrix of each kernel (one
projection of max(m) rows per draw: its first m rows serve each m and the three feature maps;
Fourier features have width 2m). Expected:
every error falls like 1/m; the Monte Carlo matches the closed form for the Gaussian kernel
(i.i.d. and plain circulant/Toeplitz/Hankel) within 4 SE; with HD preprocessing circulant,
Toeplitz and Hankel match the unstructured Gaussian for the angular kernel (ratio 1 within
~2%) but stay above it for the arc-cosine (~1.1-1.3) and Gaussian (~1.2-1.9) kernels; without
preprocessing they are worse for every kernel (image pixels correlate with their own shifts);
HD-orthogonal (fast ORF) is below the Gaussian for every kernel.
"""

import ml_collections

from configs.common import apply_overrides, parse_variant


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = parse_variant(arg)
    config = ml_collections.ConfigDict()
    config.experiment = "structured_kernels"
    config.dataset = "digits"  # sklearn.datasets.load_digits, d = 64
    config.num_points = 256
    # A method is a coupling name of rfjax.projections; "_hd" adds the Step 1 preprocessing.
    config.methods = (
        "gaussian",
        "circulant",
        "toeplitz",
        "hankel",
        "circulant_hd",
        "toeplitz_hd",
        "hankel_hd",
        "hd_orthogonal",
    )
    config.kernels = ("angular", "arccos", "gaussian")  # arccos of order 1 (ReLU)
    config.num_features = (16, 32, 64, 128, 256, 512)  # m, projections
    config.num_draws = 200
    config.draws_per_chunk = 50
    config.seed = 0
    if variant == "quick":
        config.num_points = 48
        config.methods = ("gaussian", "circulant", "toeplitz_hd")
        config.num_features = (16, 64)
        config.num_draws = 200
        config.draws_per_chunk = 200
    return apply_overrides(config, arg)
