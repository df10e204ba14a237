"""Shared settings and Monte Carlo checks of the tests of the exponential feature maps (GERF/OPRF,
DERF/SADERF) and their closed forms: a pair at given norms and angle, the mean and variance of an
estimate over NUM_DRAWS keys checked within 4 standard errors, and anisotropic inputs to fit on.
Call them under ``jax.enable_x64`` (the ``float64`` fixture of tests/rfjax/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np

NSIG = 4.0


NUM_DRAWS = 20_000


def pair(dim, norm_x, norm_y, cosine):
    x = np.zeros(dim)
    y = np.zeros(dim)
    x[0] = norm_x
    y[0] = norm_y * cosine
    y[1] = norm_y * np.sqrt(1.0 - cosine**2)
    return jnp.asarray(x), jnp.asarray(y)


def monte_carlo(estimate, key=0):
    """Mean, its SE, sample variance and its SE of ``estimate(key)`` over NUM_DRAWS keys."""
    draws = np.asarray(
        jax.jit(jax.vmap(estimate))(jax.random.split(jax.random.key(key), NUM_DRAWS))
    )
    mean = draws.mean()
    centred_sq = (draws - mean) ** 2
    return (
        mean,
        draws.std(ddof=1) / np.sqrt(NUM_DRAWS),
        centred_sq.mean() * NUM_DRAWS / (NUM_DRAWS - 1),
        centred_sq.std(ddof=1) / np.sqrt(NUM_DRAWS),
    )


def check(estimate, truth, variance):
    mean, se_mean, var, se_var = monte_carlo(estimate)
    assert abs(mean - truth) <= NSIG * se_mean, (mean, truth, se_mean)
    if variance is not None:
        assert abs(var - variance) <= NSIG * se_var, (var, variance, se_var)


SETTINGS = [  # (d, m, |x|, |y|, cosine)
    (2, 4, 0.5, 0.8, 0.3),
    (4, 3, 0.9, 0.6, -0.5),
    (6, 8, 0.7, 0.7, 0.9),
    (3, 2, 1.2, 0.4, 0.0),
]


def statistics(dim, key=0, n=40):
    kq, kk = jax.random.split(jax.random.key(key))
    queries = 0.6 * jax.random.normal(kq, (n, dim)) + 0.2
    keys = jax.random.normal(kk, (n, dim)) * jnp.linspace(0.3, 1.2, dim)
    return queries, keys


VARIANTS = ("asymmetric", "symmetric", "simplified")
