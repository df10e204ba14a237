"""Tests of ``rfjax.features._registry``: names, kernels and factories of the registered feature
maps."""

import pytest

from rfjax import features
from rfjax.features import _registry


def test_registry_names_kernels_and_factories():
    names = features.available()
    for name in ("positive", "positive_antithetic", "trigonometric", "angular_hybrid"):
        assert name in names
        assert features.info(name).kernel == "softmax"
    assert features.info("fourier").kernel == "gaussian"
    assert features.info("relu").kernel is None
    assert set(features.available(kernel="softmax")) < set(names)
    assert "fourier" not in features.available(kernel="softmax")
    assert features.get("positive_antithetic")() == features.PositiveFeatureMap(antithetic=True)
    with pytest.raises(ValueError, match="unknown feature map 'softmax'; available: positive"):
        features.get("softmax")
    with pytest.raises(TypeError, match="string"):
        features.info(3)


def test_register_adds_a_name_and_rejects_bad_entries(monkeypatch):
    registry = _registry._REGISTRY
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    features.register("relu_wide", features.ReluFeatureMap, kernel=None, label="ReLU")
    assert features.available()[-1] == "relu_wide"
    assert features.info("relu_wide").label == "ReLU"
    with pytest.raises(ValueError, match="already registered"):
        features.register("relu_wide", features.ReluFeatureMap, kernel=None, label="ReLU")
    with pytest.raises(TypeError, match="callable"):
        features.register("other", 3, kernel=None, label="x")
    with pytest.raises(ValueError, match="kernel"):
        features.register("other", features.ReluFeatureMap, kernel="laplace", label="x")
    with pytest.raises(TypeError, match="label"):
        features.register("other", features.ReluFeatureMap, kernel=None, label="")
