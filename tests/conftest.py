"""Shared pytest configuration: the ``slow`` marker and a ``--runslow`` switch."""

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run paper-scale experiment tests marked slow",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="paper-scale run; use --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
