"""Random draws compiled for their size, not their rank.

``jax.random`` samplers count their random bits over the flattened index of ``shape``, so a draw
of shape ``(a, b, c)`` equals the same draw of shape ``(a * b * c,)`` reshaped. XLA compiles the
flat form faster on CPU: a rank-3 normal draw of 8,192 values took 0.24 s of CPU to compile and
its flat form 0.09 s (jax 0.12, 2 cores; ``benchmarks/cold_start.py`` times the first draws). The
couplings draw through ``flat``, which returns the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax


def flat(
    sampler: Callable[..., jax.Array],
    key: jax.Array,
    shape: tuple[int, ...],
    *args: Any,
    **kwargs: Any,
) -> jax.Array:
    """``sampler(key, shape, *args, **kwargs)``, drawn as a vector and reshaped (same values).

    Args:
      sampler: a ``jax.random`` sampler whose second argument is the shape (``normal``,
        ``uniform``, ``rademacher``, ...).
      key: its PRNG key.
      shape: the shape of the draw.
      *args, **kwargs: its other arguments (dtype, bounds).

    Returns:
      The draw, of shape ``shape``.

    Examples:
      >>> import jax
      >>> key = jax.random.key(0)
      >>> bool((flat(jax.random.normal, key, (2, 3, 4)) == jax.random.normal(key, (2, 3, 4))).all())
      True
    """
    return sampler(key, (math.prod(shape),), *args, **kwargs).reshape(shape)
