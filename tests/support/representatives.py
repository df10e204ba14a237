"""The default suite's representative cases of a parametrised check (issue 33 point 6).

A check parametrised over a registry (every coupling, every feature map) or over settings runs
all its cases in CI (``--runstatistical``, ``.ci/run``), and in the default suite (``pytest``)
only the representatives a test file names: one case per code path (a Gaussian, an orthogonal
and a simplex coupling; an exponential, a signed and a hybrid map, ...), so that a contributor's
suite stays within its five minutes. The others are marked ``statistical``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import pytest


def representatives(
    cases: Iterable[Any],
    keep: Collection[Any],
    *,
    key: Callable[[Any], Any] = lambda case: case,
    unpack: bool = False,
) -> list[Any]:
    """``cases`` for ``pytest.mark.parametrize``: those whose ``key`` is in ``keep`` as they
    are, every other one as a ``pytest.param`` marked ``statistical``.

    With ``unpack``, each case is a tuple of several arguments (``parametrize`` with several
    names); otherwise a case is one argument, a tuple or not. Every name in
    ``keep`` must be a case's key, so that a misspelt or renamed representative fails here
    instead of leaving the check out of the default suite.
    """
    cases = list(cases)
    unknown = set(keep) - {key(case) for case in cases}
    if unknown:
        raise ValueError(f"representatives {sorted(map(str, unknown))} are not among the cases")
    return [
        case
        if key(case) in keep
        else pytest.param(*(case if unpack else (case,)), marks=pytest.mark.statistical)
        for case in cases
    ]
