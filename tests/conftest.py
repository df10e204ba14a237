"""Shared pytest configuration: the ``slow`` marker, a ``--runslow`` switch, and where the FSDD
recordings are (``$RFJAX_FSDD_DIR``, else the project's shared copy beside the checkout)."""

import os

import pytest

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
