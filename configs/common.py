"""Helpers shared by config files."""

from __future__ import annotations


def parse_variant(arg: str | None, allowed: tuple[str, ...] = ("quick",)) -> str | None:
    """Returns the config variant named by ``arg`` (None for the default), or raises."""
    if arg in (None, ""):
        return None
    if arg not in allowed:
        raise ValueError(f"config variant must be one of {allowed} or empty, got {arg!r}")
    return arg
