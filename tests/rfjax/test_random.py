"""``rfjax._random.flat``: a draw made flat and reshaped equals JAX's draw of that shape (the
couplings draw this way because it compiles faster; ``benchmarks/cold_start.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax._random import flat


@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize(
    ("sampler", "args", "kwargs"),
    [
        (jax.random.normal, (jnp.float32,), {}),
        (jax.random.uniform, (jnp.float32,), {"maxval": 2.0}),
        (jax.random.rademacher, (jnp.float32,), {}),
    ],
)
def test_flat_draw_equals_shaped_draw(sampler, args, kwargs, partitionable):
    key = jax.random.key(7)
    with jax.threefry_partitionable(partitionable):
        for shape in [(3,), (2, 5), (2, 3, 4), (1, 0, 3)]:
            np.testing.assert_array_equal(
                flat(sampler, key, shape, *args, **kwargs), sampler(key, shape, *args, **kwargs)
            )
