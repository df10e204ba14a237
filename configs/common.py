"""Helpers shared by config files: the ``variant,key=value`` argument and type checks.

A config file's ``get_config(arg)`` takes big_vision-style arguments: a variant name and/or
``key=value`` overrides, comma-separated, e.g. (with ``experiments.main``)

  --config=configs/kernel_mse.py:quick
  --config=configs/kernel_mse.py:quick,num_draws=50
  --config=configs/kernel_mse.py:couplings=(gaussian,simplex),train.seed=3

Keys are the config's fields (dotted for nested ones); values are parsed by the type of the
field's default: ``int``, ``float``, ``bool`` (true/false), ``str`` (quotes optional), tuples as
``(a,b,c)`` (or one bare value for a one-element tuple). The overrides are applied after the
variant. ``absl``'s ``--config.key=value`` flags work too; there a tuple is a Python literal:
``--config.couplings="('gaussian', 'simplex')"``.
"""

from __future__ import annotations

import ast
import difflib
import math
from typing import Any

import ml_collections

TUPLE_SYNTAX = (
    "write a tuple as key=(a,b) in the config argument "
    "(--config=configs/NAME.py:quick,{key}=(a,b)) or as a quoted Python literal in a flag "
    "(--config.{key}=\"('a', 'b')\")"
)


def _split_items(arg: str) -> list[str]:
    """``arg`` split at the commas outside brackets and quotes."""
    items, depth, quote, start = [], 0, None, 0
    for index, char in enumerate(arg):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(arg[start:index])
            start = index + 1
    if depth or quote:
        raise ValueError(f"config argument {arg!r}: unbalanced brackets or quotes")
    items.append(arg[start:])
    return [item.strip() for item in items if item.strip()]


def parse_arg(arg: str | None) -> tuple[str | None, dict[str, str]]:
    """Splits a config argument ``"variant,key=value,..."`` into the variant (None if absent)
    and the raw ``{key: value}`` overrides.

    Raises:
      ValueError: if an item is malformed, names a key twice, or a variant is not first.
    """
    variant, overrides = None, {}
    for position, item in enumerate(_split_items(arg or "")):
        if "=" not in item:
            if overrides:
                last = next(reversed(overrides))
                raise ValueError(
                    f"config argument {arg!r}: {item!r} is not key=value. A variant comes "
                    f"first; for a tuple write {last}=(a,b) ({last}=({overrides[last]},{item})?)"
                )
            if position:
                raise ValueError(f"config argument {arg!r}: one variant at most, got {item!r}")
            variant = item
            continue
        key, value = (part.strip() for part in item.split("=", 1))
        if not key or key in overrides:
            raise ValueError(f"config argument {arg!r}: empty or repeated key in {item!r}")
        overrides[key] = value
    return variant, overrides


def parse_variant(arg: str | None, allowed: tuple[str, ...] = ("quick",)) -> str | None:
    """The config variant named by ``arg`` (None for the default), or raises.

    ``arg`` may carry ``key=value`` overrides after the variant; ``apply_overrides`` applies
    them at the end of ``get_config``.
    """
    variant, _ = parse_arg(arg)
    if variant is not None and variant not in allowed:
        raise ValueError(
            f"config variant must be one of {allowed} or empty, got {variant!r} "
            "(config argument syntax: [variant][,key=value...])"
        )
    return variant


def apply_overrides(
    config: ml_collections.ConfigDict, arg: str | None
) -> ml_collections.ConfigDict:
    """``config`` with the ``key=value`` overrides of ``arg`` applied (see the module doc).

    Raises:
      ValueError: for an unknown key or a value that does not parse as the field's type (the
        message names the key, the value and the expected syntax).
    """
    variant, overrides = parse_arg(arg)
    if "variant" not in config and "label" not in config:  # iap_es names it "label"
        config.variant = variant or "default"  # read by experiments.outputs.config_variant
    for key, text in overrides.items():
        parent, name = _locate(config, key)
        parent[name] = _parse_value(key, text, parent[name])
    return config


def check_field(config: ml_collections.ConfigDict, key: str) -> None:
    """Raises the ``ValueError`` of an override of ``key`` (dotted for nested fields) when
    ``config`` has no such field: the same message for ``--config=FILE:key=value`` and for
    absl's ``--config.key=value`` (``experiments.main``)."""
    _locate(config, key)


def _locate(config: ml_collections.ConfigDict, key: str) -> tuple[Any, str]:
    *path, name = key.split(".")
    node = config
    for index, part in enumerate([*path, name]):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            known = list(node) if isinstance(node, ml_collections.ConfigDict) else []
            close = difflib.get_close_matches(part, known, n=3)
            hint = f"; did you mean {close}?" if close else ""
            raise ValueError(
                f"config has no field {key!r} ({'.'.join(key.split('.')[: index + 1])!r} is "
                f"not a field{hint}); fields: {sorted(known)}"
            )
        if index < len(path):
            node = node[part]
    if isinstance(node[name], ml_collections.ConfigDict):
        raise ValueError(f"config field {key!r} is a group: override its fields ({key}.NAME=...)")
    return node, name


def _parse_scalar(key: str, text: str, like: Any) -> Any:
    """``text`` parsed as the type of ``like`` (anything for None)."""
    try:
        if isinstance(like, bool):
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return lowered in ("true", "1")
        if isinstance(like, int):
            return int(text)
        if isinstance(like, float):
            return float(text)
    except ValueError as error:
        raise ValueError(
            f"config override {key}={text!r}: expected {type(like).__name__} like {like!r} "
            f"({error})"
        ) from None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: a string
    if isinstance(like, str) and not isinstance(value, str):
        return text
    return value


def _parse_value(key: str, text: str, default: Any) -> Any:
    if not isinstance(default, tuple):
        return _parse_scalar(key, text, default)
    inner = text
    if text[:1] in "([" and text[-1:] in ")]":
        inner = text[1:-1]
    elif "," in text:
        raise ValueError(f"config override {key}={text!r}: " + TUPLE_SYNTAX.format(key=key))
    like = default[0] if default else None
    return tuple(_parse_scalar(key, item, like) for item in _split_items(inner))


def check_types(
    config: ml_collections.ConfigDict, reference: ml_collections.ConfigDict, prefix: str = "config"
) -> None:
    """Checks that every field of ``config`` has the type of its default in ``reference``
    (ints where floats are expected are fine; tuples element by element, against the types of
    the default's elements), and that no string in a tuple holds a comma where the default's
    strings do not (``--config.couplings=gaussian,simplex`` gives ``('gaussian,simplex',)``).

    Raises:
      TypeError: naming the field, its value, the expected type and the syntax.
    """
    for key in reference:
        if key not in config:
            continue
        name, value, default = f"{prefix}.{key}", config[key], reference[key]
        if isinstance(default, ml_collections.ConfigDict):
            if isinstance(value, ml_collections.ConfigDict):
                check_types(value, default, name)
            continue
        if isinstance(default, tuple):
            _check_tuple(name, value, default)
        elif default is not None and value is not None and not _same_kind(value, default):
            raise TypeError(
                f"{name} must be a {type(default).__name__} like {default!r}, got {value!r}"
            )


def _check_tuple(name: str, value: Any, default: tuple) -> None:
    key = name.split(".", 1)[1]
    kinds = {type(item) for item in default}
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{name} must be a tuple like {default!r}, got {value!r}; "
            + TUPLE_SYNTAX.format(key=key)
        )
    if len(kinds) == 1 and default:
        like = default[0]
        for item in value:
            if not _same_kind(item, like):
                raise TypeError(
                    f"{name} must be a tuple of {type(like).__name__} like {default!r}, got "
                    f"{tuple(value)!r}; " + TUPLE_SYNTAX.format(key=key)
                )
    default_commas = any(isinstance(item, str) and "," in item for item in default)
    if not default_commas and any(isinstance(item, str) and "," in item for item in value):
        raise TypeError(
            f"{name} = {tuple(value)!r} holds a comma inside one string, so it is one name, "
            "not a list; " + TUPLE_SYNTAX.format(key=key)
        )


def _same_kind(value: Any, like: Any) -> bool:
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(like, bool)
    if isinstance(like, float):
        return isinstance(value, (int, float))
    if isinstance(like, tuple):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(like))


def require_names(
    config: ml_collections.ConfigDict, key: str, allowed: tuple[str, ...], prefix: str = "config"
) -> None:
    """Checks that ``config[key]`` (a name, or a non-empty tuple of names) uses only
    ``allowed`` names (``prefix`` names ``config`` in messages).

    Raises:
      ValueError: naming the field, the bad value and the allowed names.
    """
    value = config[key]
    names = value if isinstance(value, (tuple, list)) else (value,)
    if not names:
        raise ValueError(f"{prefix}.{key} must name at least one of {tuple(allowed)}")
    for name in names:
        if name not in allowed:
            hint = " (" + TUPLE_SYNTAX.format(key=key) + ")" if "," in str(name) else ""
            raise ValueError(f"{prefix}.{key}: {name!r} is not one of {tuple(allowed)}{hint}")


def require_positive(config: ml_collections.ConfigDict, *keys: str, prefix: str = "config") -> None:
    """Checks that each ``config[key]`` (a number or a tuple of numbers) is finite and > 0
    (``prefix`` names ``config`` in messages).

    Raises:
      ValueError: naming the field and the value.
    """
    for key in keys:
        value = config[key]
        values = value if isinstance(value, (tuple, list)) else (value,)
        if not values or not all(
            isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values
        ):
            raise ValueError(f"{prefix}.{key} must be finite and > 0, got {value!r}")
