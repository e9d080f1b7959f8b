"""Exports imported on first use: a package's `__getattr__` made from a table of name to module, so that
importing the package loads none of the modules behind it. Imports nothing of the package."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: each name of `exports` from its module, imported when first
    asked for; any other name an `AttributeError`, as Python's own."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module), name)

    return __getattr__
