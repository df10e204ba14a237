"""``rfjax.sampled_softmax``'s temperature selection (``_temperature``): the divergence is
KL(softmax(logits) || softmax(cosines / tau)) and the generating tau is selected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.sampled_softmax import kernel_softmax_divergence, select_temperature


def test_kernel_softmax_divergence_and_temperature_selection():
    logits = jax.random.normal(jax.random.key(0), (4, 9)) * 3
    cosines = jnp.tanh(jax.random.normal(jax.random.key(1), (4, 9)))
    grid = jnp.array([0.1, 0.3, 1.0])
    got = kernel_softmax_divergence(logits, cosines, grid)
    p = np.asarray(jax.nn.softmax(logits), np.float64)
    for tau, value in zip(np.asarray(grid), np.asarray(got), strict=True):
        q = np.asarray(jax.nn.softmax(cosines / tau), np.float64)
        np.testing.assert_allclose(value, np.mean(np.sum(p * np.log(p / q), -1)), rtol=1e-4)
    # logits that are a kernel softmax's: the generating tau is selected, at divergence 0.
    assert float(select_temperature(cosines / 0.3, cosines, grid)) == pytest.approx(0.3)
    assert abs(float(kernel_softmax_divergence(cosines / 0.3, cosines, grid)[1])) < 1e-5


def test_bad_shapes_raise_naming_the_argument():
    logits = jnp.zeros((2, 5))
    with pytest.raises(ValueError, match="logits and cosines"):
        kernel_softmax_divergence(logits, jnp.zeros((2, 4)), jnp.array([1.0]))
    with pytest.raises(ValueError, match="temperatures"):
        select_temperature(logits, logits, jnp.ones((2, 2)))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_temperatures_must_be_positive(bad):
    """A zero temperature gave a NaN divergence, and ``select_temperature`` chose it (argmin
    takes NaN as the least); a negative one gave a finite divergence of a meaningless proposal.
    Concrete ones raise; inside ``jit`` their divergences are NaN and never chosen."""
    cosines = jnp.tanh(jax.random.normal(jax.random.key(1), (4, 9)))
    grid = jnp.array([bad, 0.3, 1.0])
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        kernel_softmax_divergence(cosines / 0.3, cosines, grid)
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        select_temperature(cosines / 0.3, cosines, grid)
    traced = jax.jit(kernel_softmax_divergence)(cosines / 0.3, cosines, grid)
    assert np.isnan(traced[0]) and np.all(np.isfinite(traced[1:]))
    assert float(jax.jit(select_temperature)(cosines / 0.3, cosines, grid)) == pytest.approx(0.3)


def test_a_non_finite_row_is_left_out_not_poisoning_every_temperature():
    """One NaN row made every temperature's divergence NaN and ``select_temperature`` returned
    the grid's first entry whatever the other rows said. The row is now left out of the mean:
    the divergences are those of the finite rows alone, eagerly and under ``jit``."""
    cosines = jnp.tanh(jax.random.normal(jax.random.key(1), (4, 9)))
    grid = jnp.array([0.1, 0.3, 1.0])
    clean = kernel_softmax_divergence(cosines[1:] / 0.3, cosines[1:], grid)
    for bad_logits, bad_cosines in [
        ((cosines / 0.3).at[0, 2].set(jnp.nan), cosines),
        (cosines / 0.3, cosines.at[0, 5].set(jnp.inf)),
    ]:
        for function in (kernel_softmax_divergence, jax.jit(kernel_softmax_divergence)):
            np.testing.assert_allclose(function(bad_logits, bad_cosines, grid), clean, rtol=1e-5)
        assert float(select_temperature(bad_logits, bad_cosines, grid)) == pytest.approx(0.3)
    all_bad = jnp.full((2, 9), jnp.nan)
    assert np.all(np.isnan(kernel_softmax_divergence(all_bad, all_bad, grid)))
