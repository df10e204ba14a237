"""The layers of ``docs/architecture.md``, checked on every import statement of the code.

Read from the source (``ast``, every import, also those inside functions): a subpackage of
``rfjax`` imports only subpackages of lower layers (``LAYERS``) and only their public names
(never ``rfjax.<other>._<module>``); ``experiments/`` and ``benchmarks/`` import no private
``rfjax`` module, and ``benchmarks/`` no study (a package of ``experiments/`` other than
``core``). A study's test files (``experiments/<study>/test_*.py``) are tests, not experiment
code: like ``tests/``, they may reach into private modules. ``PENDING`` lists the imports that
break a rule today with the work that removes them; an entry that no longer occurs fails too, so
the list only shrinks.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

from tests.support import ROOT

# Layer of each subpackage: one imports only those of lower layers. ``rfjax/_*.py`` (validation,
# the registry, key helpers) serve every layer and import none.
LAYERS = {
    "ops": 0,
    "kernels": 0,
    "data": 0,
    "projections": 1,
    "features": 2,
    "theory": 3,
    "attention": 3,
    "sampled_softmax": 3,
    "linear_models": 3,
    "nn": 4,
    "sklearn": 4,
}

# (file, imported module): imports that break a rule today, and why they are still there.
PENDING: set[tuple[str, str]] = set()


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` gives ``a`` and ``a.b``: b may be a
    module)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def _files(folder: str) -> list[pathlib.Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _private_part(module: str) -> str | None:
    """``module`` up to its first private part (``rfjax.ops._fwht`` of
    ``rfjax.ops._fwht.resolve``), or None if it names no private part."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_"):
            return ".".join(parts[: i + 1])
    return None


def _study(module: str) -> str | None:
    """``experiments.<study>`` if ``module`` is in a study package, else None."""
    parts = module.split(".")
    study = len(parts) > 1 and parts[0] == "experiments" and parts[1] != "core"
    if study and (ROOT / "experiments" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return None


def _violations() -> set[tuple[str, str]]:
    """(file, module) for every import that breaks a rule of the module docstring."""
    found = set()
    for path in _files("rfjax"):
        relative = str(path.relative_to(ROOT))
        parts = path.relative_to(ROOT / "rfjax").parts
        if len(parts) == 1:  # rfjax/__init__.py imports every subpackage lazily
            if path.stem != "__init__":  # rfjax/_*.py serve every layer: they import none
                found.update((relative, m) for m in _imports(path) if m.startswith("rfjax"))
            continue
        own = parts[0]
        for module in _imports(path):
            names = module.split(".")
            if names[0] != "rfjax" or len(names) < 2 or names[1] == own:
                continue
            if names[1].startswith("_"):
                continue  # rfjax/_validation.py and the like: helpers of every layer
            private = _private_part(module)
            if private is not None:
                found.add((relative, private))
            elif names[1] not in LAYERS or LAYERS[names[1]] >= LAYERS[own]:
                found.add((relative, ".".join(names[:2])))
    for folder in ("experiments", "benchmarks"):
        for path in _files(folder):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("benchmarks", "gpu_runs"):
                continue  # the scripts of committed runs, as they ran at their commit
            if folder == "experiments" and path.name.startswith("test_"):
                continue  # a study's tests
            for module in _imports(path):
                private = _private_part(module) if module.startswith("rfjax.") else None
                study = _study(module) if folder == "benchmarks" else None
                found.update((str(relative), m) for m in (private, study) if m is not None)
    return found


def test_every_subpackage_has_a_layer():
    packages = {p.name for p in (ROOT / "rfjax").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_imports_follow_the_layers():
    new = _violations() - PENDING
    assert not new, sorted(new)


def test_pending_imports_are_still_there():
    """A pending entry that no longer occurs is removed from ``PENDING`` (the list shrinks)."""
    gone = PENDING - _violations()
    assert not gone, sorted(gone)


@pytest.mark.parametrize(
    ("path", "module", "broken"),
    [
        ("rfjax/nn/_x.py", "rfjax.features._protocol", True),
        ("benchmarks/x.py", "rfjax.ops._fwht", True),
        ("benchmarks/x.py", "experiments.lstm_lm", True),
        ("benchmarks/x.py", "experiments.core.stats", False),
        ("experiments/lstm_lm/x.py", "rfjax.features", False),
        ("experiments/lstm_lm/x.py", "rfjax.data._uci", True),
        ("experiments/lstm_lm/test_x.py", "rfjax.data._uci", False),
        ("rfjax/features/_x.py", "rfjax.attention", True),
        ("rfjax/attention/_x.py", "rfjax.sampled_softmax", True),
        ("rfjax/nn/_x.py", "rfjax.attention", False),
        ("rfjax/nn/nnx/_x.py", "rfjax.nn._attention_masks", False),
        ("rfjax/features/_x.py", "rfjax._validation", False),
    ],
)
def test_the_rules_catch_what_they_name(tmp_path, monkeypatch, path, module, broken):
    """The check on a copy of the layout with one module importing ``module``."""
    (tmp_path / "experiments" / "lstm_lm").mkdir(parents=True)
    (tmp_path / "experiments" / "core").mkdir()
    for package in LAYERS:
        (tmp_path / "rfjax" / package).mkdir(parents=True)
        (tmp_path / "rfjax" / package / "__init__.py").write_text("")
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"import {module}\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert (path, module) in _violations() if broken else not _violations()
