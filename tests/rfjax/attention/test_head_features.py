"""Tests of ``rfjax.attention._head_features``: the H^{-1/4} data normaliser, the floored ratio
of attention rows and its derivative (finite where plain autodiff overflows), and the finite-row
flags."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention import _head_features


def test_normalise_scales_so_that_the_dot_product_is_divided_by_sqrt_h():
    q = jax.random.normal(jax.random.key(0), (5, 16))
    k = jax.random.normal(jax.random.key(1), (5, 16))
    assert _head_features.data_normalizer(16) == 0.5
    scaled = jnp.sum(_head_features.normalise(q) * _head_features.normalise(k), -1)
    np.testing.assert_allclose(scaled, jnp.sum(q * k, -1) / 4.0, rtol=1e-6)


def test_floored_ratio_and_its_derivative_stay_finite_below_the_floor():
    eps = 1e-6
    numerator = jnp.asarray([[2.0, 4.0], [1.0, 1.0]])
    denominator = jnp.asarray([[2.0], [1e-30]])  # the second row is below the floor
    out = _head_features.floored_ratio(numerator, denominator, eps)
    np.testing.assert_allclose(out, [[1.0, 2.0], [1e6, 1e6]], rtol=1e-6)

    def loss(num, den):  # the second row does not reach the loss: its cotangent is 0
        return _head_features.floored_ratio(num, den, eps)[0].sum()

    grad_num, grad_den = jax.grad(loss, argnums=(0, 1))(numerator, denominator)
    assert np.all(np.isfinite(grad_num)) and np.all(np.isfinite(grad_den))
    np.testing.assert_allclose(grad_num[0], [0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(grad_den[0, 0], -(2.0 + 4.0) / 4.0, rtol=1e-6)  # -sum(num) / den^2
    np.testing.assert_array_equal(grad_den[1], 0.0)  # the floor's derivative is 0 below eps


@pytest.mark.parametrize(
    "second_row", [[0.0, 0.0], [0.0, 1e-30]], ids=["attends-to-no-key", "signed-terms-cancel"]
)
def test_a_row_whose_denominator_is_zero_has_derivative_zero(second_row):
    """A denominator of exactly 0: a row that attends to no key (numerator 0 too: the row is 0
    whatever the inputs), or signed features whose terms cancel (the output is the numerator
    over the floor). Its derivative is 0, even at the positive maps' floor (the smallest normal
    number), where a cotangent of 10 divided by the floor is inf; the other row keeps its
    derivative."""
    eps = float(jnp.finfo(jnp.float32).tiny)
    numerator = jnp.asarray([[2.0, 4.0], second_row])
    denominator = jnp.asarray([[2.0], [0.0]])
    out = _head_features.floored_ratio(numerator, denominator, eps)
    np.testing.assert_array_equal(out[1], numerator[1] / eps)

    def loss(num, den):
        return 10.0 * _head_features.floored_ratio(num, den, eps).sum()

    grad_num, grad_den = jax.grad(loss, argnums=(0, 1))(numerator, denominator)
    np.testing.assert_allclose(grad_num[0], [5.0, 5.0], rtol=1e-6)
    np.testing.assert_array_equal(grad_num[1], 0.0)
    np.testing.assert_array_equal(grad_den[1], 0.0)


def test_finite_rows_flags_each_row_with_a_nan_or_inf():
    x = jnp.asarray([[1.0, 2.0], [jnp.nan, 0.0], [0.0, jnp.inf]])
    np.testing.assert_array_equal(_head_features.finite_rows(x), [True, False, False])


def test_the_data_normalizer_takes_a_head_dimension():
    assert _head_features.data_normalizer(16) == 0.5
    for bad, error in ((0, ValueError), (-4, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match="head_dim must be an integer >= 1"):
            _head_features.data_normalizer(bad)
