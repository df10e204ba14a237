"""``rfjax._tensor_cores``: the exact bfloat16 split of float32 operands."""

import jax.numpy as jnp
import numpy as np

from rfjax._tensor_cores import bfloat16_parts


def test_bfloat16_parts_sum_to_the_float32_value_exactly():
    x = jnp.asarray(np.random.default_rng(2).standard_normal(1000).astype(np.float32) * 1e3)
    parts = bfloat16_parts(x)
    assert all(p.dtype == jnp.bfloat16 for p in parts)
    total = sum(p.astype(jnp.float32) for p in parts)
    np.testing.assert_array_equal(total, x)
