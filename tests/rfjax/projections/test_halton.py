"""``rfjax.projections._halton``: the primes and the Halton points behind the quasi-Monte Carlo
coupling (radical inverses in the first primes' bases, index 0 skipped)."""

import numpy as np

from rfjax.projections._halton import first_primes, halton_points


def test_first_primes():
    np.testing.assert_array_equal(first_primes(10), [2, 3, 5, 7, 11, 13, 17, 19, 23, 29])
    assert first_primes(1000)[-1] == 7919


def test_halton_points_are_radical_inverses_in_the_prime_bases():
    points = halton_points(4, 2)
    np.testing.assert_allclose(points[:, 0], [1 / 2, 1 / 4, 3 / 4, 1 / 8])  # base 2
    np.testing.assert_allclose(points[:, 1], [1 / 3, 2 / 3, 1 / 9, 4 / 9])  # base 3
    assert np.all((halton_points(500, 5) > 0) & (halton_points(500, 5) < 1))
