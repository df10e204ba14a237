"""``benchmarks.favor_precision``'s emulation of reduced-precision float32 products: the rounding
of the projection's operands and the float64 estimator it feeds."""

import numpy as np

from benchmarks import favor_precision


def test_rounding_keeps_the_mantissa_bits_asked_for():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    for bits in favor_precision.ROUNDINGS.values():
        narrow = favor_precision.rounded(x, bits)
        assert np.abs(narrow - x).max() <= 2.0 ** -(bits + 1) * np.abs(x).max()
        assert np.all(np.abs(narrow - x) <= 2.0 ** -(bits + 1) * np.abs(x))  # to nearest
        assert np.array_equal(favor_precision.rounded(narrow, bits), narrow)  # representable
    assert favor_precision.rounded(np.float32(1 + 2**-11), 10) == np.float32(1 + 2**-10)  # tie


def test_the_estimator_with_every_bit_kept_is_the_estimator():
    rng = np.random.default_rng(1)
    head = favor_precision.HEAD_DIM
    q, k, v = (rng.standard_normal((12, head)) for _ in range(3))
    weights = rng.standard_normal((favor_precision.NUM_FEATURES, head)).astype(np.float32)
    weights = weights.astype(np.float64)
    for causal in (True, False):
        plain = favor_precision.estimator(q, k, v, weights, causal, None)
        kept = favor_precision.estimator(q.astype(np.float32), k, v, weights, causal, 23)
        np.testing.assert_allclose(kept, plain, rtol=1e-5, atol=1e-6)
        if causal:  # the first row reads its own value only
            np.testing.assert_allclose(plain[0], v[0])
