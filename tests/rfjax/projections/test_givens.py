"""``rfjax.projections._givens``: the default depth of the Givens walk, and a ``GivensProjection``
applies the rotation its matrix holds: rows of a block orthogonal with chi-distributed norms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from rfjax.projections._givens import default_num_layers, givens


def test_default_num_layers_is_twice_ceil_log2_d():
    assert [default_num_layers(d) for d in (1, 2, 3, 8, 9)] == [0, 2, 4, 6, 8]


def test_the_projection_applies_its_matrix_whose_block_rows_are_orthogonal():
    dim = 8
    with jax.enable_x64(True):
        projection = givens(jax.random.key(0), dim, dim, dtype=jnp.float64)
        x = jnp.asarray(np.random.default_rng(0).standard_normal((3, dim)))
        projected = np.asarray(projection(x))
        w = np.asarray(projection.matrix())
    np.testing.assert_allclose(projected, np.asarray(x) @ w.T, rtol=1e-10, atol=1e-12)
    gram = w @ w.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-10)


def test_the_angles_are_uniform_on_the_whole_circle():
    """theta ~ U[0, 2 pi) as documented: angles on a quarter circle keep every block orthogonal
    and E[w w^T] = I exact, so only the angles' own law shows them. A KS test of the 1,536
    angles of one draw (d = 64: 4 blocks of 12 layers of 32 pairs)."""

    projection = givens(jax.random.key(2), 64, 256)
    angles = np.asarray(projection.angles, np.float64).ravel()
    assert stats.kstest(angles, stats.uniform(0, 2 * np.pi).cdf).pvalue > 1e-3


def test_signs_are_rademacher_and_the_permutation_is_drawn_apart_from_the_matchings():
    """D is a Rademacher diagonal (signs +-1, mean 0 within 4 standard errors over 6,000
    entries) and P a permutation of its own: neither equal to a layer's matching. With D = I
    or P = Q_1, every row is still orthogonal to its block with chi_d norms and E[w w^T] = I,
    so the dense reference and the moment tests passed both."""
    dim, num_blocks = 6, 1000
    projection = givens(jax.random.key(4), dim, dim * num_blocks)
    signs = np.asarray(projection.signs, np.float64)
    assert set(np.unique(signs)) == {-1.0, 1.0}
    assert abs(signs.mean()) <= 4 / np.sqrt(signs.size)
    permutation = np.asarray(projection.permutation)[:, None, :]
    layers = np.asarray(projection.layer_permutations)
    # P equals a given matching with probability 1/6! per block and layer: 8 expected in 6,000.
    assert np.all(permutation == layers, axis=-1).mean() < 5 / math.factorial(dim)
