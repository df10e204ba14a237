"""Shared pytest configuration: the ``slow`` marker, a ``--runslow`` switch, where the FSDD
recordings are (``$RFJAX_FSDD_DIR``, else the project's shared copy beside the checkout), and XLA's
CPU backend at optimisation level 0 for the suite.

Most of the suite's time is XLA compiling small programs once each; at backend optimisation level
0 (LLVM's expensive passes off) compiling takes about half the CPU time and the tests' arithmetic
is the same (the level changes code generation, not the HLO's semantics: fusion, sharding and
collectives are decided before it). Set ``RFJAX_TEST_XLA_OPTIMISE=1`` to test with XLA's default
level instead; flags already in ``$XLA_FLAGS`` are kept, and subprocesses inherit them.
"""

import os

import pytest

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if os.environ.get("RFJAX_TEST_XLA_OPTIMISE") != "1":
    # Before anything imports jax (conftest modules load before the test modules).
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_FSDD = os.path.join(os.path.dirname(ROOT), "shared", "data", "fsdd", "recordings")


def pytest_configure(config):
    # The FSDD tests and the Conformer experiment read $RFJAX_FSDD_DIR (rfjax.data.fsdd_dir); the
    # tests skip when it names no folder.
    if not os.environ.get("RFJAX_FSDD_DIR") and os.path.isdir(SHARED_FSDD):
        os.environ["RFJAX_FSDD_DIR"] = SHARED_FSDD


def pytest_addoption(parser):
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (paper-scale runs, long Monte Carlo or training)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(
        reason="slow (paper-scale run, long Monte Carlo or training); use --runslow"
    )
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
