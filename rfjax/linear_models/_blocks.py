"""Rows in blocks: NumPy arrays, memory-mapped files or iterators cut into fixed-size blocks."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
from numpy.typing import ArrayLike

from rfjax._validation import check_int, check_representable


def array_blocks(x: ArrayLike, y: ArrayLike, block_rows: int = 4096) -> Iterator[tuple]:
    """``(x[i:i + block_rows], y[i:i + block_rows])`` for i = 0, block_rows, ...

    Slicing keeps a ``numpy.memmap`` on disk: only one block is read at a time, so the rows are
    bounded by disk, not memory.

    Args:
      x: inputs, shape ``(n, d)`` (a NumPy array or ``numpy.memmap``).
      y: targets, shape ``(n,)`` or ``(n, t)``.
      block_rows: rows per block (the last block may be shorter).

    Raises:
      ValueError: if ``x`` and ``y`` have different numbers of rows (when called, not when
        iterated).

    Examples:
      >>> import numpy as np
      >>> from rfjax.linear_models import array_blocks
      >>> [b[0].shape for b in array_blocks(np.zeros((5, 2)), np.zeros(5), block_rows=2)]
      [(2, 2), (2, 2), (1, 2)]
    """
    block_rows = check_int("block_rows", block_rows, minimum=1)
    x = x if isinstance(x, np.ndarray) else np.asarray(x)
    y = y if isinstance(y, np.ndarray) else np.asarray(y)
    if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x and y must have the same number of rows, got shapes {x.shape} and {y.shape}"
        )
    return (
        (x[start : start + block_rows], y[start : start + block_rows])
        for start in range(0, x.shape[0], block_rows)
    )


@dataclasses.dataclass(frozen=True)
class Block:
    """``rows`` rows of x and y: the first ``valid`` are data, the rest zero padding."""

    x: np.ndarray
    y: np.ndarray
    valid: int


def fixed_blocks(
    blocks: Iterable[tuple[ArrayLike, ArrayLike]], rows: int, dtype: np.dtype, y_dtype: np.dtype
) -> Iterator[Block]:
    """Re-cuts ``(x, y)`` blocks of any sizes into blocks of exactly ``rows`` rows, x of
    ``dtype`` and y of ``y_dtype`` (the last one zero-padded, its ``valid`` saying how many rows
    are data), so one compiled step serves every block. Inputs are checked: x floating
    ``(b, d)``, y real ``(b,)`` or ``(b, t)``, the same d and t in every block, and all values
    finite and within the range of their dtype."""
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    pending_rows = 0
    shapes: tuple | None = None
    for index, block in enumerate(blocks):
        x, y = _checked_block(index, block, dtype, y_dtype)
        if shapes is None:
            shapes = (x.shape[1:], y.shape[1:])
        elif (x.shape[1:], y.shape[1:]) != shapes:
            raise ValueError(
                f"block {index} has x of shape {x.shape} and y of shape {y.shape}; earlier "
                f"blocks had x (b, {shapes[0][0]}) and y (b, {shapes[1][0]})"
            )
        while x.shape[0]:
            if not pending_rows and x.shape[0] >= rows:  # a whole block: no copy beyond dtype
                yield Block(_as(x[:rows], dtype), _as(y[:rows], y_dtype), rows)
                x, y = x[rows:], y[rows:]
                continue
            take = min(rows - pending_rows, x.shape[0])
            pending.append((x[:take], y[:take]))
            pending_rows += take
            x, y = x[take:], y[take:]
            if pending_rows == rows:
                yield _concatenate(pending, rows, dtype, y_dtype)
                pending, pending_rows = [], 0
    if pending_rows:
        yield _concatenate(pending, rows, dtype, y_dtype)


def _checked_block(
    index: int, block: object, dtype: np.dtype, y_dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Block ``index`` as ``(x (b, d), y (b, t))``, checked (x for ``dtype``, y for
    ``y_dtype``)."""
    if not isinstance(block, tuple | list) or len(block) != 2:
        raise TypeError(f"block {index} must be a pair (x, y), got {type(block).__name__}")
    x, y = (v if isinstance(v, np.ndarray) else np.asarray(v) for v in block)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x of block {index} must be a floating array, got dtype {x.dtype}")
    if not (np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.integer)):
        raise TypeError(f"y of block {index} must be a real array, got dtype {y.dtype}")
    if x.ndim != 2 or y.ndim not in (1, 2) or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"block {index} must hold x of shape (b, d) and y of shape (b,) or (b, t), got "
            f"{x.shape} and {y.shape}"
        )
    for name, values in (("x", x), ("y", y)):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} of block {index} holds NaN or infinity")
    check_representable(
        x, dtype, name=f"x of block {index}", remedy="use a float64 transform (jax_enable_x64)"
    )
    check_representable(
        y,
        y_dtype,
        name=f"y of block {index}",
        remedy="sum the statistics in float64 (dtype=jnp.float64, with jax_enable_x64)",
    )
    return x, y.reshape(y.shape[0], -1)


def _concatenate(parts: list[tuple[np.ndarray, np.ndarray]], rows: int, dtype, y_dtype) -> Block:
    valid = sum(x.shape[0] for x, _ in parts)
    x = np.zeros((rows, parts[0][0].shape[1]), dtype)
    y = np.zeros((rows, parts[0][1].shape[1]), y_dtype)
    start = 0
    for part_x, part_y in parts:
        x[start : start + part_x.shape[0]] = part_x
        y[start : start + part_y.shape[0]] = part_y
        start += part_x.shape[0]
    return Block(x, y, valid)


def _as(values: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=dtype)
