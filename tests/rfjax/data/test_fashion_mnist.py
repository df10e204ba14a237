"""Tests of ``rfjax.data._fashion_mnist``: the IDX reader accepts valid files
and names corrupt ones.

Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix.
"""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from rfjax import data


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


@pytest.mark.parametrize("label", [200, 10])
def test_fashion_mnist_label_outside_the_ten_classes_names_the_file(tmp_path, label):
    with pytest.raises(
        ValueError, match=r"t10k-labels-idx1-ubyte\.gz: labels must lie in \[0, 10\)"
    ):
        _fashion(tmp_path, labels=np.array([0, label, 4], np.uint8))


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


@pytest.mark.parametrize(
    "raw",
    [
        bytes([0, 0, 0x08, 3, 0, 0]),  # the header cut short
        bytes([0, 0, 0x0B, 1, 0, 0, 0, 1, 0, 1, 2]),  # int16 data of 3 bytes
    ],
)
def test_a_truncated_idx_file_names_the_path(tmp_path, raw):
    """NumPy's 'buffer is smaller than requested size' before, without the file."""
    path = tmp_path / "short-idx1-ubyte"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=r"short-idx1-ubyte: truncated idx file"):
        data.read_idx(str(path))


def test_read_idx_reads_big_endian_values(tmp_path):
    """idx data is big-endian after a header of 4 + 4 ndim bytes (int16 code 0x0B here)."""
    values = np.array([[1, 256], [-2, 32767]], np.int16)
    path = tmp_path / "values-idx2-short.gz"
    _write_idx(path, values, 0x0B)
    read = data.read_idx(str(path))
    np.testing.assert_array_equal(read, values)
