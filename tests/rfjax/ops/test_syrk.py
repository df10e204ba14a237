"""``rfjax.ops._syrk``: ``symmetric_rank_update(c, a)`` adds a^T a to the lower triangle of c and
leaves the entries above the diagonal as they were; updates over row blocks sum to A^T A."""

import jax.numpy as jnp
import numpy as np

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
