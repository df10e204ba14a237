"""The architecture page's two worked extensions, kept as patches in ``docs/examples/`` (issue
45): ``new_study.patch`` adds a study (its package and its config, nothing else) and
``new_fwht_backend.patch`` an FWHT backend (its kernel file, one registry entry and its own test
file). Each patch touches exactly those paths and applies to this checkout; applied to a copy of
it, the generic tests pick the new study or backend up by name and pass, with no list edited
anywhere. A change that made either extension touch another file fails here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT

EXAMPLES = ROOT / "docs" / "examples"

# patch -> (the paths it touches, each only by adding lines; the new study's or backend's name;
# the tests run on the patched copy; how many of them at least must name it and pass).
CASES = {
    "new_study.patch": (
        {
            "configs/positive_unbiased.py",
            "experiments/positive_unbiased/__init__.py",
            "experiments/positive_unbiased/summary.md",
            "experiments/positive_unbiased/test_positive_unbiased.py",
        },
        "positive_unbiased",
        [
            "experiments/positive_unbiased",
            "tests/experiments/test_claim_statements.py",
            "tests/experiments/test_quick_verdicts.py",
            "tests/experiments/test_results_page.py",
            "tests/project/test_layout.py",
        ],
        4,
    ),
    "new_fwht_backend.patch": (
        {
            "rfjax/ops/_fwht_radix4.py",
            "rfjax/ops/_fwht_backends.py",
            "tests/rfjax/ops/test_fwht_radix4.py",
        },
        "radix4",
        [
            "tests/rfjax/ops/test_fwht.py",
            "tests/rfjax/ops/test_fwht_radix4.py",
            "tests/rfjax/ops/test_fwht_backends.py",
            "tests/project/test_layout.py",
        ],
        10,
    ),
}


def _git(*args: str, cwd=ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def _touched(patch: str) -> dict[str, tuple[int, int]]:
    """``path -> (lines added, lines removed)`` of a patch (``git apply --numstat``)."""
    rows = [line.split("\t") for line in _git("apply", "--numstat", patch).splitlines()]
    return {path: (int(added), int(removed)) for added, removed, path in rows}


def _copy_of_checkout(destination) -> None:
    """The checkout's files (tracked, and untracked ones git does not ignore) under
    ``destination``, without its build outputs or caches."""
    files = _git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def git_checkout():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the examples are checked in a git checkout (git apply, git ls-files)")


@pytest.mark.parametrize("patch", sorted(CASES))
def test_each_example_touches_only_the_paths_its_seam_names(git_checkout, patch):
    allowed, *_ = CASES[patch]
    touched = _touched(str(EXAMPLES / patch))
    assert set(touched) == allowed, patch
    for path, (added, removed) in touched.items():
        assert added > 0 and removed == 0, (path, added, removed)
    _git("apply", "--check", str(EXAMPLES / patch))  # it applies to this checkout


@pytest.mark.integration
@pytest.mark.parametrize("patch", sorted(CASES))
def test_the_generic_tests_pick_the_example_up_once_applied(git_checkout, tmp_path, patch):
    _, name, tests, least = CASES[patch]
    copy = tmp_path / "checkout"
    _copy_of_checkout(copy)
    _git("init", "-q", cwd=copy)  # patch paths are read from the copy's root wherever it lies
    _git("apply", str(EXAMPLES / patch), cwd=copy)
    pytest_command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    run = subprocess.run(
        [*pytest_command, "--runintegration", *tests],
        cwd=copy,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(copy)},
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    named = re.findall(rf"^PASSED \S*{name}\S*", run.stdout, flags=re.MULTILINE)
    assert len(named) >= least, run.stdout[-4000:]
