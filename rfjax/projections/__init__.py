"""Couplings: samplers ``(key, dim, num_features, *, dtype) -> Projection``.

A coupling decides how the m projection vectors w_1..w_m are drawn jointly. For the couplings
listed by ``marginally_exact()`` every row is exactly N(0, I_d), so every feature map stays
unbiased and the coupling only changes the variance. The fast structured couplings whose
directions come from HD products or Givens layers (``hd_orthogonal``, ``fast_simplex``,
``givens``) are only approximately Haar: their estimates are approximately unbiased (their
docstrings quantify it).

Structured Gaussian matrices in the P-model of Choromanski & Fagan (rows g^T P_i from a budget of
randomness g): ``p_model`` builds a projection from P_i given densely or from a ``PModel``
family; ``circulant``, ``skew_circulant``, ``toeplitz``, ``hankel`` and
``low_displacement_rank`` are its instances, applied by FFT.

Names for configs: ``get("simplex")`` returns the sampler; ``available()`` lists the names;
``info(name)`` gives what else the registry knows (exact marginals, minimum dimension, label);
``register`` adds a coupling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rfjax._registry import Registry
from rfjax._validation import check_bool, check_int
from rfjax.projections._base import DenseProjection, Projection
from rfjax.projections._dense import (
    SIMPLEX_MIN_DIM,
    apply_simplex,
    gaussian,
    orthogonal,
    simplex,
    simplex_directions,
    simplex_plus,
)
from rfjax.projections._givens import GivensProjection, givens
from rfjax.projections._halton import halton
from rfjax.projections._norm_coupled import antithetic_chi_norms, norm_coupled
from rfjax.projections._p_model import (
    Circulant,
    DenseMatrices,
    Hankel,
    IndependentRows,
    LowDisplacementRank,
    PModel,
    PModelProjection,
    SkewCirculant,
    Toeplitz,
    circulant,
    hankel,
    low_displacement_rank,
    p_model,
    p_model_violations,
    skew_circulant,
    toeplitz,
)
from rfjax.projections._structured import HadamardProjection, fast_simplex, hd_orthogonal

Sampler = Callable[..., Projection]


@dataclasses.dataclass(frozen=True)
class CouplingInfo:
    """What the registry knows about a named coupling.

    Attributes:
      name: the config name.
      sampler: ``(key, dim, num_features, *, dtype) -> Projection``.
      exact_marginals: whether every row it draws is exactly N(0, I_d) (``False`` for
        approximately Haar constructions).
      min_dim: the smallest input dimension d it accepts (2 for the simplex constructions).
      label: a short name for tables and legends (the papers' names).
    """

    name: str
    sampler: Sampler
    exact_marginals: bool
    min_dim: int
    label: str


_REGISTRY: Registry[CouplingInfo] = Registry("coupling")


def register(
    name: str, sampler: Sampler, *, exact_marginals: bool = True, min_dim: int = 1, label: str
) -> None:
    """Registers ``sampler`` under ``name`` (an error if the name is taken).

    Args:
      name: the config name.
      sampler: ``(key, dim, num_features, *, dtype) -> Projection``.
      exact_marginals: whether every row it draws is exactly N(0, I_d); ``False`` for
        approximately Haar constructions (see ``marginally_exact``).
      min_dim: the smallest input dimension the sampler accepts.
      label: a short name for tables and legends.

    Raises:
      TypeError: for a name or label that is not a non-empty string, a sampler that is not
        callable, a non-bool ``exact_marginals`` or a non-integer ``min_dim``.
      ValueError: if the name is taken or ``min_dim < 1``.
    """
    if not callable(sampler):
        raise TypeError(f"sampler for {name!r} must be callable, got {type(sampler).__name__}")
    exact_marginals = check_bool("exact_marginals", exact_marginals)
    min_dim = check_int("min_dim", min_dim, minimum=1)
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a non-empty string, got {label!r}")
    _REGISTRY.add(name, CouplingInfo(name, sampler, exact_marginals, min_dim, label))


def available() -> tuple[str, ...]:
    """Names of the registered couplings, in registration order."""
    return _REGISTRY.names()


def marginally_exact() -> tuple[str, ...]:
    """Names of the couplings whose every row is exactly N(0, I_d) (registration order)."""
    return tuple(name for name, entry in _REGISTRY.items() if entry.exact_marginals)


def info(name: str) -> CouplingInfo:
    """The registry entry of ``name`` (sampler, exact marginals, minimum dimension, label).

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no coupling has that name; the message lists the known names.

    Examples:
      >>> from rfjax import projections
      >>> projections.info("simplex").min_dim, projections.info("simplex").label
      (2, 'SimRF')
    """
    return _REGISTRY.get(name)


def get(name: str) -> Sampler:
    """The sampler registered under ``name``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no coupling has that name; the message lists the known names.
    """
    return info(name).sampler


# One call per coupling (registration order is the order of ``available()``).
register("gaussian", gaussian, label="IID")
register("orthogonal", orthogonal, label="ORF")
register("simplex", simplex, min_dim=SIMPLEX_MIN_DIM, label="SimRF")
register("simplex_plus", simplex_plus, min_dim=SIMPLEX_MIN_DIM, label="SimRF+")
register("halton", halton, label="Halton")
register("hd_orthogonal", hd_orthogonal, exact_marginals=False, label="ORF (fast)")
register(
    "fast_simplex",
    fast_simplex,
    exact_marginals=False,
    min_dim=SIMPLEX_MIN_DIM,
    label="SimRF (fast)",
)
register("circulant", circulant, label="circulant")
register("toeplitz", toeplitz, label="Toeplitz")
register("hankel", hankel, label="Hankel")
register("givens", givens, exact_marginals=False, label="Givens")
register("skew_circulant", skew_circulant, label="skew-circulant")
register("low_displacement_rank", low_displacement_rank, label="low displacement rank")
register("norm_coupled", norm_coupled, label="norm-coupled ORF")


__all__ = [
    "Circulant",
    "CouplingInfo",
    "DenseMatrices",
    "DenseProjection",
    "GivensProjection",
    "HadamardProjection",
    "Hankel",
    "IndependentRows",
    "LowDisplacementRank",
    "PModel",
    "PModelProjection",
    "Projection",
    "Sampler",
    "SkewCirculant",
    "Toeplitz",
    "antithetic_chi_norms",
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
    "info",
    "low_displacement_rank",
    "marginally_exact",
    "norm_coupled",
    "orthogonal",
    "p_model",
    "p_model_violations",
    "register",
    "simplex",
    "simplex_directions",
    "simplex_plus",
    "skew_circulant",
    "toeplitz",
]
