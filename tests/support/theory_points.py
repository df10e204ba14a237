"""Shared points, draws and checks of the tests of ``rfjax.theory``: two fixed pairs (PRF and
RFF), Monte Carlo projections of them for each coupling (cached: drawn once per process), the
4-standard-error check and a central difference.

Call the draws under ``jax.enable_x64`` (the theory tests' ``float64`` fixture).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import projections

NSIG = 4.0
NUM_DRAWS = 40_000
DIM = 6


def pair(dim: int, norm_x: float, norm_y: float, cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Two vectors in R^dim with the given norms and mutual cosine."""
    x = np.zeros(dim)
    y = np.zeros(dim)
    x[0] = norm_x
    y[0] = norm_y * cosine
    y[1] = norm_y * math.sqrt(1.0 - cosine**2)
    return x, y


# PRF pair: |x| = |y| = 0.5, v = |x + y| = 0.8. RFF pair: z = |x - y| ~ 1.25.
PRF_X, PRF_Y = pair(DIM, 0.5, 0.5, 0.28)
RFF_X, RFF_Y = pair(DIM, 0.9, 0.7, -0.2)


def mean_se(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def assert_within(measured: float, se: float, predicted: float) -> None:
    z = (measured - predicted) / se
    assert abs(measured - predicted) <= NSIG * se, (
        f"measured {measured:.6g} +- {se:.2g}, predicted {predicted:.6g}, z = {z:+.2f}"
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def project(sampler, dim, num_features, keys, points):
    return jax.vmap(lambda key: sampler(key, dim, num_features)(points))(keys)


@functools.cache
def draws(coupling: str) -> np.ndarray:
    """Projections w_i^T p of the four test points for NUM_DRAWS independent draws of m = 9.

    Shape (NUM_DRAWS, 4, 9), float64 (drawn in float32, analysed in float64). With d = 6 the
    blocks are (6, 3), the last one truncated by the sampler; the first 6 rows are one full
    block, i.e. a draw with m = 6 (one compilation per coupling serves both cases).
    """
    seed = {"gaussian": 1, "orthogonal": 2, "simplex": 3}[coupling]
    keys = jax.random.split(jax.random.key(seed), NUM_DRAWS)
    points = jnp.asarray(np.stack([PRF_X, PRF_Y, RFF_X, RFF_Y]), jnp.float32)
    sampler = projections.get(coupling)
    return np.asarray(project(sampler, DIM, 9, keys, points), dtype=np.float64)


def projected(coupling: str, num_features: int) -> np.ndarray:
    """(NUM_DRAWS, 4, num_features) projections, num_features in {6, 9} (see ``draws``)."""
    return draws(coupling)[..., :num_features]


def prf_estimates(coupling: str, num_features: int, kernel: str) -> np.ndarray:
    proj = projected(coupling, num_features)
    shift = 1.0 if kernel == "gaussian" else 0.5
    fx = np.exp(proj[:, 0] - shift * PRF_X @ PRF_X)
    fy = np.exp(proj[:, 1] - shift * PRF_Y @ PRF_Y)
    return np.mean(fx * fy, axis=-1)


def prf_kernel(kernel: str) -> float:
    if kernel == "gaussian":
        return math.exp(-np.sum((PRF_X - PRF_Y) ** 2) / 2)
    return math.exp(PRF_X @ PRF_Y)


def relative_error(log_value: np.ndarray, log_reference: np.ndarray) -> np.ndarray:
    return np.abs(np.expm1(np.asarray(log_value) - log_reference))


def central_difference(f, t: float, step: float = 1e-5) -> float:
    return (float(f(t + step)) - float(f(t - step))) / (2 * step)
