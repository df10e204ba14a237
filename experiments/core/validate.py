"""The one config-validation style of the experiments: checks that name the field, the value
and what is allowed, raised before anything runs.

``check_types`` compares a config with its file's defaults (``experiments.main`` runs it on
every config); a study's ``validate_config`` uses ``require_*`` for names and ranges. Claims
(``config.claims``) are checked by ``experiments.core.claims.declared``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
import ml_collections

from configs.common import TUPLE_SYNTAX


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


def _require_each(config, keys, valid, allowed: str, prefix: str) -> None:
    """Raises ``ValueError`` for the first ``config[key]`` (a value or a non-empty tuple of
    values) with a value that is not ``valid``, naming the field, the value and ``allowed``."""
    for key in keys:
        value = config[key]
        values = value if isinstance(value, (tuple, list)) else (value,)
        if not values or not all(valid(v) for v in values):
            raise ValueError(f"{prefix}.{key} must be {allowed}, got {value!r}")


def require_positive(config: ml_collections.ConfigDict, *keys: str, prefix: str = "config") -> None:
    """Checks that each ``config[key]`` (a number or a tuple of numbers) is finite and > 0
    (``prefix`` names ``config`` in messages).

    Raises:
      ValueError: naming the field and the value.
    """
    _require_each(
        config,
        keys,
        lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0,
        "finite and > 0",
        prefix,
    )


def require_interval(
    config: ml_collections.ConfigDict, *keys: str, interval: str, prefix: str = "config"
) -> None:
    """Checks that each ``config[key]`` (a number or a non-empty tuple of numbers) is finite
    and in ``interval``, written as in mathematics: ``"[0, 1)"`` (a dropout rate), ``"(0, 1)"``,
    ``"[0, inf)"`` (NaN is in no interval).

    Raises:
      ValueError: naming the field, the value and the interval.

    Example:
      >>> require_interval({"dropout_rate": 1.0}, "dropout_rate", interval="[0, 1)")
      Traceback (most recent call last):
      ...
      ValueError: config.dropout_rate must be finite and in [0, 1), got 1.0
    """
    left, right = interval[0], interval[-1]
    ends = interval[1:-1].split(",")
    if left not in "[(" or right not in "])" or len(ends) != 2:
        raise ValueError(f"interval must look like '[0, 1)', got {interval!r}")
    low, high = (float(end) for end in ends)

    def inside(v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        above = v >= low if left == "[" else v > low
        below = v <= high if right == "]" else v < high
        return above and below

    _require_each(config, keys, inside, f"finite and in {interval}", prefix)


def require_int(
    config: ml_collections.ConfigDict,
    *keys: str,
    minimum: int,
    maximum: int | None = None,
    prefix: str = "config",
) -> None:
    """Checks that each ``config[key]`` (an int or a non-empty tuple of ints) is an int >=
    ``minimum`` (and <= ``maximum``, if given).

    Raises:
      ValueError: naming the field, the value and the range.

    Example:
      >>> require_int({"first_test_index": 50}, "first_test_index", minimum=1, maximum=49)
      Traceback (most recent call last):
      ...
      ValueError: config.first_test_index must be an int in [1, 49], got 50
    """
    top = math.inf if maximum is None else maximum
    _require_each(
        config,
        keys,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= top,
        f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]",
        prefix,
    )


def require_nonempty(config: ml_collections.ConfigDict, *keys: str, prefix: str = "config"):
    """Checks that each ``config[key]`` (a tuple) has at least one entry.

    Raises:
      ValueError: naming the field.
    """
    for key in keys:
        if not tuple(config[key]):
            raise ValueError(f"{prefix}.{key} must not be empty, got {config[key]!r}")


def require_no_repeats(config: ml_collections.ConfigDict, *keys: str, prefix: str = "config"):
    """Checks that no entry of each ``config[key]`` (a tuple) repeats: a study keys its cells by
    these entries, so a repeated one is a cell measured twice that its verdicts count once.

    Raises:
      ValueError: naming the field and its value.

    Example:
      >>> require_no_repeats(ml_collections.ConfigDict({"dims": (2, 4, 2)}), "dims")
      Traceback (most recent call last):
      ...
      ValueError: config.dims must be without repeats, got (2, 4, 2)
    """
    for key in keys:
        values = tuple(config[key])
        require(len(set(values)) == len(values), key, config[key], "without repeats", prefix)


def require_couplings_draw(
    config: ml_collections.ConfigDict,
    key: str,
    dim: int,
    num_features: int,
    prefix: str = "config",
) -> None:
    """Checks that every coupling ``config[key]`` names (one, or a tuple) can draw a
    ``(num_features, dim)`` projection: runs each sampler's own checks (its minimum dimension,
    the size caps, a family's rank) on abstract values, ``jax.eval_shape``, which draws and
    compiles nothing, so that a config fails before the run rather than in it.

    Raises:
      ValueError: naming the field, the coupling, the sizes and the sampler's message.
    """
    from rfjax import projections  # here: configs without couplings need no rfjax

    value = config[key]
    for name in value if isinstance(value, (tuple, list)) else (value,):
        sampler = projections.get(name)
        try:
            jax.eval_shape(lambda k, s=sampler: s(k, dim, num_features), jax.random.key(0))
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{prefix}.{key}: coupling {name!r} cannot draw {num_features} features of "
                f"dimension {dim}: {error}"
            ) from None


def require_distinct_seeds(seeds: Iterable[int], name: str) -> None:
    """Checks that the seeds are ints >= 0 (NumPy's generators, which draw the training
    batches, take no negative seed: a run with seed -1 passed validation and stopped at its
    first batch with NumPy's "expected non-negative integer") and that none repeats: a
    repeated seed is one measurement counted twice, which would shrink a claim's interval
    with no new evidence.

    Raises:
      ValueError: naming ``name``, the bad or repeated seed and the seeds.

    Example:
      >>> require_distinct_seeds((0, 1, 0), "config.seeds")
      Traceback (most recent call last):
      ...
      ValueError: config.seeds repeats seed 0 in (0, 1, 0): seeds must be distinct
    """
    seeds = tuple(seeds)
    seen: set[int] = set()
    for seed in seeds:
        if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
            raise ValueError(f"{name} holds seed {seed!r} in {seeds}: seeds must be ints >= 0")
        if seed in seen:
            raise ValueError(f"{name} repeats seed {seed} in {seeds}: seeds must be distinct")
        seen.add(seed)


def check_seed_fields(config: ml_collections.ConfigDict, prefix: str = "config") -> None:
    """``require_distinct_seeds`` on every tuple field named ``seeds`` or ``*_seeds`` of
    ``config`` (``lstm_lm``'s ``baseline_seeds``), nested ones included (``experiments.main``
    runs it on every config).

    Raises:
      ValueError: naming the field and the repeated seed.
    """
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            check_seed_fields(value, f"{prefix}.{key}")
        elif (key == "seeds" or key.endswith("_seeds")) and isinstance(value, (tuple, list)):
            require_distinct_seeds(value, f"{prefix}.{key}")


def require(condition: bool, key: str, value: object, allowed: str, prefix: str = "config"):
    """Raises ``ValueError`` naming ``prefix.key``, its value and ``allowed`` unless
    ``condition`` (for the checks that ``require_*`` do not cover).

    Example:
      >>> require(3 % 2 == 0, "embedding_dim", 3, "an even int")
      Traceback (most recent call last):
      ...
      ValueError: config.embedding_dim must be an even int, got 3
    """
    if not condition:
        raise ValueError(f"{prefix}.{key} must be {allowed}, got {value!r}")
