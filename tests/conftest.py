"""Shared pytest configuration: the ``slow`` marker and a ``--runslow`` switch."""

import pytest


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
