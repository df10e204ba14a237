"""Tests of ``rfjax.theory._bucketing``: eager inputs are broadcast, flattened and padded to a
power-of-two size class (at least ``SMALLEST_BUCKET``), the result cut back; traced inputs pass
through unpadded."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.theory._bucketing import SMALLEST_BUCKET, call_bucketed


def _recording_kernel(seen: list):
    def kernel(scale, a, b):
        seen.append(a.shape)
        return scale * a + b

    return kernel


def test_eager_inputs_are_padded_to_a_size_class_and_cut_back():
    seen = []
    a = jnp.arange(3.0).reshape(3, 1)
    b = jnp.arange(4.0)
    out = call_bucketed(_recording_kernel(seen), (2.0,), (a, b))
    np.testing.assert_array_equal(out, 2.0 * a + b)  # the broadcast shape (3, 4)
    big = jnp.ones(SMALLEST_BUCKET + 1)
    np.testing.assert_array_equal(call_bucketed(_recording_kernel(seen), (1.0,), (big, big)), 2.0)
    scalar = call_bucketed(_recording_kernel(seen), (1.0,), (jnp.asarray(1.5), jnp.asarray(0.5)))
    assert scalar.shape == () and float(scalar) == 2.0
    assert seen == [(SMALLEST_BUCKET,), (2 * SMALLEST_BUCKET,), (SMALLEST_BUCKET,)]


def test_traced_inputs_are_broadcast_but_not_padded():
    seen = []
    out = jax.jit(lambda a, b: call_bucketed(_recording_kernel(seen), (3.0,), (a, b)))(
        jnp.ones((2, 1)), jnp.ones(5)
    )
    assert seen == [(2, 5)]
    np.testing.assert_array_equal(out, np.full((2, 5), 4.0))
