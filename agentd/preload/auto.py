"""``--preload auto``: what a zygote may preload for a script, read from its source.

The script (or ``-m`` module) is parsed, never run. Its module-level imports (those under
``if``, ``try`` and ``with`` at module level included, those in functions and classes not)
are matched against :data:`SAFE`, libraries known to import the same way in a zygote as in
a worker: they start no CUDA context and keep no thread a fork could not copy, and what
they read of a worker's own variables at import (Lightning: the rank) each worker derives
again (:mod:`agentd.preload.import_state`; a preload that read any other makes the agent
spawn instead). Nothing else is ever preloaded, the user's own modules least of all.

A zygote imports a library before anything of the script has run, so ``auto`` preloads
only the libraries the script imports before anything that may change the process
(:mod:`agentd.preload.source_reading` says what keeps the reading going: a docstring, a
constant, a definition, an import of a module known to leave the process as it found it,
of the job's own module read the same way, ...). A script that runs such a statement
before its first import of one spawns, with the file and line on the start line; one that
runs it between two such imports preloads those before it alone (the start line names
the others).

Spawn is kept too, with the reason in one line, when:

- the script is not found, not readable or not valid Python (spawn reports it as usual);
- the libraries it imports are not installed for this interpreter;
- its own folder holds a module of the same name, which would shadow the library.

A script that imports none of :data:`SAFE` is forked from a bare zygote, which preloads
nothing (``()``): nothing of the script runs before the fork, so no rule applies, and each
worker of each attempt saves an interpreter's start.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from importlib.machinery import PathFinder
from typing import NamedTuple

SAFE = ("torch", "numpy", "lightning", "pytorch_lightning", "lightning_fabric", "transformers")
"""The libraries ``auto`` preloads, in import order (torch first: it imports numpy, and
Lightning imports torch)."""
SAFE_NAMED = "torch, numpy, Lightning, transformers"
""":data:`SAFE` as the start line names it."""


INERT = frozenset(
    {
        "__future__", "abc", "agentd", "argparse", "array", "ast", "asyncio", "atexit", "base64",
        "binascii", "bisect", "builtins", "bz2", "calendar", "cmath", "codecs", "collections",
        "colorsys", "concurrent", "contextlib", "contextvars", "copy", "csv", "ctypes",
        "dataclasses", "datetime", "decimal", "difflib", "dis", "enum", "errno", "faulthandler",
        "fnmatch", "fractions", "functools", "gc", "getopt", "getpass", "glob", "graphlib",
        "gzip", "hashlib", "heapq", "hmac", "http", "importlib", "inspect", "io", "ipaddress",
        "itertools", "json", "keyword", "linecache", "locale", "logging", "lzma", "math",
        "mmap", "multiprocessing", "numbers", "operator", "optparse", "os", "pathlib", "pickle",
        "platform", "pprint", "queue", "random", "re", "resource", "runpy", "secrets",
        "selectors", "shelve", "shlex", "shutil", "signal", "socket", "sqlite3", "stat",
        "statistics", "string", "struct", "subprocess", "sys", "sysconfig", "tarfile",
        "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback", "types",
        "typing", "typing_extensions", "urllib", "uuid", "warnings", "weakref", "zipfile",
        "zlib",
    }
)  # fmt: skip
"""Modules whose import leaves the process as it found it (no environment, path, signal,
thread or library state changed): importing them before the library keeps the fork.
``agentd`` is one (its worker side opens nothing until first used: ``import agentd``, a
heartbeat's, sorts before ``import torch``); its integrations import the library they
serve, in the worker, after the zygote's."""


class AutoPreload(NamedTuple):
    """What ``auto`` chose: ``modules`` to preload (None: spawn; empty: a bare zygote) and
    why, for the start line."""

    modules: tuple[str, ...] | None
    reason: str


def choose(kind: str, target: str, cwd: str | None = None) -> AutoPreload:
    """The preload for ``python target`` (``kind`` ``"script"``) or ``python -m target``
    (``kind`` ``"module"``) run in ``cwd``, by the agent's own interpreter."""
    cwd = cwd or os.getcwd()
    if kind == "module":
        source, path0 = _module_source(target, cwd), cwd
        name = f"-m {target}"
        first = _package_inits(target, cwd)  # python -m runs them before the module
    else:
        source = os.path.join(cwd, target)
        path0 = os.path.dirname(os.path.realpath(source))
        name = os.path.basename(target.rstrip("/"))
        if os.path.isdir(source):  # python runs its __main__.py, the folder on its path
            source, path0 = os.path.join(source, "__main__.py"), os.path.realpath(source)
        elif not source.endswith(".py"):
            from agentd.preload.command import runs_main_of  # a .py is read as it is

            if runs_main_of(source):
                return AutoPreload(None, f"{name} is a zip application (its imports not read)")
        first = []
    if source is None:
        return AutoPreload(None, f"{name}: source not found")
    try:  # read here: the reader of the job's own modules loads only where there is one
        with open(source, "rb") as fp:
            tree = ast.parse(fp.read(), source)
    except (OSError, SyntaxError, ValueError) as exc:
        return AutoPreload(None, f"cannot read {name}: {type(exc).__name__}")
    found: list[str] = []
    imports_only_inert = not first
    for node in _module_level(tree.body):
        tops = _imported(node)
        found.extend(t for t in tops if t in SAFE and t not in found)
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports_only_inert &= bool(tops) and all(t in INERT for t in tops)
    if imports_only_inert:  # none of the libraries, nor a module of the job's to read
        return AutoPreload((), f"{name} imports none of {SAFE_NAMED}")
    from agentd.preload.source_reading import Reader, display

    reader = Reader(path0, SAFE, INERT)
    for init in first:
        reader.scan_file(init, display(init, cwd))
    reader.scan(tree, name)
    reached = reader.reached
    found.extend(t for t in reached if t not in found)
    if not found:
        return AutoPreload((), f"{name} imports none of {SAFE_NAMED}")
    if not reached:
        return AutoPreload(None, f"{reader.problem} before it imports {found[0]}")
    for top in reached:
        if PathFinder.find_spec(top, [path0]) is not None:
            return AutoPreload(None, f"{name}'s folder has its own {top!r}, not the library")
        if PathFinder.find_spec(top, sys.path) is None:
            return AutoPreload(None, f"{top} is not installed for {sys.executable}")
    ordered = tuple(m for m in SAFE if m in reached)
    reason = f"{name} imports {', '.join(ordered)}"
    later = [t for t in found if t not in reached]
    if later:  # a worker imports them after the process may have changed: not preloaded
        reason += f"; {', '.join(later)} only after {reader.problem}"
    return AutoPreload(ordered, reason)


def _package_inits(target: str, cwd: str) -> list[str]:
    """The ``__init__`` files ``python -m target`` runs before the module itself."""
    from agentd.preload.source_reading import own_files

    inits = own_files(target, cwd)
    source = _module_source(target, cwd)
    return [path for path in inits if path != source]


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
