"""``rfjax._validation``: the argument checks behind the public functions' errors return the
value they accept and name the argument, the value and what is allowed when they refuse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import _validation


def test_check_int_accepts_integers_from_the_minimum_and_refuses_bools_and_floats():
    assert _validation.check_int("num_features", np.int64(3), minimum=1) == 3
    assert type(_validation.check_int("num_features", np.int64(3), minimum=1)) is int
    with pytest.raises(ValueError, match="num_features must be an integer >= 1, got 0"):
        _validation.check_int("num_features", 0, minimum=1)
    for bad in (True, 2.0):
        with pytest.raises(TypeError, match="num_features must be an integer >= 1"):
            _validation.check_int("num_features", bad, minimum=1)


def test_check_choice_matches_value_and_type():
    assert _validation.check_choice("side", "query", ("query", "key")) == "query"
    with pytest.raises(ValueError, match="side must be one of 'query', 'key'; got 'value'"):
        _validation.check_choice("side", "value", ("query", "key"))
    with pytest.raises(ValueError, match="order must be one of 0, 1; got True"):
        _validation.check_choice("order", True, (0, 1))  # True == 1, but not an int choice


def test_check_finite_refuses_nan_when_concrete_and_lets_traced_values_through():
    x = jnp.array([1.0, jnp.nan])
    with pytest.raises(ValueError, match="x must contain only finite values"):
        _validation.check_finite("x", x)
    traced = jax.jit(lambda v: _validation.check_finite("x", v))(x)
    assert np.isnan(traced[1])


def test_check_key_takes_one_key_typed_or_raw_and_refuses_a_batch_of_raw_keys():
    assert _validation.check_key("key", jax.random.key(0)).shape == ()
    raw = jax.random.PRNGKey(0)
    assert _validation.check_key("key", raw) is raw
    for batch in (jax.random.split(jax.random.PRNGKey(0), 3), jnp.zeros((4,), jnp.uint32)):
        with pytest.raises(TypeError, match=r"key must be a single JAX PRNG key .* shape \("):
            _validation.check_key("key", batch)


def test_check_rate_takes_zero_and_refuses_one():
    assert _validation.check_rate("dropout_rate", 0) == 0.0
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\)"):
            _validation.check_rate("dropout_rate", bad)


def test_check_array_size_refuses_the_first_byte_past_the_cap():
    cap = _validation.MAX_ARRAY_BYTES
    _validation.check_array_size("W", (cap // 4,), "float32", {"n": cap // 4})
    with pytest.raises(ValueError, match=r"n=536870913 implies W of shape \(536870913,\)"):
        _validation.check_array_size("W", (cap // 4 + 1,), "float32", {"n": cap // 4 + 1})
    with pytest.raises(ValueError, match="the cap is 2 GiB per array"):
        _validation.check_array_size("W", (cap + 1,), "int8", {"n": cap + 1})
