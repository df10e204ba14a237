"""The claims a config declares before its runs (``config.claims``, each built with
``configs.common.claim``): what is claimed, the test that judges it (``TESTS``), its margin and
confidence, and how an ordering over cells is pooled. ``experiments.core.verdicts`` judges a
study's measured effects against them; ``declared`` checks a config's claims before anything
runs (``experiments.main``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import ml_collections

# test -> (default confidence, whether it needs a margin > 0, what it claims about the effect)
TESTS = {
    "greater": (0.95, False, "the effect is > 0"),
    "less": (0.95, False, "the effect is < 0"),
    "noninferior": (0.95, True, "the effect is > -margin (higher is better)"),
    "nonsuperior": (0.95, True, "the effect is < +margin (lower is better)"),
    "equivalent": (0.90, True, "the effect is within ±margin (two one-sided tests)"),
    "within_se": (0.95, False, "the effect is within k SE of 0 (agreement with a reference)"),
    "fact": (0.95, False, "a deterministic statement (a closed form, a graph colouring): no noise"),
}


POOLINGS = ("equal", "precision")


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim as its config declares it (see ``configs.common.claim``).

    Attributes:
      statement: the claim in words, with its source.
      test: one of ``TESTS``.
      margin: the size of an effect against the claim that refutes it (>= 0; in the effect's
        units, or a fraction of a reference value when ``relative``).
      relative: whether ``margin`` is a fraction of a reference the study passes.
      confidence: the interval's coverage (0 for the test's default: 0.90 for equivalence,
        i.e. TOST at 5%, 0.95 otherwise).
      k: for ``within_se``, the number of SEs that count as agreement.
      pooling: how an ordering over cells weights them: ``"equal"`` (the plain mean effect over
        the cells) or ``"precision"`` (weights 1 / se^2: for cells whose noise differs by orders
        of magnitude, e.g. Monte Carlo cells with heavy tails).
    """

    statement: str
    test: str
    margin: float = 0.0
    relative: bool = False
    confidence: float = 0.0
    k: float = 3.0
    pooling: str = "equal"

    def __post_init__(self):
        if self.test not in TESTS:
            raise ValueError(f"claim test must be one of {tuple(TESTS)}, got {self.test!r}")
        if not (isinstance(self.margin, (int, float)) and self.margin >= 0):
            raise ValueError(f"claim margin must be a number >= 0, got {self.margin!r}")
        if TESTS[self.test][1] and not self.margin > 0:
            raise ValueError(f"a {self.test!r} claim needs a margin > 0, got {self.margin!r}")
        if not (self.confidence == 0 or 0 < self.confidence < 1):
            raise ValueError(f"claim confidence must be in (0, 1) or 0, got {self.confidence!r}")
        if not self.k > 0:
            raise ValueError(f"claim k must be > 0, got {self.k!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"claim pooling must be one of {POOLINGS}, got {self.pooling!r}")

    @property
    def level(self) -> float:
        """The interval's coverage."""
        return self.confidence or TESTS[self.test][0]

    @classmethod
    def from_config(cls, entry: ml_collections.ConfigDict | Mapping) -> Claim:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = dict(entry)
        unknown = set(values) - fields
        if unknown:
            raise ValueError(f"claim fields {sorted(unknown)} are not among {sorted(fields)}")
        return cls(**values)


def declared(config: ml_collections.ConfigDict) -> dict[str, Claim]:
    """The claims ``config`` declares, checked (``ValueError`` naming the claim)."""
    if "claims" not in config:
        raise ValueError("config.claims is missing: declare the claims before the run")
    claims = {}
    for name, entry in config.claims.items():
        try:
            claims[name] = Claim.from_config(entry)
        except (TypeError, ValueError) as error:
            raise ValueError(f"config.claims.{name}: {error}") from None
    if not isinstance(config.get("powered", True), bool):
        raise TypeError(f"config.powered must be a bool, got {config.powered!r}")
    return claims
