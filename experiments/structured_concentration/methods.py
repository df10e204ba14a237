"""Structured concentration's methods: the P-model families, with or without HD preprocessing."""

from __future__ import annotations

import ml_collections

from rfjax import projections

FAMILIES: dict[str, projections.PModel] = {
    "gaussian": projections.IndependentRows(),
    "circulant": projections.Circulant(),
    "skew_circulant": projections.SkewCirculant(),
    "toeplitz": projections.Toeplitz(),
    "hankel": projections.Hankel(),
    "ldr1": projections.LowDisplacementRank(rank=1),
    "ldr2": projections.LowDisplacementRank(rank=2),
    "ldr4": projections.LowDisplacementRank(rank=4),
}
LABELS = {
    "gaussian": "Gaussian",
    "circulant": "circulant",
    "skew_circulant": "skew-circulant",
    "toeplitz": "Toeplitz",
    "hankel": "Hankel",
    "ldr1": "LDR r=1",
    "ldr2": "LDR r=2",
    "ldr4": "LDR r=4",
}
REFERENCE = "gaussian"


def method_name(family: str, preprocess: bool) -> str:
    return f"{family}_hd" if preprocess else family


def methods(config: ml_collections.ConfigDict) -> list[tuple[str, str, bool]]:
    """``(name, family, preprocess)`` for every family and preprocessing choice."""
    return [
        (method_name(family, preprocess), family, preprocess)
        for family in config.families
        for preprocess in config.preprocess
    ]
