"""The scripts under ``tools/`` as modules, for the tests that use or check them."""

import importlib.util
import pathlib
import types

TOOLS = pathlib.Path(__file__).parents[2] / "tools"


def load_tool(name: str) -> types.ModuleType:
    """``tools/<name>.py`` imported as a module (``tools/`` is no package)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
