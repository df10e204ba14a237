"""``rfjax.ops._syrk``: ``symmetric_rank_update(c, a)`` adds a^T a to the lower triangle of c and
leaves the entries above the diagonal as they were; updates over row blocks sum to A^T A."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.ops import symmetric_rank_update


def test_updates_of_row_blocks_sum_to_the_lower_triangle_of_the_gram_matrix():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((11, 5)).astype(np.float32)
    c = np.triu(rng.standard_normal((5, 5)), 1).astype(np.float32)  # above the diagonal only
    gram = jnp.asarray(c)
    for block in (a[:4], a[4:9], a[9:]):
        gram = symmetric_rank_update(gram, jnp.asarray(block))
    gram = np.asarray(gram, np.float64)
    exact = a.astype(np.float64).T @ a.astype(np.float64)
    np.testing.assert_allclose(np.tril(gram), np.tril(exact), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.triu(gram, 1), np.triu(c, 1))


def test_vmap_and_grad_are_those_of_the_dense_update():
    """The primitive had no batching or differentiation rule: ``vmap`` and ``grad`` raised
    NotImplementedError where ``c + tril(a^T a)`` takes both."""
    rng = np.random.default_rng(1)
    c = jnp.asarray(rng.standard_normal((2, 3, 3)), jnp.float32)
    a = jnp.asarray(rng.standard_normal((2, 4, 3)), jnp.float32)
    lower = np.tril(np.ones((3, 3), bool))

    def dense(c, a):
        return jnp.where(lower, c + a.T @ a, c)

    for args, in_axes in [((c, a), (0, 0)), ((c[0], a), (None, 0)), ((c, a[0]), (0, None))]:
        expected = jax.vmap(dense, in_axes)(*args)
        got = jax.vmap(symmetric_rank_update, in_axes)(*args)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    weights = jnp.asarray(rng.standard_normal((3, 3)), jnp.float32)
    for update in (symmetric_rank_update, jax.jit(symmetric_rank_update)):
        got = jax.grad(lambda c, a, f=update: jnp.sum(weights * f(c, a)), (0, 1))(c[0], a[0])
        expected = jax.grad(lambda c, a: jnp.sum(weights * dense(c, a)), (0, 1))(c[0], a[0])
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_shapes_other_than_square_c_and_rows_of_its_width_are_rejected():
    """c must be (m, m) for a of shape (b, m): a c of the right height but another width, or
    another height, or a of another width, raises naming both shapes."""
    a = jnp.zeros((2, 3))
    for c in (jnp.zeros((3, 4)), jnp.zeros((4, 3)), jnp.zeros((2, 2))):
        with pytest.raises(ValueError, match=r"c must be \(m, m\) and a \(b, m\), got"):
            symmetric_rank_update(c, a)
