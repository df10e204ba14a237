"""Writing experiment outputs: CSV, JSON and markdown tables, figures and a progress bar."""

from __future__ import annotations

import csv
import json
import os
import string
from collections.abc import Iterable, Sequence

import ml_collections
from tqdm.auto import tqdm

# Short names of the couplings in tables and legends (the papers' names).
COUPLING_LABELS = {
    "gaussian": "IID",
    "orthogonal": "ORF",
    "simplex": "SimRF",
    "simplex_plus": "SimRF+",
    "halton": "Halton",
    "hd_orthogonal": "ORF (fast)",
    "fast_simplex": "SimRF (fast)",
}


def write_csv(path: str, rows: Sequence[dict]) -> None:
    """Writes ``rows`` (dicts with the same keys) as a CSV file with a header."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path) -> list[dict[str, str]]:
    """The rows of a CSV file written by ``write_csv``, as dicts of strings."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def markdown_table(rows: Sequence[dict], float_format: str = "{:.4g}") -> str:
    """Formats ``rows`` as a GitHub markdown table (floats with ``float_format``)."""
    header = list(rows[0])

    def cell(value):
        return float_format.format(value) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(row[key]) for key in header) + " |" for row in rows]
    return "\n".join(lines)


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def render_summary(name: str, **values: object) -> str:
    """The summary text of experiment ``name``: ``experiments/templates/<name>.md`` with its
    ``$placeholders`` (``string.Template`` syntax; ``$$`` is a literal ``$``) filled from
    ``values`` (formatted with ``str``).

    Raises:
      FileNotFoundError: if the template does not exist (the message gives its path).
      ValueError: if a placeholder has no value or a value has no placeholder (both listed).
    """
    path = os.path.join(TEMPLATES, f"{name}.md")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no summary template for experiment {name!r} at {path}")
    with open(path) as handle:
        template = string.Template(handle.read())
    placeholders = set(template.get_identifiers())
    missing, unused = sorted(placeholders - set(values)), sorted(set(values) - placeholders)
    if missing or unused:
        raise ValueError(
            f"summary template {path}: placeholders without values {missing}, values without "
            f"placeholders {unused}"
        )
    return template.substitute({key: str(value) for key, value in values.items()})


def write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def write_json(path: str, data, indent: int = 1) -> None:
    """Writes ``data`` (JSON-serialisable) to ``path``."""
    with open(path, "w") as handle:
        json.dump(data, handle, indent=indent)


def save_config(workdir: str, config: ml_collections.ConfigDict) -> str:
    """Writes ``config`` as ``workdir/config.json``; returns the path."""
    path = os.path.join(workdir, "config.json")
    write_json(path, config.to_dict())
    return path


def save_run(
    workdir: str,
    *,
    rows: Sequence[dict],
    summary: str,
    config: ml_collections.ConfigDict,
    csv_name: str = "results.csv",
) -> dict[str, str]:
    """Writes an experiment's results into ``workdir``: ``rows`` as ``csv_name``, the
    markdown ``summary`` as ``summary.md`` and ``config`` as ``config.json``.

    Returns the paths, keyed ``"csv"``, ``"summary"`` and ``"config"``.
    """
    os.makedirs(workdir, exist_ok=True)
    csv_path = os.path.join(workdir, csv_name)
    summary_path = os.path.join(workdir, "summary.md")
    write_csv(csv_path, rows)
    write_text(summary_path, summary)
    return {"csv": csv_path, "summary": summary_path, "config": save_config(workdir, config)}


def save_figure(fig, path: str) -> None:
    """Lays out ``fig``, saves it to ``path`` (120 dpi) and closes it."""
    import matplotlib.pyplot as plt  # here: the experiments choose the backend first

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def progress(items: Iterable, description: str, total: int | None = None) -> Iterable:
    """A console progress bar over ``items`` (tqdm; quiet when stderr is not a terminal)."""
    return tqdm(items, desc=description, total=total, leave=False, disable=None)
