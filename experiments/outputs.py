"""Writing experiment outputs: CSV tables, markdown tables and a progress bar."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence

from tqdm.auto import tqdm


def write_csv(path: str, rows: Sequence[dict]) -> None:
    """Writes ``rows`` (dicts with the same keys) as a CSV file with a header."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: Sequence[dict], float_format: str = "{:.4g}") -> str:
    """Formats ``rows`` as a GitHub markdown table (floats with ``float_format``)."""
    header = list(rows[0])

    def cell(value):
        return float_format.format(value) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(row[key]) for key in header) + " |" for row in rows]
    return "\n".join(lines)


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def progress(items: Iterable, description: str, total: int | None = None) -> Iterable:
    """A console progress bar over ``items`` (tqdm; quiet when stderr is not a terminal)."""
    return tqdm(items, desc=description, total=total, leave=False, disable=None)
