"""Helpers shared by config files: the ``variant,key=value`` argument, claim declarations and
the training check.

A config file's ``get_config(arg)`` takes big_vision-style arguments: a variant name and/or
``key=value`` overrides, comma-separated, e.g. (with ``experiments.main``)

  --config=configs/kernel_mse.py:quick
  --config=configs/kernel_mse.py:quick,num_draws=50
  --config=configs/performer_vit.py:quick,attentions=(orthogonal,simplex,exact),train.seed=3

Keys are the config's fields (dotted for nested ones); values are parsed by the type of the
field's default: ``int``, ``float``, ``bool`` (true/false), ``str`` (quotes optional), tuples as
``(a,b,c)`` (or one bare value for a one-element tuple). The overrides are applied after the
variant. ``absl``'s ``--config.key=value`` flags work too; there a tuple is a Python literal:
``--config.couplings="('gaussian', 'simplex')"``.
"""

from __future__ import annotations

import ast
import difflib
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
    variant: str | None = None
    overrides: dict[str, str] = {}
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
    for key, text in parse_arg(arg)[1].items():
        parent, name = locate_field(config, key)
        parent[name] = parse_field_value(key, text, parent[name])
    return config


def locate_field(config: ml_collections.ConfigDict, key: str) -> tuple[Any, str]:
    """The parent group and name of the dotted field ``key`` of ``config``.

    Raises:
      ValueError: for an unknown field (with close names) or a group.
    """
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


def parse_field_value(key: str, text: str, default: Any) -> Any:
    """``text`` parsed as the type of the field ``key``'s ``default`` (tuples element-wise)."""
    if not isinstance(default, tuple):
        return _parse_scalar(key, text, default)
    inner = text
    if text[:1] in "([" and text[-1:] in ")]":
        inner = text[1:-1]
    elif "," in text:
        raise ValueError(f"config override {key}={text!r}: " + TUPLE_SYNTAX.format(key=key))
    like = default[0] if default else None
    return tuple(_parse_scalar(key, item, like) for item in _split_items(inner))


def claim(
    statement: str,
    test: str,
    *,
    margin: float = 0.0,
    relative: bool = False,
    confidence: float = 0.0,
    k: float = 3.0,
    pooling: str = "equal",
) -> ml_collections.ConfigDict:
    """A claim declared before the run, for ``config.claims`` (its fields checked by
    ``experiments.core.claims``, judged by ``experiments.core.verdicts``).

    Args:
      statement: the claim in words, with its source.
      test: ``"greater"``/``"less"`` (an ordering: the effect is > 0 / < 0),
        ``"noninferior"``/``"nonsuperior"`` (the effect is > -margin / < +margin),
        ``"equivalent"`` (within ±margin, two one-sided tests), ``"within_se"`` (within k SE
        of 0: agreement with a reference) or ``"fact"`` (a deterministic statement, such as a
        closed form or a graph colouring: no noise, so it holds or does not hold).
      margin: the size of an effect against the claim that refutes it; with 0 no result can
        refute the claim (it is then "not resolved" at worst).
      relative: whether ``margin`` is a fraction of a reference value the study supplies.
      confidence: the interval's coverage (0: 0.90 for equivalence, 0.95 otherwise).
      k: for ``within_se``, the SEs that count as agreement.
      pooling: how a test over cells weights them: ``"equal"`` (the mean effect over the
        cells) or ``"precision"`` (1 / se^2, for cells whose noise differs by orders of
        magnitude).
    """
    return ml_collections.ConfigDict(
        {
            "statement": statement,
            "test": test,
            "margin": float(margin),
            "relative": relative,
            "confidence": float(confidence),
            "k": float(k),
            "pooling": pooling,
        }
    )


def trained_check(
    metric: str,
    *,
    reason: str,
    limit: float | None = None,
    trivial: str = "",
    trivial_name: str = "",
    margin: float = 0.0,
    relative: bool = False,
    better: str = "lower",
) -> ml_collections.ConfigDict:
    """A check declared before the run, for ``config.trained_check`` (every config that trains
    models has one), that an arm (a kind of model trained on several seeds) trained: in every
    seed the per-run record field ``metric`` beats ``limit`` and the task's trivial model on the
    same run (the record field ``trivial``) by ``margin``. A claim whose test uses an arm that
    fails it is "not tested" (``experiments.core.training_check.TrainedCheck``, which checks the
    fields).

    Args:
      metric: the per-run record field, e.g. ``"digit_error_rate"``.
      reason: why a model that fails the check has not trained, in words.
      limit: a fixed threshold (e.g. chance level; None: none).
      trivial: the per-run record field of the trivial model's value ("": none).
      trivial_name: the trivial model in words, e.g. "the count unigram model".
      margin: how far the metric must beat the trivial model's value.
      relative: whether ``margin`` is a fraction of the trivial model's value.
      better: ``"lower"`` or ``"higher"``: which way the metric improves.
    """
    return ml_collections.ConfigDict(
        {
            "metric": metric,
            "reason": reason,
            "limit": None if limit is None else float(limit),
            "trivial": trivial,
            "trivial_name": trivial_name,
            "margin": float(margin),
            "relative": relative,
            "better": better,
        }
    )
