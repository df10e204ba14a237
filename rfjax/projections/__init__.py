"""Couplings: samplers ``(key, dim, num_features, *, dtype) -> Projection``.

A coupling decides how the m projection vectors w_1..w_m are drawn jointly. For the couplings
listed by ``marginally_exact()`` every row is exactly N(0, I_d), so every feature map stays
unbiased and the coupling only changes the variance. The fast structured couplings whose
directions come from HD products or Givens layers (``hd_orthogonal``, ``fast_simplex``,
``givens``) are only approximately Haar: their estimates are approximately unbiased (their
docstrings quantify it).

Names for configs: ``get("simplex")`` returns the sampler; ``available()`` lists the names.
"""

from __future__ import annotations

from collections.abc import Callable

from rfjax.projections._base import DenseProjection, Projection
from rfjax.projections._dense import (
    apply_simplex,
    gaussian,
    orthogonal,
    simplex,
    simplex_directions,
    simplex_plus,
)
from rfjax.projections._givens import GivensProjection, givens
from rfjax.projections._halton import halton
from rfjax.projections._structured import (
    HadamardProjection,
    StructuredGaussianProjection,
    circulant,
    fast_simplex,
    hankel,
    hd_orthogonal,
    toeplitz,
)

Sampler = Callable[..., Projection]

_REGISTRY: dict[str, Sampler] = {
    "gaussian": gaussian,
    "orthogonal": orthogonal,
    "simplex": simplex,
    "simplex_plus": simplex_plus,
    "halton": halton,
    "hd_orthogonal": hd_orthogonal,
    "fast_simplex": fast_simplex,
    "circulant": circulant,
    "toeplitz": toeplitz,
    "hankel": hankel,
    "givens": givens,
}


_APPROXIMATE: set[str] = {"hd_orthogonal", "fast_simplex", "givens"}


def marginally_exact() -> tuple[str, ...]:
    """Names of the couplings whose every row is exactly N(0, I_d) (registration order)."""
    return tuple(name for name in _REGISTRY if name not in _APPROXIMATE)


def available() -> tuple[str, ...]:
    """Names of the registered couplings, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Sampler:
    """The sampler registered under ``name``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no coupling has that name; the message lists the known names.
    """
    if not isinstance(name, str):
        raise TypeError(f"coupling name must be a string, got {type(name).__name__}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown coupling {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name]


def register(name: str, sampler: Sampler, *, exact_marginals: bool = True) -> None:
    """Registers ``sampler`` under ``name`` (an error if the name is taken).

    Args:
      name: the config name.
      sampler: ``(key, dim, num_features, *, dtype) -> Projection``.
      exact_marginals: whether every row it draws is exactly N(0, I_d); ``False`` for
        approximately Haar constructions (see ``marginally_exact``).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"coupling name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"coupling {name!r} is already registered")
    if not callable(sampler):
        raise TypeError(f"sampler for {name!r} must be callable, got {type(sampler).__name__}")
    _REGISTRY[name] = sampler
    if not exact_marginals:
        _APPROXIMATE.add(name)


__all__ = [
    "DenseProjection",
    "GivensProjection",
    "HadamardProjection",
    "Projection",
    "Sampler",
    "StructuredGaussianProjection",
    "apply_simplex",
    "available",
    "circulant",
    "fast_simplex",
    "gaussian",
    "get",
    "givens",
    "halton",
    "hankel",
    "hd_orthogonal",
    "marginally_exact",
    "orthogonal",
    "register",
    "simplex",
    "simplex_directions",
    "simplex_plus",
    "toeplitz",
]
