"""Every docstring example in the ``rfjax`` and ``experiments`` packages runs as a doctest.

The modules are found on disk (every ``rfjax/**/*.py`` and ``experiments/**/*.py`` whose source
holds a ``>>>`` prompt, a study's test files ``experiments/<study>/test_*.py`` aside), so a module
added later is picked up without editing this file. Each
test imports its module and runs every docstring example found in it
(``doctest.DocTestFinder``: the module, its functions, classes and methods, the module's globals
as the examples' namespace), as ``python -m doctest`` would.
"""

from __future__ import annotations

import doctest
import importlib

import jax
import pytest

from tests.support import ROOT
from tests.support.representatives import representatives

PACKAGES = (ROOT / "rfjax", ROOT / "experiments")
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _modules_with_examples() -> list[str]:
    names = []
    paths = [
        path
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if not path.name.startswith("test_")
    ]
    for path in paths:
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()

# Examples that compile a whole model, estimator, decoding loop or Monte Carlo study (5-25 s
# each on two shared cores, measured 2026-11-28): CI runs them (``--runstatistical``), the default
# suite runs every other module's examples, a module added later included.
COMPILE_HEAVY = {
    "rfjax.attention._decode",
    "rfjax.features._dense_exponential",
    "rfjax.linear_models._model",
    "rfjax.nn._attention",
    "rfjax.nn._generate",
    "rfjax.nn._iap",
    "rfjax.nn._performer_lm",
    "rfjax.nn.nnx._vit",
    "rfjax.projections._norm_coupled",
    "rfjax.projections._p_model",
    "rfjax.sampled_softmax._proposal_features",
    "rfjax.sklearn._ridge",
    "rfjax.theory._conformity",
    "rfjax.theory._exponential",
}


def test_examples_are_found():
    # A guard on the discovery itself: the package has dozens of examples in several layers.
    layers = {name.split(".")[1] for name in MODULES}
    assert {"projections", "features", "attention", "theory", "core"} <= layers, MODULES


@pytest.mark.parametrize("module_name", representatives(MODULES, set(MODULES) - COMPILE_HEAVY))
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(module) if t.examples]
    assert tests, f"{module_name} has a '>>>' that doctest does not collect"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    x64 = jax.config.jax_enable_x64
    try:
        for test in tests:
            runner.run(test, out=report.append)
    finally:
        # An example may switch x64 on; the rest of the suite must not see it.
        jax.config.update("jax_enable_x64", x64)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, "".join(report)
