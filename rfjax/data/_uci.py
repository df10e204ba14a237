"""The eight UCI classification sets of the SimRF paper (Sec. 5.3, Fig. 8, Tables 2-3).

The files ship with the package (``rfjax/data/uci/``, see its ``SOURCE.md``); they are those
distributed with the SimRF authors' public code, unchanged, and come from the UCI Machine Learning
Repository (https://archive.ics.uci.edu, CC BY 4.0).
"""

from __future__ import annotations

import os
from typing import Literal

import numpy as np

UCI_DATASETS = ("abalone", "banknote", "car", "yeast", "cmc", "nursery", "wifi", "chess")
"""Names accepted by ``load_uci``, in the order of the paper's Fig. 8 and Table 2."""

UCI_BANDWIDTHS = {
    "abalone": 0.41331138,
    "banknote": 1.06445901,
    "car": 0.77656608,
    "yeast": 0.90918797,
    "cmc": 0.48389667,
    "nursery": 0.18788887,
    "wifi": 0.21997651,
    "chess": 0.25754408,
}
"""The SimRF paper's input scale sigma per data set (its Fig. 10 and App. B.1).

Inputs are standardised on the training split, then multiplied by sigma, and the kernel is
K(x, y) = exp(-|x - y|^2 / 2): sigma is an inverse lengthscale, l = 1 / sigma. The authors chose
it on validation data as the value at which the i.i.d. positive-random-feature classifier peaks
(not the exact kernel), so that random features are effective and the couplings can be compared.
"""

CategoricalEncoding = Literal["onehot", "ordinal"]
CATEGORICAL_ENCODINGS: tuple[CategoricalEncoding, ...] = ("onehot", "ordinal")
RowSelection = Literal["all", "authors"]
ROW_SELECTIONS: tuple[RowSelection, ...] = ("all", "authors")

# file, column separator (None: any whitespace), categorical columns, leading columns to drop.
_FILES = {
    "abalone": ("abalone.data", ",", (0,), 0),
    "banknote": ("banknote.txt", ",", (), 0),
    "car": ("car.data", ",", tuple(range(6)), 0),
    "yeast": ("yeast.data", None, (), 1),
    "cmc": ("cmc.data", ",", (), 0),
    "nursery": ("nursery.data", ",", tuple(range(8)), 0),
    "wifi": ("wifi.txt", None, (), 0),
    "chess": ("chess.data", ",", tuple(range(6)), 0),
}
_UCI_PAGES = {
    "abalone": "https://archive.ics.uci.edu/dataset/1/abalone",
    "banknote": "https://archive.ics.uci.edu/dataset/267/banknote+authentication",
    "car": "https://archive.ics.uci.edu/dataset/19/car+evaluation",
    "yeast": "https://archive.ics.uci.edu/dataset/110/yeast",
    "cmc": "https://archive.ics.uci.edu/dataset/30/contraceptive+method+choice",
    "nursery": "https://archive.ics.uci.edu/dataset/76/nursery",
    "wifi": "https://archive.ics.uci.edu/dataset/422/wireless+indoor+localization",
    "chess": "https://archive.ics.uci.edu/dataset/23/chess+king+rook+vs+king",
}
DEFAULT_UCI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "uci")


def _read_rows(
    path: str, separator: str | None, drop: int, drop_last_line: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The file's non-blank lines (all but the file's last line if ``drop_last_line``) split
    into string fields, ``(rows, columns)``, and their line numbers (1-based, for error
    messages), ``(rows,)``."""
    with open(path) as handle:
        text = handle.readlines()
    if drop_last_line:
        text = text[:-1]
    numbered = [(n, line.split(separator)) for n, line in enumerate(text, 1) if line.strip()]
    if not numbered:
        raise ValueError(f"{path}: the file holds no rows")
    lines = np.array([n for n, _ in numbered])
    rows = [[field.strip() for field in row[drop:]] for _, row in numbered]
    width = len(rows[0])
    for line, row in zip(lines, rows, strict=True):
        if len(row) != width:
            raise ValueError(
                f"{path}, line {line}: {len(row)} columns where the first row has {width}"
            )
    return np.asarray(rows, dtype=str), lines


def _numeric_column(column: np.ndarray, path: str, lines: np.ndarray, index: int) -> np.ndarray:
    """A numeric column as finite float64 ``(rows, 1)``; a bad field is reported by file,
    line and column."""
    values = np.array([float(text) if _is_number(text) else np.nan for text in column])
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = bad[0]
        raise ValueError(
            f"{path}, line {lines[row]}, column {index + 1}: {str(column[row])!r} is not a finite "
            f"number ({bad.size} such fields in the column)"
        )
    return values[:, None]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _codes(column: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer codes 0..k-1 of a string column: numeric order if every value is a number."""
    values = np.unique(column)  # lexicographic order
    if all(_is_number(value) for value in values):
        values = values[np.argsort(values.astype(float), kind="stable")]
    lookup = {value: code for code, value in enumerate(values)}
    return np.array([lookup[value] for value in column], np.int64), len(values)


def _encode_inputs(
    fields: np.ndarray,
    categorical: tuple[int, ...],
    encoding: str,
    *,
    path: str,
    lines: np.ndarray,
    drop: int,
) -> np.ndarray:
    """Numeric columns as floats, categorical ones one-hot or ordinal, in the file's order."""
    blocks = []
    for index in range(fields.shape[1]):
        if index not in categorical:
            blocks.append(_numeric_column(fields[:, index], path, lines, index + drop))
            continue
        codes, count = _codes(fields[:, index])
        if encoding == "onehot":
            blocks.append(np.eye(count)[codes])
        else:
            blocks.append(codes[:, None].astype(np.float64))
    return np.concatenate(blocks, axis=1)


def load_uci(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    categorical: CategoricalEncoding = "onehot",
    rows: RowSelection = "all",
) -> tuple[np.ndarray, np.ndarray]:
    """Loads one of the eight UCI classification sets of the SimRF paper.

    The canonical source is the UCI Machine Learning Repository (Dua and Graff,
    https://archive.ics.uci.edu; CC BY 4.0); the packaged copies are the files distributed with
    the SimRF authors' code. Conventions: no header; the last column is the class; yeast's first
    column (a sequence name) is dropped; yeast and wifi are whitespace-separated, the others
    comma-separated; blank lines are skipped, every other row is kept (``rows="all"``), or, as
    the authors' loader does (``data[:-1]`` over the file's lines), the file's last line is
    dropped (``rows="authors"``): a real row in every file but nursery's, whose last line is
    blank, so those sets have one row fewer (banknote 1,371 instead of 1,372).

    Categorical columns (abalone 0, car 0-5, nursery 0-7, chess 0-5) are one-hot encoded by
    default, as the authors' Fig. 8 script does (``load_data_onehot``): categories such as a
    chess file 'a'..'h' or abalone's sex M/F/I have no meaningful distances, and the paper's
    Table 2 column of typical |x + y| (e.g. 5.0 for car, 2.3 for chess) matches the one-hot
    dimensions (car d = 21, chess d = 40), not the ordinal ones. ``categorical="ordinal"``
    gives one column of codes 0..k-1 per categorical column instead (the authors' ``load_data``).

    Classes are coded 0..C-1 in sorted order of the label strings (numeric order when all
    labels are numbers, e.g. abalone's rings).

    Args:
      name: one of ``UCI_DATASETS``.
      data_dir: a folder holding the original file (``abalone.data``, ``banknote.txt``,
        ``car.data``, ``yeast.data``, ``cmc.data``, ``nursery.data``, ``wifi.txt``,
        ``chess.data``); default: the copy in the package.
      categorical: ``"onehot"`` (default) or ``"ordinal"``.
      rows: ``"all"`` (default) or ``"authors"`` (without the file's last line).

    Returns:
      ``(x, y)``: float64 inputs ``(N, d)`` (not standardised) and int64 classes ``(N,)``.
      Shapes (one-hot): abalone (4177, 10) 28 classes, banknote (1372, 4) 2, car (1728, 21) 4,
      yeast (1484, 8) 10, cmc (1473, 9) 3, nursery (12960, 27) 5, wifi (2000, 7) 4,
      chess (28056, 40) 18.

    Raises:
      ValueError: for an unknown ``name``, ``categorical`` or ``rows`` (the message lists the
        allowed values), or a malformed file: rows of different widths, or a numeric field that
        is not a finite number (NaN and infinity are rejected); the message names the file and
        line.
      FileNotFoundError: if the file is not in ``data_dir``, saying where to get it.

    Examples:
      >>> x, y = load_uci("banknote")
      >>> x.shape, int(y.max()) + 1
      ((1372, 4), 2)
      >>> load_uci("banknote", rows="authors")[0].shape
      (1371, 4)

    References:
      Reid et al., "Simplex Random Features", ICML 2023, arXiv:2301.13856, Sec. 5.3, App. B.1.
    """
    if name not in _FILES:
        raise ValueError(f"name must be one of {', '.join(UCI_DATASETS)}; got {name!r}")
    if categorical not in CATEGORICAL_ENCODINGS:
        raise ValueError(
            f"categorical must be one of {', '.join(CATEGORICAL_ENCODINGS)}; got {categorical!r}"
        )
    if rows not in ROW_SELECTIONS:
        raise ValueError(f"rows must be one of {', '.join(ROW_SELECTIONS)}; got {rows!r}")
    filename, separator, categorical_columns, drop = _FILES[name]
    data_dir = DEFAULT_UCI_DIR if data_dir is None else os.fspath(data_dir)
    path = os.path.join(data_dir, filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"UCI {name} file not found: {path}. Download {filename} from the UCI Machine "
            f"Learning Repository ({_UCI_PAGES[name]}) into a folder and pass it as data_dir"
        )
    fields, lines = _read_rows(path, separator, drop, drop_last_line=rows == "authors")
    x = _encode_inputs(
        fields[:, :-1], categorical_columns, categorical, path=path, lines=lines, drop=drop
    )
    y, _ = _codes(fields[:, -1])
    return x, y
