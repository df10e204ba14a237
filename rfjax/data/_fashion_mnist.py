"""Fashion-MNIST from its four idx .gz files."""

from __future__ import annotations

import gzip
import os
from typing import Literal

import numpy as np
from jax.typing import DTypeLike

# Where the Debian/Ubuntu package dataset-fashion-mnist installs the files.
FASHION_MNIST_PACKAGE_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_DIR_VARIABLE = "RFJAX_FASHION_MNIST_DIR"
FASHION_MNIST_SOURCE = (
    "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu, into "
    f"{FASHION_MNIST_PACKAGE_DIR}), or the four idx .gz files of "
    "https://github.com/zalandoresearch/fashion-mnist (data/fashion)"
)
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_IDX_DTYPES: dict[int, DTypeLike] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def fashion_mnist_dir() -> str:
    """The default Fashion-MNIST folder: ``$RFJAX_FASHION_MNIST_DIR`` if set (read now), else
    ``FASHION_MNIST_PACKAGE_DIR``."""
    return os.environ.get(FASHION_MNIST_DIR_VARIABLE) or FASHION_MNIST_PACKAGE_DIR


def read_idx(path: str) -> np.ndarray:
    """Reads an idx file (optionally gzipped): magic 0x0000TTNN, N big-endian int32 dims, data."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError; EOF: truncated
        raise ValueError(f"{path}: cannot be read ({err or type(err).__name__})") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file (bad magic number {raw[:4].hex()})")
    ndim, dtype = raw[3], np.dtype(_IDX_DTYPES[raw[2]])
    body = len(raw) - 4 - 4 * ndim
    if body < 0 or body % dtype.itemsize:
        raise ValueError(
            f"{path}: truncated idx file ({len(raw)} bytes: a header of {4 + 4 * ndim} and "
            f"{dtype} values of {dtype.itemsize} bytes)"
        )
    shape = tuple(int(n) for n in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape} but holds {data.size} values")
    return data.reshape(shape)


def load_fashion_mnist(
    split: Literal["train", "test"] = "train", *, data_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Loads a split of Fashion-MNIST (Xiao, Rasul and Vollgraf 2017, arXiv:1708.07747).

    Args:
      split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
      data_dir: folder with the four idx .gz files; default: the environment variable
        ``RFJAX_FASHION_MNIST_DIR`` (read at call time), else the folder of the Debian package
        ``dataset-fashion-mnist`` (``FASHION_MNIST_PACKAGE_DIR``).

    Returns:
      ``(images, labels)``: uint8 ``(N, 28, 28)`` in [0, 255] and int32 ``(N,)`` in [0, 10)
      (class names in ``FASHION_MNIST_CLASSES``).

    Raises:
      ValueError: for an unknown split, or a file that is unreadable, has the wrong shape, pixels
        outside [0, 256) or labels outside [0, 10); the message names the file.
      FileNotFoundError: if the files are missing, saying how to get them.
    """
    if split not in FASHION_MNIST_FILES:
        raise ValueError(f"split must be one of {tuple(FASHION_MNIST_FILES)}, got {split!r}")
    data_dir = fashion_mnist_dir() if data_dir is None else os.fspath(data_dir)
    paths = [os.path.join(data_dir, name) for name in FASHION_MNIST_FILES[split]]
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST {split} files not found: {', '.join(missing)}. Get them with "
            f"{FASHION_MNIST_SOURCE}, and pass their folder as data_dir or set "
            f"{FASHION_MNIST_DIR_VARIABLE}"
        )
    (images_path, labels_path), (images, labels) = paths, (read_idx(path) for path in paths)
    if images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
        raise ValueError(
            f"unexpected Fashion-MNIST shapes: images {images.shape} in {images_path}, labels "
            f"{labels.shape} in {labels_path} (expected (N, 28, 28) and (N,))"
        )
    return (
        _checked_range(images_path, "pixel", images, 256).astype(np.uint8),
        _checked_range(labels_path, "label", labels, len(FASHION_MNIST_CLASSES)).astype(np.int32),
    )


def _checked_range(path: str, what: str, values: np.ndarray, stop: int) -> np.ndarray:
    """``values`` if they are integers in [0, stop), else a ``ValueError`` naming the file (so
    nothing wraps around or passes as a class that does not exist)."""
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{path}: {what}s must be integers, got dtype {values.dtype}")
    if values.size and not 0 <= values.min() <= values.max() < stop:
        raise ValueError(
            f"{path}: {what}s must lie in [0, {stop}), got values in [{values.min()}, "
            f"{values.max()}]"
        )
    return values
