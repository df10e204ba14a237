"""Tests of ``rfjax.data._uci``: the sets' documented sizes and encodings, bad arguments, and bad
fields and rows of a UCI file named by file, line and column.

Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix.
"""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
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


# load_uci's documented sizes: rows, one-hot width, ordinal width, classes.
SIZES = {
    "abalone": (4177, 10, 8, 28),
    "banknote": (1372, 4, 4, 2),
    "car": (1728, 21, 6, 4),
    "yeast": (1484, 8, 8, 10),
    "cmc": (1473, 9, 9, 3),
    "nursery": (12960, 27, 8, 5),
    "wifi": (2000, 7, 7, 4),
    "chess": (28056, 40, 6, 18),
}


@pytest.mark.parametrize("name", data.UCI_DATASETS)
def test_uci_sets_have_their_documented_sizes(name):
    """Rows, input widths (one-hot and ordinal), finite inputs, every class 0..C-1 present and
    the same labels in both encodings; rows="authors" drops the file's last line, a row in every
    file but nursery's (whose last line is blank), and keeps the rows before it."""
    rows, onehot, ordinal, classes = SIZES[name]
    x, y = data.load_uci(name)
    assert x.shape == (rows, onehot) and x.dtype == np.float64 and y.dtype == np.int64
    assert np.all(np.isfinite(x))
    assert np.unique(y).tolist() == list(range(classes))
    x_ordinal, y_ordinal = data.load_uci(name, categorical="ordinal")
    assert x_ordinal.shape == (rows, ordinal)
    np.testing.assert_array_equal(y_ordinal, y)
    fewer = 0 if name == "nursery" else 1
    x_authors, y_authors = data.load_uci(name, rows="authors")
    assert x_authors.shape == (rows - fewer, onehot)
    np.testing.assert_array_equal(x_authors, x[: rows - fewer])
    np.testing.assert_array_equal(y_authors, y[: rows - fewer])
    with pytest.raises(ValueError, match="rows must be one of all, authors"):
        data.load_uci(name, rows="first")


def test_every_uci_set_has_a_bandwidth():
    assert set(data.UCI_BANDWIDTHS) == set(data.UCI_DATASETS)


def test_uci_fields_and_classes_are_encoded_as_documented():
    """abalone: sex one-hot over F, I, M (sorted), the seven measurements as they are, and rings
    coded in numeric order (lexicographic order would put 10 before 2); yeast: the sequence
    name dropped; car ordinal: codes 0..k-1 in sorted order."""
    x, y = data.load_uci("abalone")
    np.testing.assert_array_equal(x[0], [0, 0, 1, 0.455, 0.365, 0.095, 0.514, 0.2245, 0.101, 0.15])
    with open(os.path.join(_uci.DEFAULT_UCI_DIR, "abalone.data")) as handle:
        rings = np.array([int(line.split(",")[-1]) for line in handle if line.strip()])
    np.testing.assert_array_equal(y, np.unique(rings, return_inverse=True)[1])
    yeast, _ = data.load_uci("yeast")
    np.testing.assert_array_equal(yeast[0], [0.58, 0.61, 0.47, 0.13, 0.50, 0.00, 0.48, 0.22])
    car, _ = data.load_uci("car", categorical="ordinal")  # first row: vhigh,vhigh,2,2,small,low
    np.testing.assert_array_equal(car[0], [3, 3, 0, 0, 2, 1])
    car, _ = data.load_uci("car")  # one-hot: all six columns categorical, six ones per row
    np.testing.assert_array_equal(car.sum(axis=1), 6.0)
    assert set(np.unique(car)) == {0.0, 1.0}


def test_uci_bad_field_counts_dropped_columns_in_its_column_number(tmp_path):
    """yeast's first column (the sequence name) is dropped; errors count the file's columns."""
    path = _uci_copy(tmp_path, "yeast.data")
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace("0.64", "x", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"yeast\.data, line 3, column 2: 'x'"):
        data.load_uci("yeast", data_dir=tmp_path)


def test_load_uci_bad_arguments_and_data_dir(tmp_path):
    with pytest.raises(
        ValueError, match="abalone, banknote, car, yeast, cmc, nursery, wifi, chess"
    ):
        data.load_uci("iris")
    with pytest.raises(ValueError, match="categorical must be one of onehot, ordinal"):
        data.load_uci("car", categorical="binary")
    with pytest.raises(FileNotFoundError, match="UCI Machine Learning Repository"):
        data.load_uci("wifi", data_dir=str(tmp_path))
    shutil.copy(os.path.join(_uci.DEFAULT_UCI_DIR, "wifi.txt"), tmp_path / "wifi.txt")
    x, y = data.load_uci("wifi", data_dir=str(tmp_path))
    expected_x, expected_y = data.load_uci("wifi")
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
