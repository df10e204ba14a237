"""Tests of ``rfjax.linear_models._transform``: the native kernel of a feature map."""

from __future__ import annotations

import pytest

from rfjax import features
from rfjax.linear_models import (
    native_kernel,
)


def test_native_kernel():
    assert native_kernel(features.get("fourier")()) == "gaussian"
    assert native_kernel(features.get("positive_antithetic")()) == "softmax"
    with pytest.raises(ValueError, match="not a registered map"):
        native_kernel(features.get("relu")())
