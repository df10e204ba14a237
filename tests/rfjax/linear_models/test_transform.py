"""Tests of ``rfjax.linear_models._transform``: the native kernel of a feature map, and a
softmax-kernel map turned into features of the Gaussian kernel."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureTransform,
    native_kernel,
)


def test_native_kernel():
    assert native_kernel(features.get("fourier")()) == "gaussian"
    assert native_kernel(features.get("positive_antithetic")()) == "softmax"
    with pytest.raises(ValueError, match="not a registered map"):
        native_kernel(features.get("relu")())


def test_a_softmax_map_gives_the_gaussian_kernel_through_its_log_space_form():
    """K(x, y) = e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2}, u = x / l: the trigonometric features of
    the softmax kernel, e^{|u|^2/2} [sin, cos](W u) / sqrt(m), become exactly the random Fourier
    features of the same projection."""
    projection = projections.orthogonal(jax.random.key(0), 5, 8)
    x = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    transforms = [
        RandomFeatureTransform(projection, features.get(name)(), 1.7, "gaussian")
        for name in ("trigonometric", "fourier")
    ]
    trigonometric, fourier = (np.asarray(transform(x)) for transform in transforms)
    np.testing.assert_allclose(trigonometric, fourier, rtol=1e-5, atol=1e-6)
