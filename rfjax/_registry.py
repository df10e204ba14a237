"""A name -> entry table for the library's registries (couplings, feature maps)."""

from __future__ import annotations


class Registry[T]:
    """Entries by name, in registration order, with errors that name the kind and the choices.

    Args:
      kind: what the names denote, for messages (e.g. ``"coupling"``).
    """

    def __init__(self, kind: str):
        self._kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        """Adds ``entry`` under ``name``; a ``TypeError`` for a name that is not a non-empty
        string, a ``ValueError`` if the name is taken."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self._kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self._kind} {name!r} is already registered")
        self._entries[name] = entry

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def items(self) -> tuple[tuple[str, T], ...]:
        """(name, entry) pairs, in registration order."""
        return tuple(self._entries.items())

    def get(self, name: str) -> T:
        """The entry of ``name``; a ``TypeError`` if it is not a string, a ``ValueError``
        listing the registered names if it is unknown."""
        if not isinstance(name, str):
            raise TypeError(f"{self._kind} name must be a string, got {type(name).__name__}")
        if name not in self._entries:
            raise ValueError(
                f"unknown {self._kind} {name!r}; available: {', '.join(self._entries)}"
            )
        return self._entries[name]
