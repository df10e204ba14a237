"""Fixtures of the tests of ``rfjax``."""

import jax
import pytest


@pytest.fixture
def float64():
    """Run a test with ``jax_enable_x64``: the closed forms are checked in float64."""
    with jax.enable_x64(True):
        yield
