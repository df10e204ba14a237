"""Colabs: each .ipynb matches its jupytext .py source and runs without errors in quick mode.

The executed notebooks are left in ``docs/_generated/executed_colabs``: the docs build renders
them from there instead of executing the colabs a second time (``docs/conf.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys

import jupytext
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.support import ROOT

COLABS = ROOT / "colabs"
EXECUTED = ROOT / "docs" / "_generated" / "executed_colabs"  # read by docs/conf.py
NOTEBOOKS = ("tour", "simrf_attention", "hybrid_features", "nnx_vit")
KERNEL_NAME = "rfjax-test-python"
TIMEOUT_S = 120  # per cell


def _cells(path: pathlib.Path) -> list[tuple[str, str]]:
    notebook = jupytext.read(path)
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_every_source_has_a_notebook_and_is_listed():
    sources = sorted(p.stem for p in COLABS.glob("*.py"))
    assert sources == sorted(NOTEBOOKS)
    assert sorted(p.stem for p in COLABS.glob("*.ipynb")) == sorted(NOTEBOOKS)
    readme = (COLABS / "README.md").read_text()
    for name in NOTEBOOKS:
        assert f"{name}.ipynb" in readme, name


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_in_sync_with_source(name):
    source = COLABS / f"{name}.py"
    notebook = COLABS / f"{name}.ipynb"
    assert _cells(source) == _cells(notebook), (
        f"{notebook.name} differs from {source.name}: run `jupytext --sync {source}`"
    )
    stored = nbformat.read(notebook, as_version=4)
    assert stored.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert not any(cell.get("outputs") for cell in stored.cells), "commit notebooks without outputs"


def _kernel_manager(spec_dir: pathlib.Path) -> KernelManager:
    """A kernel manager whose only kernel spec starts ipykernel with this interpreter."""
    spec = spec_dir / KERNEL_NAME
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "rfjax test", "language": "python"})
    )
    manager = KernelManager(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir)]),
    )
    assert manager.kernel_spec.argv[0] == sys.executable
    return manager


def _execute_concurrently(
    notebooks: dict[str, nbformat.NotebookNode], spec_root: pathlib.Path
) -> None:
    """Executes every notebook in quick mode in place, the kernels running concurrently.

    Cell errors are recorded as outputs (``allow_errors``) so that every notebook runs to its end.
    """
    with pytest.MonkeyPatch.context() as patch:
        # The kernels inherit this environment: quick sizes; matplotlib's backend is ipykernel's
        # inline one (figures become outputs, for the docs), never one inherited from the shell.
        patch.setenv("RFJAX_COLAB_QUICK", "1")
        patch.delenv("MPLBACKEND", raising=False)
        patch.setenv("JAX_PLATFORMS", "cpu")
        # Quick runs are mostly XLA compilation: unoptimised CPU code compiles about 2.5x faster
        # (same results; the quick sizes make the slower code irrelevant).
        flags = os.environ.get("XLA_FLAGS", "")
        patch.setenv("XLA_FLAGS", f"{flags} --xla_backend_optimization_level=0".strip())
        clients = [
            NotebookClient(
                notebook,
                km=_kernel_manager(spec_root / name),
                timeout=TIMEOUT_S,
                allow_errors=True,
                resources={"metadata": {"path": str(COLABS)}},
            )
            for name, notebook in notebooks.items()
        ]

        async def run_all() -> None:
            await asyncio.gather(*(client.async_execute() for client in clients))

        asyncio.run(run_all())


def _problems(notebook: nbformat.NotebookNode) -> list[str]:
    """What went wrong in an executed notebook: cells not run, errors, quick mode off."""
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [output for cell in code_cells for output in cell.outputs]
    problems = [
        f"cell {i} did not run" for i, cell in enumerate(code_cells) if cell.execution_count is None
    ]
    problems += [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    if "quick=True" not in "".join(o.get("text", "") for o in outputs):
        problems.append("quick mode was not on")
    return problems


@pytest.mark.integration
def test_notebooks_execute_in_quick_mode(tmp_path):
    # One test for all notebooks (not one per notebook), so that pytest-xdist never runs the
    # concurrent execution twice on different workers.
    notebooks = {name: nbformat.read(COLABS / f"{name}.ipynb", as_version=4) for name in NOTEBOOKS}
    _execute_concurrently(notebooks, tmp_path)
    problems = {name: _problems(notebook) for name, notebook in notebooks.items()}
    assert not any(problems.values()), {name: p for name, p in problems.items() if p}
    EXECUTED.mkdir(parents=True, exist_ok=True)
    for name, notebook in notebooks.items():
        nbformat.write(notebook, EXECUTED / f"{name}.ipynb")
