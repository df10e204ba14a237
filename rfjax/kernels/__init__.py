"""Exact kernels: the oracles that random-feature estimates are checked against.

Each kernel maps ``x: (..., d)`` and ``y: (..., d)`` (leading axes broadcast) to ``(...)``;
``gram(kernel_fn, x, y, **options)`` forms the ``(n, k)`` matrix for ``x: (n, d)``, ``y: (k, d)``.
"""

from rfjax.kernels._exact import (
    angular,
    arccos,
    gaussian,
    gram,
    linear,
    polynomial,
    softmax,
)

__all__ = [
    "angular",
    "arccos",
    "gaussian",
    "gram",
    "linear",
    "polynomial",
    "softmax",
]
