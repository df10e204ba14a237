"""``rfjax.projections._halton``: the primes and the Halton points behind the quasi-Monte Carlo
coupling (radical inverses in the first primes' bases, index 0 skipped), and the sampler's map of
them to Gaussian rows."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.projections._halton import first_primes, halton, halton_points


def test_first_primes():
    np.testing.assert_array_equal(first_primes(10), [2, 3, 5, 7, 11, 13, 17, 19, 23, 29])
    assert first_primes(1000)[-1] == 7919


def test_halton_points_are_radical_inverses_in_the_prime_bases():
    points = halton_points(4, 2)
    np.testing.assert_allclose(points[:, 0], [1 / 2, 1 / 4, 3 / 4, 1 / 8])  # base 2
    np.testing.assert_allclose(points[:, 1], [1 / 3, 2 / 3, 1 / 9, 4 / 9])  # base 3
    assert np.all((halton_points(500, 5) > 0) & (halton_points(500, 5) < 1))


def test_halton_rows_are_the_gaussian_quantiles_of_the_points_under_one_shift():
    """Phi(w_i) - h_i mod 1 is the same shift u for every row (circular distance ~0): one
    Cranley-Patterson rotation of the points 1..m, in order, mapped by Phi^{-1}. Independent
    shifts per row, reversed points or negated quantiles keep each row N(0, I_d) and passed
    the marginal tests."""
    dim, num_features = 3, 40
    with jax.enable_x64(True):
        weights = halton(jax.random.key(5), dim, num_features, dtype=jnp.float64).matrix()
        levels = np.asarray(jax.scipy.special.ndtr(weights))
    shifts = np.mod(levels - halton_points(num_features, dim), 1.0)
    gap = np.abs(shifts - shifts[0])
    np.testing.assert_allclose(np.minimum(gap, 1.0 - gap), 0.0, atol=1e-9)
