"""A study's records: what its ``measure`` returned, stored with the config it was made under.

``run`` measures and stores ``records.json`` before reporting, so a report can be rewritten
from a results folder without measuring anything (``python -m experiments.regenerate``):
``load_config`` rebuilds the config from the folder's ``command.txt`` (the config file and its
argument) with the values of its ``config.json`` (the run's own settings) on top.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
from typing import Any

import ml_collections

from experiments.core import outputs

RECORDS_FILE = "records.json"
CONFIG_FILE = "config.json"
COMMAND_FILE = "command.txt"


# Fields that say how a report judges, not what a measurement depends on (``target_difference``:
# the effect a study's seeds are sized for).
REPORT_FIELDS = ("claims", "powered", "trained_check", "follow_up", "target_difference")
# Fields that say where a run keeps what only speeds it up (the compiled programs' cache).
MACHINE_FIELDS = ("compilation_cache_dir",)


def settings(config: ml_collections.ConfigDict, exclude: tuple[str, ...] = ()) -> dict:
    """What a measurement depends on: ``config`` without ``REPORT_FIELDS``, ``MACHINE_FIELDS``
    and ``exclude``, as JSON stores it (tuples as lists), for comparing a stored record with a
    new config."""
    skip = (*REPORT_FIELDS, *MACHINE_FIELDS, *exclude)
    return json.loads(json.dumps({k: v for k, v in config.to_dict().items() if k not in skip}))


def differences(stored: Any, current: Any, prefix: str = "") -> list[str]:
    """The fields in which ``stored`` and ``current`` settings (JSON values: mappings nested
    in mappings) differ, each as ``"name: stored -> current"`` with a dotted name; a field
    missing on one side reads as ``<none>``.

    Examples:
      >>> differences({"lr": 0.05, "model": {"m": 8}}, {"lr": 1e-06, "model": {"m": 8}})
      ['lr: 0.05 -> 1e-06']
      >>> differences({"seed": 0}, {"seed": 0, "arm": "exact"})
      ["arm: <none> -> 'exact'"]
    """
    if isinstance(stored, dict) and isinstance(current, dict):
        found = []
        for key in [*stored, *(k for k in current if k not in stored)]:
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in stored or key not in current:
                shown = [repr(side[key]) if key in side else "<none>" for side in (stored, current)]
                found.append(f"{name}: {shown[0]} -> {shown[1]}")
            else:
                found += differences(stored[key], current[key], name)
        return found
    if stored == current:
        return []
    return [f"{prefix or 'settings'}: {stored!r} -> {current!r}"]


def write(workdir: str, records: Any) -> str:
    """Writes ``records`` (JSON: dicts, lists, numbers, strings) to ``workdir/records.json``
    (process 0); returns the path."""
    path = os.path.join(workdir, RECORDS_FILE)
    outputs.write_json(path, records)
    return path


def read(workdir: str) -> Any:
    """The records ``write`` stored in ``workdir``.

    Raises:
      FileNotFoundError: naming the folder, if it has no records.
    """
    path = os.path.join(workdir, RECORDS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{workdir} has no {RECORDS_FILE}: nothing to report from")
    with open(path) as handle:
        return json.load(handle)


def config_argument(workdir: str) -> str:
    """The ``--config`` argument of the command that made ``workdir`` (``command.txt``), e.g.
    ``configs/iap_es.py:pair``."""
    path = os.path.join(workdir, COMMAND_FILE)
    with open(path) as handle:
        words = shlex.split(handle.read(), comments=True)
    for word in words:
        if word.startswith("--config="):
            return word.removeprefix("--config=")
    raise ValueError(f"{path} has no --config=... argument")


def load_config(workdir: str) -> ml_collections.ConfigDict:
    """The config ``workdir`` was made under: its config file at its argument, with the values
    of ``workdir/config.json`` on top (a field the file no longer has is an error; a field the
    run predates, such as a claim declared since, keeps the file's value; the claims and the
    training check always come from the file, which declares what the report judges by).

    Raises:
      ValueError: if ``config.json`` holds a field the config file does not define.
    """
    argument = config_argument(workdir)
    path, _, arg = argument.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    config = importlib.import_module(f"configs.{name}").get_config(arg or None)
    with open(os.path.join(workdir, CONFIG_FILE)) as handle:
        stored = json.load(handle)
    _overlay(config, stored, "config")
    return config


def _overlay(config: ml_collections.ConfigDict, stored: dict, prefix: str) -> None:
    for key, value in stored.items():
        if key not in config:
            raise ValueError(f"{prefix}.{key} is in the stored config but not in the config file")
        current = config[key]
        if isinstance(current, ml_collections.ConfigDict) and isinstance(value, dict):
            if key in ("claims", "trained_check"):
                continue  # from the config file: declared for the verdicts
            _overlay(current, value, f"{prefix}.{key}")
            continue
        with config.ignore_type():
            config[key] = tuple(value) if isinstance(value, list) else value
