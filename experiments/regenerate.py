"""Rewrites committed reports from their records, measuring nothing.

Usage:
  python -m experiments.regenerate                 # every results/<name>/ with records.json
  python -m experiments.regenerate kernel_mse ...  # those folders only
  python -m experiments.regenerate --results_dir=somewhere

Each folder's config is rebuilt from its ``command.txt`` and ``config.json``
(``experiments.core.records.load_config``; claims come from the current config file) and its
study's ``report`` rewrites the summary, tables, figures and ``verdicts.json`` from
``records.json``. A folder whose last run did not finish (its ``status.json``) is refused.
Then ``python -m experiments.results_page`` collates RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import matplotlib

from experiments.core import records
from experiments.core import status as run_status

matplotlib.use("Agg")


def regenerate(workdir: str) -> None:
    """Rewrites the report of the results folder ``workdir`` from its records.

    Raises:
      ValueError: naming the folder and its state, if its last run did not finish
        (``status.json`` other than ``done``: failed, interrupted, killed, still running or a
        worker waiting). Such a run has written its ``command.txt`` (and may have written its
        ``config.json``) but not its ``records.json``: those are the previous run's, and a
        report would mix the two runs.
    """
    status = run_status.read(workdir)
    if status is not None and status.get("state") != "done":
        raise ValueError(
            f"{workdir}: its last run is {status.get('state')!r}, not done "
            f"({run_status.STATUS_FILE}), so its records.json may be an earlier run's while "
            "its command.txt and config.json are this run's; run its command again to finish "
            "it (status.json says which), then report"
        )
    config = records.load_config(workdir)
    module = importlib.import_module(f"experiments.{config.experiment}")
    module.report(records.read(workdir), config, workdir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="results folders (default: all with records)")
    parser.add_argument("--results_dir", default="results")
    args = parser.parse_args()
    names = args.names or sorted(
        name
        for name in os.listdir(args.results_dir)
        if os.path.exists(os.path.join(args.results_dir, name, records.RECORDS_FILE))
    )
    for name in names:
        print(f"regenerating {name}", flush=True)
        regenerate(os.path.join(args.results_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
