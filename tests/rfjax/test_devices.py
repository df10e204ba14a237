"""Tests of ``rfjax._devices``: the facts about devices that several subpackages ask for."""

import types

import jax

from rfjax import _devices


def test_no_cuda_device_has_no_capability():
    assert jax.default_backend() == "cpu"
    assert _devices.cuda_capability() is None


def test_the_capability_is_read_from_the_first_cuda_device(monkeypatch):
    devices = {"cuda": [types.SimpleNamespace(compute_capability="9.0")]}
    monkeypatch.setattr(jax, "devices", lambda backend=None: devices[backend])
    assert _devices.cuda_capability() == (9, 0)
    devices["cuda"] = [types.SimpleNamespace(compute_capability="8.6")]
    assert _devices.cuda_capability() == (8, 6)
