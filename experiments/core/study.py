"""What a study declares about itself, and the studies found under ``experiments/``.

Every package ``experiments/<name>/`` other than ``core`` is a study, and its ``__init__.py``
declares ``STUDY = Study(...)``: the paper it reproduces (the results page's section), its
place in the page (``order``) and one line on what it reproduces (the README's table). Nothing
lists the studies: ``studies()`` finds them, so a new study is its package and its config.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_STUDIES = ("core",)


@dataclasses.dataclass(frozen=True)
class Study:
    """A study's declaration (``STUDY`` in ``experiments/<name>/__init__.py``).

    Attributes:
      paper: the paper the study reproduces, as the results page's section heading; studies
        with the same ``paper`` share one section.
      order: the study's place on the results page and in the README's table (ascending; a
        section comes where its first study does). Unique across studies.
      reproduces: what the study reproduces, one line of Markdown (the README's table).
    """

    paper: str
    order: int
    reproduces: str

    def __post_init__(self):
        for field in ("paper", "reproduces"):
            value = getattr(self, field)
            if not (isinstance(value, str) and value.strip() and "\n" not in value):
                raise ValueError(f"Study.{field} must be one non-empty line, got {value!r}")
        if not (isinstance(self.order, int) and not isinstance(self.order, bool)):
            raise TypeError(f"Study.order must be an int, got {self.order!r}")


def study_names() -> list[str]:
    """The names of the packages under ``experiments/`` that are studies, sorted."""
    return sorted(
        module.name
        for module in pkgutil.iter_modules([EXPERIMENTS])
        if module.ispkg and module.name not in NOT_STUDIES
    )


def studies() -> dict[str, Study]:
    """Every study's declaration by name, in the declared order.

    Raises:
      ValueError: naming a package that declares no ``STUDY``, or two studies that declare
        the same ``order``.
    """
    found = {}
    for name in study_names():
        declared = getattr(importlib.import_module(f"experiments.{name}"), "STUDY", None)
        if not isinstance(declared, Study):
            raise ValueError(
                f"experiments/{name}/__init__.py must declare STUDY = experiments.core.study."
                f"Study(paper=..., order=..., reproduces=...), got {declared!r}"
            )
        found[name] = declared
    by_order: dict[int, str] = {}
    for name, declared in found.items():
        if declared.order in by_order:
            raise ValueError(
                f"studies {by_order[declared.order]!r} and {name!r} both declare order "
                f"{declared.order}; orders must be distinct"
            )
        by_order[declared.order] = name
    return dict(sorted(found.items(), key=lambda item: item[1].order))


def sections() -> list[tuple[str, list[str]]]:
    """The studies grouped by paper: ``(paper, names)`` pairs, each paper where its first study
    comes in the declared order, its studies in that order."""
    grouped: dict[str, list[str]] = {}
    for name, declared in studies().items():
        grouped.setdefault(declared.paper, []).append(name)
    return list(grouped.items())
