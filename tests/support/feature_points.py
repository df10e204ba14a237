"""Shared points, sizes and projections of the tests of the feature maps of ``rfjax.features``:
two fixed inputs X, Y in R^DIM, the couplings to test (all marginally exact ones, the SimRF
paper's three by default) and ``draw``, one projection of a coupling."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax import projections

COUPLINGS = projections.marginally_exact()


DIM = 4


NUM_FEATURES = 6  # not a multiple of DIM: coupled couplings use a truncated second block


COEFFICIENTS = (0.5, 0.3, 0.2)  # degree l = 3: T = 6 projection vectors per output feature


POLY_WIDTH = 4  # M >= block_size (= DIM) for every coupling except halton (one block)


X = np.array([0.3, -0.2, 0.5, 0.1])


Y = np.array([-0.1, 0.4, 0.2, -0.3])


POLY_ROWS = POLY_WIDTH * len(COEFFICIENTS) * (len(COEFFICIENTS) + 1) // 2


# The SimRF paper's couplings in the default suite; every other marginally exact coupling in the
# full one (--runslow): each coupling costs one compiled program of all maps.
DEFAULT_COUPLINGS = ("gaussian", "orthogonal", "simplex")


def draw(coupling, rows=NUM_FEATURES, seed=0, dim=DIM, dtype=jnp.float32):
    return projections.get(coupling)(jax.random.key(seed), dim, rows, dtype=dtype)
