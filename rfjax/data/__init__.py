"""Loaders for the real data sets (see ``shared/data/README.md``), as NumPy arrays."""

from rfjax.data._fashion_mnist import (
    DEFAULT_FASHION_MNIST_DIR,
    FASHION_MNIST_CLASSES,
    load_fashion_mnist,
    read_idx,
)
from rfjax.data._fsdd import (
    DEFAULT_FSDD_DIR,
    FSDD_SAMPLE_RATE,
    FSDD_SOURCE,
    concatenate_digits,
    load_fsdd,
    log_mel_spectrogram,
    mel_filterbank,
)
from rfjax.data._ptb import PTB_EOS, PTB_SOURCE, PTB_SPLITS, load_ptb
from rfjax.data._uci import UCI_BANDWIDTHS, UCI_DATASETS, load_uci

__all__ = [
    "DEFAULT_FASHION_MNIST_DIR",
    "DEFAULT_FSDD_DIR",
    "FASHION_MNIST_CLASSES",
    "FSDD_SAMPLE_RATE",
    "FSDD_SOURCE",
    "PTB_EOS",
    "PTB_SOURCE",
    "PTB_SPLITS",
    "UCI_BANDWIDTHS",
    "UCI_DATASETS",
    "concatenate_digits",
    "load_fashion_mnist",
    "load_fsdd",
    "load_ptb",
    "load_uci",
    "log_mel_spectrogram",
    "mel_filterbank",
    "read_idx",
]
