"""``rfjax._registry.Registry``: entries by name in registration order, with errors that name
the kind of entry and the registered choices."""

import pytest

from rfjax._registry import Registry


def test_entries_keep_registration_order_and_are_found_by_name():
    registry = Registry[int]("coupling")
    registry.add("b", 2)
    registry.add("a", 1)
    assert registry.names() == ("b", "a")
    assert registry.items() == (("b", 2), ("a", 1))
    assert registry.get("a") == 1


def test_errors_name_the_kind_the_value_and_the_choices():
    registry = Registry[int]("feature map")
    registry.add("positive", 1)
    with pytest.raises(ValueError, match="feature map 'positive' is already registered"):
        registry.add("positive", 2)
    with pytest.raises(TypeError, match="feature map name must be a non-empty string"):
        registry.add("", 3)
    with pytest.raises(ValueError, match="unknown feature map 'nope'; available: positive"):
        registry.get("nope")
    with pytest.raises(TypeError, match="feature map name must be a string, got int"):
        registry.get(3)
    assert registry.get("positive") == 1  # a rejected add changes nothing
