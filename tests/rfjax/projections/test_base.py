"""``rfjax.projections._base``: a ``Projection`` applies x -> x W^T with its own matrix, checks its
inputs by name, splits its rows into blocks, and passes through ``jit`` as a pytree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.projections import DenseProjection


def _projection(rows=5, dim=3, block_size=2):
    weights = jnp.asarray(np.arange(rows * dim, dtype=np.float32).reshape(rows, dim) / 7)
    return DenseProjection(weights, block_size=block_size)


def test_call_is_the_product_with_the_transposed_matrix_also_under_jit():
    projection = _projection()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32)
    expected = np.asarray(x) @ np.asarray(projection.matrix()).T
    np.testing.assert_allclose(projection(x), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        jax.jit(lambda p, v: p(v))(projection, x), expected, rtol=1e-5, atol=1e-6
    )
    assert (projection.dim, projection.num_features) == (3, 5)


def test_blocks_in_row_order_with_a_partial_last_block():
    assert _projection(rows=5, block_size=2).block_sizes() == (2, 2, 1)
    assert _projection(rows=4, block_size=4).block_sizes() == (4,)


def test_inputs_of_the_wrong_width_or_not_finite_are_refused():
    projection = _projection()
    with pytest.raises(ValueError, match="x"):
        projection(jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="finite"):
        projection(jnp.array([[1.0, jnp.inf, 0.0]]))
