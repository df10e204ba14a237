"""CI runs exactly the README's commands: the tests, the static checks and the docs build."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI_COMMANDS = ("-m pytest", ".venv/bin/ruff", "-m sphinx")


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_verbatim():
    commands = [c for c in _readme_commands() if any(tool in c for tool in CI_COMMANDS)]
    assert len(commands) == 3, commands  # tests, static checks, docs
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci_lines, f"{command!r} is not a line of .ci/run"
    assert all(c.startswith(("tools/python3.12 ", ".venv/bin/")) for c in commands), commands


def test_python_wrapper_runs_a_supported_python():
    result = subprocess.run(
        ["sh", str(ROOT / "tools" / "python3.12"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    major, minor = map(int, re.findall(r"\d+", result.stdout))
    assert (major, minor) >= (3, 12), result.stdout
