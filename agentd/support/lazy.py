"""Lazy public names: a package lists where each lives; it is imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` once and caches the name."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
