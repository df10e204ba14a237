"""Tests of ``rfjax.data._uci``: bad fields and rows of a UCI file are
named by file, line and column.

Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from rfjax import data
from rfjax.data import _uci


def _uci_copy(tmp_path, filename):
    shutil.copy(os.path.join(_uci.DEFAULT_UCI_DIR, filename), tmp_path / filename)
    return tmp_path / filename


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN", "1.0e999", "?"])
def test_uci_non_finite_field_names_file_line_and_column(tmp_path, bad):
    path = _uci_copy(tmp_path, "banknote.txt")
    lines = path.read_text().splitlines()
    fields = lines[9].split(",")
    fields[2] = bad
    lines[9] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    message = f"banknote.txt, line 10, column 3: '{bad}' is not a finite number"
    with pytest.raises(ValueError, match=re.escape(message)):
        data.load_uci("banknote", data_dir=tmp_path)


def test_uci_ragged_row_names_file_and_line(tmp_path):
    path = _uci_copy(tmp_path, "banknote.txt")
    lines = path.read_text().splitlines()
    lines[4] += ",7"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"banknote\.txt, line 5: 6 columns where the first"):
        data.load_uci("banknote", data_dir=tmp_path)
