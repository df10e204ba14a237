"""Facts about the devices JAX runs on that more than one subpackage asks for."""

from __future__ import annotations

import functools

import jax


@functools.cache
def cuda_capability() -> tuple[int, int] | None:
    """(major, minor) compute capability of the first CUDA device, or None without one (asked
    once per process)."""
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        return None
    major, minor = str(getattr(device, "compute_capability", "0.0")).split(".")[:2]
    return int(major), int(minor)
