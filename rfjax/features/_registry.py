"""Named feature maps: ``register``/``get``/``available``/``info``, as for couplings.

Configs, ``rfjax.attention``, ``rfjax.nn`` and ``rfjax.sklearn`` take feature maps by these
names, so a new named map is one module (its feature function and ``FeatureMap``) plus one
``register`` call (in ``rfjax/features/__init__.py``) and its tests.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Literal

from rfjax._registry import Registry
from rfjax.features._protocol import FeatureMap

Kernel = Literal["softmax", "gaussian"]
KERNELS: tuple[Kernel, ...] = ("softmax", "gaussian")


@dataclasses.dataclass(frozen=True)
class FeatureMapInfo:
    """What the registry knows about a named feature map.

    Attributes:
      name: the config name.
      factory: ``(**options) -> FeatureMap``; every option has a default.
      kernel: the kernel that query features . key features estimate without bias:
        ``"softmax"`` (exp(x.y)), ``"gaussian"`` (exp(-|x - y|^2 / 2)), or ``None`` for a kernel
        of the map's own (e.g. the ReLU features of generalised attention).
      label: a short name for tables and legends.
    """

    name: str
    factory: Callable[..., FeatureMap]
    kernel: Kernel | None
    label: str


_REGISTRY: Registry[FeatureMapInfo] = Registry("feature map")


def register(
    name: str, factory: Callable[..., FeatureMap], *, kernel: Kernel | None, label: str
) -> None:
    """Registers ``factory`` under ``name`` (an error if the name is taken).

    Args:
      name: the config name, e.g. ``"positive"``.
      factory: ``(**options) -> FeatureMap`` with a default for every option (usually the map's
        class, or a ``functools.partial`` of it).
      kernel: the kernel the map estimates (see ``FeatureMapInfo``).
      label: a short name for tables and legends.

    Raises:
      TypeError: for a name or label that is not a non-empty string or a factory that is not
        callable.
      ValueError: if the name is taken or ``kernel`` is unknown.
    """
    if not callable(factory):
        raise TypeError(f"factory for {name!r} must be callable, got {type(factory).__name__}")
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None, got {kernel!r}")
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a non-empty string, got {label!r}")
    _REGISTRY.add(name, FeatureMapInfo(name, factory, kernel, label))


def available(*, kernel: Kernel | None = None) -> tuple[str, ...]:
    """Names of the registered feature maps (registration order), optionally only those that
    estimate ``kernel``."""
    return tuple(n for n, i in _REGISTRY.items() if kernel is None or i.kernel == kernel)


def info(name: str) -> FeatureMapInfo:
    """The registry entry of ``name``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no feature map has that name; the message lists the known names.
    """
    return _REGISTRY.get(name)


def get(name: str) -> Callable[..., FeatureMap]:
    """The factory registered under ``name``: ``get("positive")()`` is a ``FeatureMap``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no feature map has that name; the message lists the known names.

    Examples:
      >>> from rfjax import features
      >>> features.get("positive_antithetic")()
      PositiveFeatureMap(antithetic=True)
    """
    return info(name).factory


def build(name: str, **options: object) -> FeatureMap:
    """The map ``name`` made with the ``options`` its factory takes; the others are left out, so
    one set of options (e.g. a model's ``num_sign_features`` and ``num_clusters``) serves every
    map.

    Raises:
      TypeError, ValueError: as ``get``, or from the factory for a bad option value.

    Examples:
      >>> from rfjax import features
      >>> features.build("angular_hybrid", num_sign_features=4, num_clusters=3)
      AngularHybridFeatureMap(num_sign_features=4, sign_projection=None)
    """
    factory = get(name)
    accepted = inspect.signature(factory).parameters
    return factory(**{key: value for key, value in options.items() if key in accepted})
