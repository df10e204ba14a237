"""Loaders for the real data sets (see ``shared/data/README.md``), as NumPy arrays."""

from rfjax.data._fashion_mnist import (
    DEFAULT_FASHION_MNIST_DIR,
    FASHION_MNIST_CLASSES,
    load_fashion_mnist,
    read_idx,
)
from rfjax.data._ptb import PTB_EOS, PTB_SOURCE, PTB_SPLITS, load_ptb
from rfjax.data._uci import UCI_BANDWIDTHS, UCI_DATASETS, load_uci

__all__ = [
    "DEFAULT_FASHION_MNIST_DIR",
    "FASHION_MNIST_CLASSES",
    "PTB_EOS",
    "PTB_SOURCE",
    "PTB_SPLITS",
    "UCI_BANDWIDTHS",
    "UCI_DATASETS",
    "load_fashion_mnist",
    "load_ptb",
    "load_uci",
    "read_idx",
]
