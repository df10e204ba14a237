"""``rfjax.ops._chain``: ``apply_simplex`` is the product with the simplex matrix S of SimRF
Eq. 9 (rows: ``projections._dense.simplex_directions``) in O(d), along any axis."""

import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.ops import apply_simplex
from rfjax.projections._dense import simplex_directions


@pytest.mark.parametrize("dim", [2, 3, 8])
def test_apply_simplex_is_the_product_with_the_simplex_directions(dim):
    z = np.random.default_rng(dim).standard_normal((4, dim)).astype(np.float32)
    s = np.asarray(simplex_directions(dim, jnp.float64))
    # (S z)_i = <s_i, z>: the rows of S are the simplex directions.
    np.testing.assert_allclose(apply_simplex(jnp.asarray(z)), z @ s.T, rtol=1e-5, atol=1e-5)
    along_0 = apply_simplex(jnp.asarray(z.T), axis=0)
    np.testing.assert_allclose(along_0, (z @ s.T).T, rtol=1e-5, atol=1e-5)


def test_apply_simplex_names_a_too_short_axis():
    with pytest.raises(ValueError, match="2"):
        apply_simplex(jnp.ones((3, 1)))
