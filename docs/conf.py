"""Sphinx configuration of the rfjax docs site.

Build (from the repository root, warnings as errors):

    .venv/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

* API reference: ``autosummary`` walks the ``rfjax`` package recursively and documents each
  subpackage's ``__all__`` on one page (``_templates/autosummary/module.rst``), with ``autodoc``
  and ``napoleon`` (Google-style docstrings). New public names and new subpackages appear without
  editing the docs.
* Maths notes (``maths/``) and ``RESULTS.md`` are MyST Markdown with ``$...$`` maths.
* The colabs (``../colabs/*.ipynb``, committed without outputs) are copied into
  ``_generated/colabs`` and rendered with outputs. The test suite executes them
  (``tests/project/test_colabs.py``, quick mode) and leaves the executed copies in
  ``_generated/executed_colabs``; a build after the tests renders those copies as they are (no
  second execution) when their cells equal the committed notebook's. Otherwise (no test run
  before, or a notebook edited since) MyST-NB executes the notebook during the build, in quick
  mode (``RFJAX_COLAB_QUICK=1``, small sizes) unless the environment sets ``RFJAX_COLAB_QUICK``
  (``RFJAX_COLAB_QUICK=0`` renders them at full size, about a minute of CPU time more).
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import shutil

import nbformat

import rfjax

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
GENERATED = DOCS / "_generated"
EXECUTED_COLABS = GENERATED / "executed_colabs"  # written by tests/project/test_colabs.py

project = "rfjax"
author = "rfjax authors"
copyright = "the rfjax authors"
release = version = rfjax.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "myst_nb",
]

# --------------------------------------------------------------------------- API reference
autosummary_generate = True
autosummary_ignore_module_all = False  # each package's __all__ is its public API
autosummary_imported_members = True  # the public names are defined in private modules
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # Attributes as a field list: properties documented by autodoc stay unique
templates_path = ["_templates"]

# --------------------------------------------------------------------------- Markdown and notebooks
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "force"
nb_execution_timeout = 600  # per cell
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# The tests' executed colabs are read by _prepare_colabs, not pages of their own.
exclude_patterns = ["_build", "README.md", "_generated/executed_colabs"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# --------------------------------------------------------------------------- HTML
html_theme = "furo"
html_title = f"rfjax {release}"


def _cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def _prepare_colabs() -> None:
    """Copies the notebooks next to the docs sources (Sphinx reads only its own tree): the test
    suite's executed copy where it matches the committed notebook (rendered without executing it
    again), else the committed notebook (executed during the build)."""
    target = GENERATED / "colabs"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in sorted((ROOT / "colabs").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        executed_path = EXECUTED_COLABS / path.name
        if executed_path.exists():
            executed = nbformat.read(executed_path, as_version=4)
            if _cells(executed) == _cells(notebook):
                executed.metadata["mystnb"] = {"execution_mode": "off"}
                notebook = executed
        nbformat.write(notebook, target / path.name)


def _kernel_environment() -> None:
    """What the notebook kernels (started by MyST-NB, inheriting this environment) need."""
    os.environ.setdefault("RFJAX_COLAB_QUICK", "1")
    # The kernels' inline backend draws the figures into the pages; a non-interactive
    # MPLBACKEND inherited from the shell would silently drop them.
    os.environ.pop("MPLBACKEND", None)
    if os.environ["RFJAX_COLAB_QUICK"] == "1":
        # Quick runs are mostly XLA compilation; unoptimised CPU code compiles ~2.5x faster
        # (as in tests/project/test_colabs.py).
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_backend_optimization_level" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()


# --------------------------------------------------------------------------- docstrings
# The docstrings are plain text for help() and IDEs: maths is written with bars for norms and
# absolute values (|x + y|), which reST would read as substitution references. Bars are escaped
# here, outside inline literals (``...``) and outside doctest and literal blocks, so they render
# as written.
_INLINE_LITERAL = re.compile(r"(``.+?``)")


def _escape_bars(text: str) -> str:
    parts = _INLINE_LITERAL.split(text)
    return "".join(p if i % 2 else p.replace("|", r"\|") for i, p in enumerate(parts))


def _plain_text_maths(app, what, name, obj, options, lines: list[str]) -> None:
    verbatim = False  # inside a doctest block or a literal block
    literal_indent = None  # indentation of the paragraph that ended with "::"
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if not stripped:
            verbatim = False
            continue
        if literal_indent is not None:
            if indent > literal_indent:
                continue
            literal_indent = None
        if stripped.startswith(">>>"):
            verbatim = True
        if verbatim:
            continue
        lines[i] = _escape_bars(line)
        if stripped.endswith("::"):
            literal_indent = indent


_SECTION = re.compile(r"^\s*(Args|Arguments|Attributes|Parameters|Keyword Args):\s*$")
_SHARED_ENTRY = re.compile(r"^(\s+)(\w+(?:, \w+)+)((?: \([^)]*\))?:(?:\s.*)?)$")
_NAMES_CONTINUED = re.compile(r"^\s+\w+(?:, \w+)*,\s*$")


def _split_shared_entries(app, what, name, obj, options, lines: list[str]) -> None:
    """Expands Google-style entries that describe several names at once ("a, b: as in X") into
    one entry per name, which napoleon understands (it would read "a," as the type of b)."""
    out: list[str] = []
    in_section = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _SECTION.match(line):
            in_section = True
        elif line.strip() and not line.startswith(" "):
            in_section = False
        if in_section and _NAMES_CONTINUED.match(line):
            # A list of names wrapped over several lines: join it up to its colon.
            indent = line[: len(line) - len(line.lstrip())]
            while (
                i + 1 < len(lines)
                and _NAMES_CONTINUED.match(line)
                and lines[i + 1].startswith(indent + " ")
            ):
                i += 1
                line = f"{line.rstrip()} {lines[i].strip()}"
        match = _SHARED_ENTRY.match(line) if in_section else None
        if not match:
            out.append(line)
            i += 1
            continue
        indent, names, rest = match.groups()
        continuation = []
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + " ")):
            if not lines[i].strip() and not (
                i + 1 < len(lines) and lines[i + 1].startswith(indent + " ")
            ):
                break
            continuation.append(lines[i])
            i += 1
        for entry in names.split(", "):
            out += [f"{indent}{entry}{rest}", *continuation]
    lines[:] = out


def _no_type_docstrings(app, what, name, obj, options, lines: list[str]) -> None:
    """Constants (``autodata``) without their own docs would show their type's docstring."""
    type_doc = inspect.getdoc(type(obj)) if what == "data" else None
    if type_doc and "\n".join(lines).strip() == type_doc.strip():
        lines.clear()


def _skip_namedtuple_aliases(app, what, name, obj, skip, options):
    """NamedTuple fields ("Alias for field number N") are documented by the class's Attributes;
    methods scikit-learn generates on estimators (``set_fit_request``, ...) are sklearn's."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    if (getattr(obj, "__module__", None) or "").startswith("sklearn."):
        return True
    return None


def setup(app) -> None:
    # Before napoleon's handler (priority 500): it reads the Google sections.
    app.connect("autodoc-process-docstring", _split_shared_entries, priority=400)
    # After napoleon's handler (extensions connect first), on its reST output.
    app.connect("autodoc-process-docstring", _no_type_docstrings)
    app.connect("autodoc-process-docstring", _plain_text_maths)
    app.connect("autodoc-skip-member", _skip_namedtuple_aliases)


_prepare_colabs()
_kernel_environment()
