"""Packaging: ``python -m build`` makes an sdist and a wheel, and the wheel installs and runs in a
fresh virtual environment with no compiler.

The wheel is built from the sdist (what ``python -m build`` does), from a copy of the sources, so
the checkout is not touched. Building compiles the C++ kernel (tens of seconds), so the two files
are cached in pytest's cache directory under a hash of the sources: a later run with the same
sources installs the same wheel. The fresh environment has no pip and no packages of its own; a
``.pth`` file lets it import the test environment's dependencies (jax, numpy, ...) but not its
rfjax (an editable install, whose import hook lives in a ``.pth`` file that is not read there).
The smoke test runs with ``PATH`` reduced to the environment's ``bin`` and ``CC``/``CXX``
pointing nowhere, from a directory outside the checkout.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile

import pytest

import rfjax
from tests.support import ROOT

SOURCES = ("pyproject.toml", "setup.py", "README.md", "csrc", "rfjax", "experiments", "configs")
IGNORED = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info")

SMOKE = textwrap.dedent(
    """
    import importlib.metadata, pathlib, sys
    import numpy as np
    import rfjax
    from rfjax.ops import _fwht_cpu, fwht

    prefix = pathlib.Path(sys.prefix).resolve()
    assert pathlib.Path(rfjax.__file__).resolve().is_relative_to(prefix), rfjax.__file__
    assert importlib.metadata.version("rfjax") == rfjax.__version__
    assert _fwht_cpu.is_available(), "the wheel's C++ kernel did not load"
    assert pathlib.Path(_fwht_cpu.library_path()).resolve().is_relative_to(prefix)
    x = np.arange(8.0, dtype=np.float32)
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(8)] for i in range(8)])
    np.testing.assert_allclose(np.asarray(fwht(x, implementation="cpu")), h @ x)
    print("OK", rfjax.__version__, _fwht_cpu.isa(), ",".join(_fwht_cpu.compiled_isas()))
    """
)


def _source_hash() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        root = ROOT / name
        paths = sorted(root.rglob("*")) if root.is_dir() else [root]
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
                digest.update(str(path.relative_to(ROOT)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _build(out: pathlib.Path, scratch: pathlib.Path) -> None:
    """``python -m build`` (sdist, then the wheel from it) on a copy of the sources."""
    source = scratch / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=IGNORED)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.fixture
def dist(request, tmp_path_factory) -> pathlib.Path:
    for module in ("build", "setuptools"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    name = f"rfjax_dist_{_source_hash()}"
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    out = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    if not (list(out.glob("*.whl")) and list(out.glob("*.tar.gz"))):
        _build(out, tmp_path_factory.mktemp("build"))
    return out


def _check_contents(dist: pathlib.Path) -> None:
    """The sdist carries the C++ sources; the wheel carries the compiled kernel."""
    (sdist,) = dist.glob(f"rfjax-{rfjax.__version__}.tar.gz")
    (wheel,) = dist.glob(f"rfjax-{rfjax.__version__}-*.whl")
    with tarfile.open(sdist) as archive:
        names = {
            pathlib.PurePosixPath(n).relative_to(f"rfjax-{rfjax.__version__}").as_posix()
            for n in archive.getnames()
            if "/" in n
        }
    for needed in (
        "csrc/fwht_cpu.cc",
        "csrc/fwht_isa.cc",
        "csrc/fwht_kernel.h",
        "csrc/sincos_kernel.h",
        "setup.py",
    ):
        assert needed in names, needed
    with zipfile.ZipFile(wheel) as archive:
        libraries = [n for n in archive.namelist() if n.startswith("rfjax/ops/_fwht_cpu_lib")]
    assert libraries, "the wheel has no compiled kernel"


@pytest.mark.integration
def test_built_wheel_runs_in_a_fresh_environment_without_a_compiler(dist, tmp_path):
    """One test (not two sharing a fixture), so that parallel workers never build twice."""
    _check_contents(dist)
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", site]
    install = subprocess.run(
        [*pip, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    # The dependencies (jax, numpy, ...) from the test environment, after the wheel's files.
    pathlib.Path(site, "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": str(venv / "bin"), "CC": "/nonexistent/cc", "CXX": "/nonexistent/c++"}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [python, "-I", "-c", SMOKE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
