"""``--preload auto``: what a zygote may preload for a script, read from its source.

The script (or ``-m`` module) is parsed, never run. Its module-level imports (those under
``if``, ``try`` and ``with`` at module level included, those in functions and classes not)
are matched against :data:`SAFE`, libraries known to import the same way in a zygote as in
a worker: they do not read the rank, start a CUDA context or keep threads a fork could not
copy. Nothing else is ever preloaded, the user's own modules least of all.

Spawn is kept, with the reason in one line, when a forked worker could see something a
spawned one would not:

- the script is not found, not readable or not valid Python (spawn reports it as usual);
- it imports none of :data:`SAFE`, or they are not installed for this interpreter;
- its own folder holds a module of the same name, which would shadow the library;
- before it imports the library, it changes the environment (``os.environ``,
  ``os.putenv``) or ``sys.path``: the library would be imported from another place, or
  read other variables, in the zygote.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.machinery import PathFinder

SAFE = ("torch", "numpy")
"""The libraries ``auto`` preloads, in import order (torch first: it imports numpy)."""

_WRITES = frozenset(
    {"setdefault", "update", "pop", "popitem", "clear", "insert", "append", "extend", "remove"}
)
"""Methods that change ``os.environ`` or ``sys.path`` when called on them."""
_ENV_CALLS = frozenset({"putenv", "unsetenv", "load_dotenv"})
"""Calls that change the environment whatever they are called on."""


@dataclass(frozen=True)
class AutoPreload:
    """What ``auto`` chose: ``modules`` to preload (None: spawn) and why, for the start line."""

    modules: tuple[str, ...] | None
    reason: str


def choose(kind: str, target: str, cwd: str | None = None) -> AutoPreload:
    """The preload for ``python target`` (``kind`` ``"script"``) or ``python -m target``
    (``kind`` ``"module"``) run in ``cwd``, by the agent's own interpreter."""
    cwd = cwd or os.getcwd()
    if kind == "module":
        source, path0 = _module_source(target, cwd), cwd
        name = f"-m {target}"
    else:
        source = os.path.join(cwd, target)
        path0 = os.path.dirname(os.path.realpath(source))
        name = os.path.basename(target)
    if source is None:
        return AutoPreload(None, f"{name}: source not found")
    try:
        with open(source, "rb") as fp:
            tree = ast.parse(fp.read(), source)
    except (OSError, SyntaxError, ValueError) as exc:
        return AutoPreload(None, f"cannot read {name}: {type(exc).__name__}")
    found: list[str] = []
    changed: tuple[int, str] | None = None  # the first write to the environment or sys.path
    for node in _module_level(tree.body):
        if changed is None:
            what = _changes_environment(node)
            changed = (node.lineno, what) if what is not None else None
        for top in _imported(node):
            if top not in SAFE or top in found:
                continue
            if changed is not None:
                line, what = changed
                return AutoPreload(None, f"{name}:{line} changes {what} before it imports {top}")
            found.append(top)
    if not found:
        return AutoPreload(None, f"{name} imports none of {', '.join(SAFE)}")
    for top in found:
        if PathFinder.find_spec(top, [path0]) is not None:
            return AutoPreload(None, f"{name}'s folder has its own {top!r}, not the library")
        if PathFinder.find_spec(top, sys.path) is None:
            return AutoPreload(None, f"{top} is not installed for {sys.executable}")
    ordered = tuple(m for m in SAFE if m in found)
    return AutoPreload(ordered, f"{name} imports {', '.join(ordered)}")


def _module_source(target: str, cwd: str) -> str | None:
    """The file ``python -m target`` runs from ``cwd``, found without importing anything."""
    parts = target.split(".")
    search: list[str] | None = [cwd, *sys.path]
    spec = None
    for depth in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or []) or None
        if search is None and depth < len(parts) - 1:
            return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package runs its __main__
        main = PathFinder.find_spec(f"{target}.__main__", list(spec.submodule_search_locations))
        return main.origin if main is not None else None
    return spec.origin if spec.has_location else None


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import, in order, entering blocks but not definitions."""
    for node in body:
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _module_level(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            yield from _module_level(handler.body)


def _imported(node: ast.stmt) -> list[str]:
    """The top-level packages ``node`` imports (none for a relative import)."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [node.module.split(".")[0]]
    return []


def _changes_environment(node: ast.stmt) -> str | None:
    """``"the environment"`` or ``"sys.path"`` when ``node`` itself (not a block it opens)
    writes to it, else None."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return None
    parts: list[ast.AST] = []
    for field, value in ast.iter_fields(node):
        if field in ("body", "orelse", "finalbody", "handlers"):
            continue
        parts.extend(value if isinstance(value, list) else [value])
    for part in parts:
        if not isinstance(part, ast.AST):
            continue
        for sub in ast.walk(part):
            what = _written(sub)
            if what is not None:
                return what
    return None


def _written(node: ast.AST) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
        return _target_of(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in _ENV_CALLS:
            return "the environment"
        if isinstance(func, ast.Attribute) and called in _WRITES:
            return _target_of(func.value)
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return _target_of(node)
    return None


def _target_of(node: ast.AST) -> str | None:
    """``"the environment"`` for ``os.environ``/``environ``, ``"sys.path"`` for it."""
    if isinstance(node, ast.Attribute):
        if node.attr == "environ":
            return "the environment"
        if node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
            return "sys.path"
    if isinstance(node, ast.Name) and node.id == "environ":
        return "the environment"
    return None
