"""The C++ CPU kernel behind ``fwht``, registered with XLA through ``jax.ffi`` (stub)."""

from __future__ import annotations


def is_available() -> bool:
    """Whether the compiled kernel was built and registered."""
    return False


def fwht_rows(x, normalize):
    raise NotImplementedError("the C++ kernel is not built")
