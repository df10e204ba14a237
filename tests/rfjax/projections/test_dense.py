"""``rfjax.projections._dense``: the simplex directions of SimRF Eq. 9 (unit vectors at pairwise
cosine -1/(d-1) summing to zero), the Haar rotations as the sign-fixed Q of their Gaussian draw
and the orthogonal coupling's orthogonal rows within a block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax._random import flat
from rfjax.projections._dense import (
    haar_rotations,
    haar_rows,
    orthogonal,
    simplex,
    simplex_directions,
)


@pytest.mark.parametrize("dim", [2, 5, 16])
def test_simplex_directions_are_a_regular_simplex(dim):
    with jax.enable_x64(True):
        s = np.asarray(simplex_directions(dim, jnp.float64))
    gram = s @ s.T
    expected = np.full((dim, dim), -1.0 / (dim - 1))
    np.fill_diagonal(expected, 1.0)
    np.testing.assert_allclose(gram, expected, atol=1e-12)
    np.testing.assert_allclose(s.sum(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(s[:, -1], 0.0, atol=1e-12)  # in the hyperplane u_d = 0


def test_simplex_directions_in_one_dimension_are_e_1():
    np.testing.assert_array_equal(simplex_directions(1), [[1.0]])


@pytest.mark.parametrize("rows", [3, 5])
def test_haar_rows_are_the_sign_fixed_q_of_their_gaussian_draw(rows):
    """The rotation R of a Gaussian draw A is Q diag(sign(diag R_QR)): Q^T A = R_QR with a
    positive diagonal, an exact oracle of the sign fix (without it, or with the signs on the
    rows, it is not: an unfixed Q was caught only by the moment tests, and the signs put on
    the rows, diag(s) Q, passed every test)."""
    dim, num_blocks, key = 5, 3, jax.random.key(30)
    with jax.enable_x64(True):
        if rows == dim:
            drawn = haar_rotations(key, num_blocks, dim, jnp.float64)
        else:
            drawn = haar_rows(key, num_blocks, rows, dim, jnp.float64)
        gaussian = flat(jax.random.normal, key, (num_blocks, dim, rows), jnp.float64)
    drawn, gaussian = np.asarray(drawn), np.asarray(gaussian)
    assert drawn.shape == (num_blocks, rows, dim)
    triangular = drawn @ gaussian if rows < dim else np.swapaxes(drawn, -1, -2) @ gaussian
    np.testing.assert_allclose(np.tril(triangular, -1), 0.0, atol=1e-12)
    assert np.all(np.diagonal(triangular, axis1=-2, axis2=-1) > 0)
    np.testing.assert_allclose(
        drawn @ np.swapaxes(drawn, -1, -2),
        np.broadcast_to(np.eye(rows), (num_blocks, rows, rows)),
        atol=1e-12,
    )


def test_orthogonal_rows_are_orthogonal_within_a_block_only():
    dim = 6
    with jax.enable_x64(True):
        w = np.asarray(orthogonal(jax.random.key(3), dim, 2 * dim, dtype=jnp.float64).matrix())
    for block in (w[:dim], w[dim:]):
        gram = block @ block.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-10)
    assert np.abs(w[:dim] @ w[dim:].T).max() > 1e-3  # blocks are independent, not orthogonal


def test_partial_simplex_block_rows_are_rotated_and_isotropic():
    """``partial_block="simplex"``: the last m mod d rows are an r-vertex simplex rotated by a
    Haar rotation, so each row is marginally N(0, I_d): E[w w^T] = I within 4 standard errors
    over independent draws (unrotated, they would all lie in a fixed r-dimensional subspace)."""
    dim, m, draws = 4, 6, 4000
    keys = jax.random.split(jax.random.key(21), draws)
    sample = jax.vmap(lambda k: simplex(k, dim, m, partial_block="simplex").matrix())
    weights = np.asarray(sample(keys), np.float64)
    for row in (dim, m - 1):  # the two rows of the partial block
        second = weights[:, row, :, None] * weights[:, row, None, :]
        mean = second.mean(axis=0)
        se = second.std(axis=0, ddof=1) / np.sqrt(draws)
        assert np.all(np.abs(mean - np.eye(dim)) <= 4 * se), (row, mean, se)


def test_orthogonal_norms_within_a_block_are_independent():
    """D holds i.i.d. chi_d norms: the norms of two rows of one block are uncorrelated (their
    centred product within 4 standard errors of 0); one norm per block passed every test."""
    dim, draws = 4, 4000
    keys = jax.random.split(jax.random.key(22), draws)
    weights = jax.vmap(lambda k: orthogonal(k, dim, dim, dtype=jnp.float32).matrix())(keys)
    norms = np.linalg.norm(np.asarray(weights, np.float64), axis=-1)
    centred = norms - norms.mean(axis=0)
    product = centred[:, 0] * centred[:, 1]
    se = product.std(ddof=1) / np.sqrt(draws)
    assert abs(product.mean()) <= 4 * se, (product.mean(), se)
