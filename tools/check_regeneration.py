"""Checks that the committed reports regenerate from their records with every number unchanged.

Usage: python tools/check_regeneration.py BASE_COMMIT

Runs ``python -m experiments.regenerate`` (measuring nothing: each study's ``measure`` is
replaced by a function that raises), restores the committed figures, and compares with
``BASE_COMMIT`` (the last commit before the records): every CSV, JSON table and every markdown
table row of each ``results/<name>/summary.md`` must be unchanged; the other summary lines
(the claims' verdict sentences) are listed with the new verdicts.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import re
import subprocess
import sys


def base_text(base: str, path: str) -> str | None:
    done = subprocess.run(["git", "show", f"{base}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


NUMBER = re.compile(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?|[-+]?\d+e[-+]?\d+")


def lost_numbers(old_row: str, new_text: str) -> list[str]:
    """The decimal numbers of an old table row that the new summary no longer prints (a row
    whose verdict column went keeps its numbers elsewhere in the new text)."""
    return [n for n in NUMBER.findall(old_row) if n.lstrip("+-") not in new_text]


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def no_measurement(*args, **kwargs):
    raise AssertionError("regeneration measured")


def main(base: str) -> int:
    folders = sorted(glob.glob("results/*/records.json"))
    names = [os.path.basename(os.path.dirname(path)) for path in folders]
    for name in names:
        experiment = json.loads(read(f"results/{name}/config.json"))["experiment"]
        importlib.import_module(f"experiments.{experiment}").measure = no_measurement
    from experiments import regenerate

    for name in names:
        regenerate.regenerate(os.path.join("results", name))
    subprocess.run(["git", "checkout", "--", *glob.glob("results/*/*.png")], check=True)
    problems = 0
    for name in names:
        for path in sorted(
            glob.glob(f"results/{name}/*.csv") + glob.glob(f"results/{name}/*.json")
        ):
            if os.path.basename(path) in ("config.json", "records.json", "verdicts.json"):
                continue
            old = base_text(base, path)
            if old is not None and old != read(path):
                print(f"CHANGED {path}")
                problems += 1
        old = base_text(base, f"results/{name}/summary.md") or ""
        new = read(f"results/{name}/summary.md")
        changed = [row for row in table_rows(old) if row not in table_rows(new)]
        missing = [(row, lost) for row in changed if (lost := lost_numbers(row, new))]
        for row, lost in missing:
            print(f"{name}: the numbers {lost} of the old row {row[:80]!r} are not in the new one")
        problems += len(missing)
        verdicts = json.loads(read(f"results/{name}/verdicts.json"))
        outcomes = ", ".join(f"{k} {v['outcome']}" for k, v in verdicts.items())
        state = "every number kept" if not missing else "NUMBERS LOST"
        print(f"{name}: {state} ({len(changed)} table rows recast); {outcomes}")
    print("every number unchanged" if not problems else f"{problems} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
