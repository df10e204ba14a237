"""CI runs exactly the README's commands (tests, static checks, docs build); the public API is
annotated, so that mypy (which skips unannotated functions) checks it."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess

import pytest

from tests.support import ROOT

CI_COMMANDS = ("-m pytest", ".venv/bin/ruff", "-m sphinx")


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_verbatim():
    commands = [c for c in _readme_commands() if any(tool in c for tool in CI_COMMANDS)]
    assert len(commands) == 4, commands  # default tests, full tests, static checks, docs
    default, full = (c for c in commands if "-m pytest" in c)
    # CI's suite is the default one with the statistical and integration tests, timings and
    # the budget check.
    assert full.startswith(default + " --runstatistical --runintegration --durations=")
    assert "--cpu-times=" in full and "tests/cpu_budget.py" in full
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        if command != default:  # CI runs the full suite, which contains the default one
            assert command in ci_lines, f"{command!r} is not a line of .ci/run"
    assert all(c.startswith(("tools/python3.12 ", ".venv/bin/")) for c in commands), commands


STATUS_CHECK = 'status=$?; [ "$status" -eq 0 ] || exit "$status"'


def test_every_and_list_of_ci_is_followed_by_a_check_of_its_status(tmp_path):
    """Under ``set -e`` a command that fails before the last ``&&`` of a list does not stop a
    script: without the check, failing tests ended in a later line's status, 0. The check
    itself makes such a script exit non-zero (run here)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = ("tools/python3.12 ", ".venv/bin/")
    lists = [i for i, line in enumerate(lines) if line.startswith(commands) and "&&" in line]
    assert len(lists) == 2, lists  # the tests; the static checks
    for i in lists:
        assert lines[i + 1] == STATUS_CHECK, lines[i]
    script = tmp_path / "run"
    script.write_text(f"set -euo pipefail\ntrue && false && true\n{STATUS_CHECK}\necho on\n")
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert result.returncode == 1 and "on" not in result.stdout


def test_python_wrapper_runs_a_supported_python():
    result = subprocess.run(
        ["sh", str(ROOT / "tools" / "python3.12"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    major, minor = map(int, re.findall(r"\d+", result.stdout))
    assert (major, minor) >= (3, 12), result.stdout


PACKAGES = (
    "rfjax",
    "rfjax.ops",
    "rfjax.projections",
    "rfjax.features",
    "rfjax.kernels",
    "rfjax.theory",
    "rfjax.attention",
    "rfjax.sampled_softmax",
    "rfjax.sklearn",
    "rfjax.nn",
    "rfjax.nn.nnx",
    "rfjax.data",
    "rfjax.linear_models",
)


def _unannotated(qualname: str, function) -> list[str]:
    signature = inspect.signature(function)
    missing = [
        f"{qualname}({p.name})"
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append(f"{qualname} -> ?")
    return missing


@pytest.mark.parametrize("package", PACKAGES)
def test_public_api_is_annotated(package):
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            missing += _unannotated(f"{package}.{name}", obj)
        elif inspect.isclass(obj):
            for attribute, value in vars(obj).items():
                # Methods defined in the class (not a field's default that is a function, such
                # as PerformerAttention.attention_fn = flax.linen.dot_product_attention).
                method = inspect.isfunction(value) and value.__qualname__.startswith(
                    f"{obj.__qualname__}."
                )
                if not attribute.startswith("_") and method:
                    missing += _unannotated(f"{package}.{name}.{attribute}", value)
    assert not missing, missing
