"""Penn Treebank as language-model windows, for the studies that train on it (``lstm_lm``,
``performer_lm``): each split of ``rfjax.data.load_ptb`` is one token stream cut into
non-overlapping windows, the targets the inputs shifted by one token."""

from __future__ import annotations

import numpy as np

from rfjax.data import load_ptb


def windows(tokens: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """Non-overlapping windows: inputs ``tokens[i L:(i+1) L]``, targets shifted by one.

    Raises:
      ValueError: if ``tokens`` hold fewer than ``length + 1`` tokens.

    Examples:
      >>> pieces = windows(np.arange(7), 3)
      >>> pieces["inputs"].tolist(), pieces["targets"].tolist()
      ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]])
    """
    count = (len(tokens) - 1) // length
    if count < 1:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of length {length}")
    usable = tokens[: count * length + 1]
    return {
        "inputs": usable[:-1].reshape(count, length),
        "targets": usable[1:].reshape(count, length),
    }


def load_windows(
    length: int, num_train_tokens: int, num_eval_tokens: int
) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """The ``windows`` of ``length`` tokens of each PTB split (``"train"``, ``"valid"``,
    ``"test"``) from its first ``num_train_tokens`` (train) or ``num_eval_tokens`` (valid and
    test) tokens (0: all), and the vocabulary size.

    Raises:
      ValueError: naming the argument, for a token count that is not an int >= 0 (a slice
        ``tokens[:-1]`` would silently drop the last token).
    """
    for name, count in (
        ("num_train_tokens", num_train_tokens),
        ("num_eval_tokens", num_eval_tokens),
    ):
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            raise ValueError(f"{name} must be an int >= 0 (0: all tokens), got {count!r}")
    splits, vocabulary = load_ptb()
    limits = {"train": num_train_tokens, "valid": num_eval_tokens, "test": num_eval_tokens}
    arrays = {
        split: windows(tokens[: limits[split] or None], length) for split, tokens in splits.items()
    }
    return arrays, len(vocabulary)
