"""Cold start: what ``import rfjax`` and its subpackages import (issue 33).

Each check runs in a fresh interpreter (``sys.modules`` of this one already holds the suite's
imports). The time itself is measured by ``benchmarks/cold_start.py``; here only which modules
load, which does not depend on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT

# Imported on first use only: the Pallas/Mosaic backends of ``rfjax.ops.fwht`` (each about a
# second to import), networkx (``rfjax.theory``'s coherence graphs), and the libraries of the
# subpackages that need them (Flax for ``rfjax.nn``, scikit-learn for ``rfjax.sklearn``).
BACKENDS = (
    "rfjax.ops._fwht_tpu",
    "rfjax.ops._fwht_mosaic_gpu",
    "rfjax.ops._fwht_triton",
    "jax.experimental.pallas.tpu",
    "jax.experimental.pallas.mosaic_gpu",
    "jax.experimental.mosaic.gpu",
)
ARRAY_PACKAGES = (
    "rfjax.attention",
    "rfjax.data",
    "rfjax.features",
    "rfjax.kernels",
    "rfjax.linear_models",
    "rfjax.ops",
    "rfjax.projections",
    "rfjax.sampled_softmax",
    "rfjax.theory",
)


def _run(code: str) -> str:
    """The output of ``code`` in a fresh interpreter (in the checkout: its rfjax is imported)."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    return result.stdout


def _modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    output = _run(f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))")
    return set(json.loads(output.splitlines()[-1]))


def test_import_rfjax_imports_no_subpackage():
    modules = _modules_after("import rfjax")
    assert "jax" not in modules
    assert not {m for m in modules if m.startswith("rfjax.")}


@pytest.fixture(scope="module")
def array_modules() -> set[str]:
    return _modules_after("import " + ", ".join(ARRAY_PACKAGES))


@pytest.mark.parametrize("module", [*BACKENDS, "networkx", "flax", "sklearn", "optax"])
def test_array_packages_import_no_backend_or_optional_library(array_modules, module):
    assert module not in array_modules


def test_nn_imports_linen_only():
    modules = _modules_after("import rfjax.nn")
    assert "flax.linen" in modules
    assert "flax.nnx" not in modules
    assert not set(BACKENDS) & modules


def test_subpackages_are_attributes_of_rfjax():
    code = "import rfjax\nprint(rfjax.nn.PerformerAttention.__name__, rfjax.ops.fwht.__name__)"
    assert _run(code).split() == ["PerformerAttention", "fwht"]


def test_unknown_attribute_is_an_attribute_error():
    import rfjax

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = rfjax.nope  # type: ignore[attr-defined]


def test_backend_module_loads_when_its_kernel_is_lowered():
    code = (
        "import jax, jax.numpy as jnp, sys\n"
        "from rfjax.ops import fwht\n"
        "before = 'rfjax.ops._fwht_tpu' in sys.modules\n"
        "jax.jit(lambda v: fwht(v, implementation='pallas_tpu_interpret')).lower(jnp.ones(8))\n"
        "print(before, 'rfjax.ops._fwht_tpu' in sys.modules)"
    )
    assert _run(code).split()[-2:] == ["False", "True"]
