"""Helpers of the test suite, imported as ``tests.support.<module>``; the scripts among them
(``*_checks.py``, ``toy_study.py``, ``training_child.py``) run in processes of their own."""

import pathlib

SUPPORT = pathlib.Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]  # the repository root
