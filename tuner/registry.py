"""A small name registry: plugins are chosen by their `kind`, never by if/elif chains."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from tuner.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a `kind` string to a plugin; `get` names the valid kinds when the kind is unknown."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._entries: dict[str, T] = {}

    def register(self, kind: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            if kind in self._entries:
                raise ValueError(f"{self._what} kind {kind!r} is registered twice")
            self._entries[kind] = entry
            return entry

        return decorator

    def get(self, kind: str) -> T:
        try:
            return self._entries[kind]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "none"
            raise ConfigError(f"unknown {self._what} kind {kind!r}; valid kinds: {valid}") from None

    def kinds(self) -> list[str]:
        return sorted(self._entries)
