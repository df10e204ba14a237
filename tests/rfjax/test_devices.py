"""Tests of ``rfjax._devices``: the facts about devices that several subpackages ask for."""

import types

import jax
import pytest

from rfjax import _devices


@pytest.fixture
def asked_afresh():
    """``cuda_capability`` asked anew (it caches its answer for the process)."""
    _devices.cuda_capability.cache_clear()
    yield _devices.cuda_capability
    _devices.cuda_capability.cache_clear()


def test_no_cuda_device_has_no_capability(asked_afresh):
    assert jax.default_backend() == "cpu"
    assert asked_afresh() is None


def test_the_capability_is_read_from_the_first_cuda_device(asked_afresh, monkeypatch):
    devices = {"cuda": [types.SimpleNamespace(compute_capability="8.6")]}
    monkeypatch.setattr(jax, "devices", lambda backend=None: devices[backend])
    assert asked_afresh() == (8, 6)
