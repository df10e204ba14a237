"""Tests of ``rfjax.attention._implementations``: the table of FAVOR attention implementations,
``"auto"``'s choice from measured runs only, and the errors for unknown names and platforms."""

import pytest

from rfjax.attention import _implementations


def test_auto_is_xla_where_nothing_was_measured_and_the_measured_choice_elsewhere(monkeypatch):
    xla = _implementations.TABLE["xla"]
    assert _implementations.resolve("auto", "cpu", causal=True) == xla
    monkeypatch.setitem(_implementations.AUTO, ("tpu", "causal"), "pallas_tpu")
    assert _implementations.resolve("auto", "tpu", causal=True).backend.compiler == "tpu"
    assert _implementations.resolve("auto", "tpu", causal=False) == xla  # not measured


def test_every_implementation_but_auto_has_one_entry():
    assert set(_implementations.TABLE) == set(_implementations.IMPLEMENTATIONS) - {"auto"}
    for name, entry in _implementations.TABLE.items():
        if not entry.platforms:  # runs anywhere, this CPU included
            assert _implementations.resolve(name, "cpu", causal=False) == entry


def test_unknown_names_and_foreign_platforms_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'xla'"):
        _implementations.resolve("pallas", "cpu", causal=True)
    with pytest.raises(ValueError, match="compiles for gpu, not for platform 'cpu'"):
        _implementations.resolve("pallas_triton", "cpu", causal=True)
