"""``rfjax.ops._chain``: ``apply_simplex`` is the product with the simplex matrix S of SimRF
Eq. 9 (rows: ``projections._dense.simplex_directions``) in O(d), along any axis."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.ops import apply_simplex, chain_reference, hd_chain
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


def test_hd_chain_derivatives_and_batching_are_those_of_the_composition():
    """The primitive's own JVP in x (the chain of the tangent), its transpose (the gradient in
    x), its JVP in the signs and norms and its ``vmap`` rules (over x alone, and over the
    norms) against autodiff and ``vmap`` of ``chain_reference``, simplex map included."""
    rng = np.random.default_rng(5)
    x, dx = (jnp.asarray(rng.standard_normal((3, 8)), jnp.float32) for _ in range(2))
    signs = jnp.asarray(rng.choice([-1.0, 1.0], size=(2, 2, 8)), jnp.float32)
    norms, dnorms = (jnp.asarray(rng.uniform(0.5, 2.0, (2, 8)), jnp.float32) for _ in range(2))
    weights = jnp.asarray(rng.standard_normal((3, 2, 8)), jnp.float32)
    fused = functools.partial(hd_chain, simplex=True)
    reference = functools.partial(chain_reference, simplex=True, implementation="xla")
    zero_signs = jnp.zeros_like(signs)
    columns = jnp.stack([x, dx], 1)  # a batch axis that is not the leading one

    def derivatives(chain):
        return (
            jax.jvp(lambda v: chain(v, signs, norms), (x,), (dx,))[1],
            jax.grad(lambda v: jnp.sum(weights * chain(v, signs, norms)))(x),
            jax.jvp(chain, (x, signs, norms), (dx, zero_signs, dnorms))[1],
            jax.vmap(lambda v: chain(v, signs, norms), in_axes=1, out_axes=1)(columns),
            jax.vmap(lambda n: chain(x, signs, n))(jnp.stack([norms, dnorms])),
        )

    for got, want in zip(derivatives(fused), derivatives(reference), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
