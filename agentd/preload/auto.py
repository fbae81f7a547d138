"""``--preload auto``: what a zygote may preload for a script, read from its source.

The script (or ``-m`` module) is parsed, never run. Its module-level imports (those under
``if``, ``try`` and ``with`` at module level included, those in functions and classes not)
are matched against :data:`SAFE`, libraries known to import the same way in a zygote as in
a worker: they start no CUDA context and keep no thread a fork could not copy, and what
they read of a worker's own variables at import (Lightning: the rank) each worker derives
again (:mod:`agentd.preload.import_state`; a preload that read any other makes the agent
spawn instead). Nothing else is ever preloaded, the user's own modules least of all.

A zygote imports the library before anything of the script has run, so ``auto`` forks only
when nothing the script runs before its first import of the library can change the
process: every statement before it is a docstring, a constant, a definition (a function
without decorators, an assignment of constants), an import of a module known to leave the
process as it found it (:data:`INERT`), or an import of the job's own module (or, for
``-m``, its package's ``__init__``) that passes the same rule, read the same way. Anything
else spawns, with the file and line on the start line: a call (a helper that sets the
environment, ``exec``, ``site.addsitedir``), a write to ``os.environ`` or ``sys.path``
under any alias, an import of another library.

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
from collections.abc import Iterator, Mapping
from importlib.machinery import PathFinder
from typing import NamedTuple

SAFE = ("torch", "numpy", "lightning", "pytorch_lightning", "lightning_fabric")
"""The libraries ``auto`` preloads, in import order (torch first: it imports numpy, and
Lightning imports torch)."""
SAFE_NAMED = "torch, numpy, Lightning"
""":data:`SAFE` as the start line names it."""
INERT = frozenset(
    {
        "__future__", "abc", "argparse", "array", "ast", "asyncio", "atexit", "base64",
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
thread or library state changed): importing them before the library keeps the fork."""

_WRITES = frozenset(
    {"setdefault", "update", "pop", "popitem", "clear", "insert", "append", "extend", "remove"}
)
"""Methods that change ``os.environ`` or ``sys.path`` when called on them."""
_ENV_CALLS = frozenset({"putenv", "unsetenv", "load_dotenv"})
"""Calls that change the environment whatever they are called on."""
_RUNS_CODE = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
"""Expressions that run code of their own (or change a name) when evaluated."""


class AutoPreload(NamedTuple):
    """What ``auto`` chose: ``modules`` to preload (None: spawn; empty: a bare zygote) and
    why, for the start line."""

    modules: tuple[str, ...] | None
    reason: str


class _Scan(NamedTuple):
    """How a file's module-level code reaches the library: ``reached`` the libraries its
    first import of one names (None: it never imports one); ``problem`` the first
    statement before that which may change the process, as ``file:line what``."""

    reached: tuple[str, ...] | None = None
    problem: str | None = None

    @property
    def decided(self) -> bool:
        """The reading can stop here: the library was reached, or a problem found."""
        return self.reached is not None or self.problem is not None


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
    try:
        tree = _parse(source)
    except (OSError, SyntaxError, ValueError) as exc:
        return AutoPreload(None, f"cannot read {name}: {type(exc).__name__}")
    found: list[str] = []
    for node in _module_level(tree.body):
        found.extend(t for t in _imported(node) if t in SAFE and t not in found)
    reader = _Reader(path0)
    scan = _Scan()
    for init in first:
        scan = reader.scan_file(init, _display(init, cwd))
        if scan.decided:
            break
    else:
        scan = reader.scan(tree, name)
    found.extend(t for t in scan.reached or () if t not in found)
    if not found:
        return AutoPreload((), f"{name} imports none of {SAFE_NAMED}")
    if scan.problem is not None:
        library = (scan.reached or found)[0]
        return AutoPreload(None, f"{scan.problem} before it imports {library}")
    for top in found:
        if PathFinder.find_spec(top, [path0]) is not None:
            return AutoPreload(None, f"{name}'s folder has its own {top!r}, not the library")
        if PathFinder.find_spec(top, sys.path) is None:
            return AutoPreload(None, f"{top} is not installed for {sys.executable}")
    ordered = tuple(m for m in SAFE if m in found)
    return AutoPreload(ordered, f"{name} imports {', '.join(ordered)}")


class _Reader:
    """Reads module-level code up to the library's first import, following the job's own
    modules (found in ``path0``) as Python would run them, each file once."""

    def __init__(self, path0: str) -> None:
        self._path0 = path0
        self._read: set[str] = set()
        self._aliases: dict[str, str] = {}
        """The current file's imported names -> what they were imported as."""

    def scan_file(self, path: str, display: str) -> _Scan:
        real = os.path.realpath(path)
        if real in self._read:  # imported once: its second import runs nothing
            return _Scan()
        self._read.add(real)
        try:
            tree = _parse(path)
        except (OSError, SyntaxError, ValueError) as exc:
            return _Scan(problem=f"{display}: cannot be read ({type(exc).__name__})")
        return self.scan(tree, display)

    def scan(self, tree: ast.Module, display: str) -> _Scan:
        outer, self._aliases = self._aliases, {}
        try:
            return self._statements(tree.body, display)
        finally:
            self._aliases = outer

    def _statements(self, body: list[ast.stmt], display: str) -> _Scan:
        for node in body:
            scan = self._statement(node, display)
            if scan.decided:
                return scan
        return _Scan()

    def _statement(self, node: ast.stmt, display: str) -> _Scan:
        where = f"{display}:{node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            return self._import(node, where)
        if isinstance(node, ast.If) and _inert(node.test):
            scan = self._statements(node.body, display)
            return scan if scan.decided else self._statements(node.orelse, display)
        if isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse):
                scan = self._statements(block, display)
                if scan.decided:
                    return scan
            return self._statements(node.finalbody, display)
        if _defines_only(node):
            return _Scan()
        what = _changes_environment(node, self._aliases)
        if what is not None:
            return _Scan(problem=f"{where} changes {what}")
        return _Scan(problem=f"{where} runs `{_snippet(node)}`")

    def _import(self, node: ast.Import | ast.ImportFrom, where: str) -> _Scan:
        if isinstance(node, ast.ImportFrom) and node.level:  # a package's own relative import
            return _Scan(problem=f"{where} imports .{node.module or ''} (relative)")
        for alias in node.names:  # what each bound name stands for (``env``: os.environ)
            if isinstance(node, ast.ImportFrom):
                self._aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif alias.asname:
                self._aliases[alias.asname] = alias.name
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        tops = [str(n).split(".")[0] for n in names]
        reached = tuple(dict.fromkeys(t for t in tops if t in SAFE))
        if reached:
            return _Scan(reached=reached)
        for dotted in map(str, names):
            top = dotted.split(".")[0]
            files = _own_files(dotted, self._path0)
            if files and isinstance(node, ast.ImportFrom):  # submodules it names run too
                for alias in node.names:
                    extra = _own_files(f"{dotted}.{alias.name}", self._path0)
                    files += [path for path in extra if path not in files]
            for path in files:
                scan = self.scan_file(path, _display(path, self._path0))
                if scan.decided:
                    return scan
            if not files and top not in INERT:
                return _Scan(
                    problem=f"{where} imports {top} (not known to leave the process unchanged)"
                )
        return _Scan()


def _parse(path: str) -> ast.Module:
    with open(path, "rb") as fp:
        return ast.parse(fp.read(), path)


def _display(path: str, base: str) -> str:
    """``path`` as the start line names it: relative to the job's folder when inside."""
    relative = os.path.relpath(path, base)
    return path if relative.startswith("..") else relative


def _own_files(dotted: str, path0: str) -> list[str]:
    """The files of the job's own folder that ``import dotted`` runs, in order (each
    package's ``__init__``, then the module); [] when it is not the job's."""
    parts = dotted.split(".")
    files: list[str] = []
    search = [path0]
    for depth in range(len(parts)):
        spec = PathFinder.find_spec(parts[depth], search)
        if spec is None or not spec.has_location or spec.origin is None:
            return files if depth else []
        if not spec.origin.endswith(".py"):
            return files  # an extension module: not read, and not ours to judge
        files.append(spec.origin)
        search = list(spec.submodule_search_locations or [])
        if not search:
            break
    return files


def _package_inits(target: str, cwd: str) -> list[str]:
    """The ``__init__`` files ``python -m target`` runs before the module itself."""
    inits = _own_files(target, cwd)
    source = _module_source(target, cwd)
    return [path for path in inits if path != source]


def _defines_only(node: ast.stmt) -> bool:
    """A statement that only binds names to constants or plain functions (no decorator,
    defaults that run nothing), or does nothing."""
    if isinstance(node, ast.Pass | ast.Global | ast.Nonlocal):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)  # a docstring
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        return not node.decorator_list and all(_inert(d) for d in defaults)
    if isinstance(node, ast.Assign):
        return all(_names_only(t) for t in node.targets) and _inert(node.value)
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        value = node.value
        return isinstance(node.target, ast.Name) and (value is None or _inert(value))
    return False


def _names_only(target: ast.expr) -> bool:
    if isinstance(target, ast.Tuple | ast.List):
        return all(_names_only(t) for t in target.elts)
    return isinstance(target, ast.Name)


def _inert(expr: ast.expr) -> bool:
    """An expression that runs no code of its own: literals, names, and what is built of
    them (no call anywhere in it)."""
    return not any(isinstance(sub, _RUNS_CODE) for sub in ast.walk(expr))


def _snippet(node: ast.stmt) -> str:
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 48 else text[:45] + "..."


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


def _changes_environment(node: ast.stmt, aliases: Mapping[str, str]) -> str | None:
    """``"the environment"`` or ``"sys.path"`` when ``node`` itself (not a block it opens)
    writes to it, under any alias in ``aliases`` (name -> what it was imported as)."""
    parts: list[ast.AST] = []
    for field, value in ast.iter_fields(node):
        if field in ("body", "orelse", "finalbody", "handlers"):
            continue
        parts.extend(value if isinstance(value, list) else [value])
    for part in parts:
        if not isinstance(part, ast.AST):
            continue
        for sub in ast.walk(part):
            what = _written(sub, aliases)
            if what is not None:
                return what
    return None


def _written(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
        return _target_of(node.value, aliases)
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in _ENV_CALLS:
            return "the environment"
        if isinstance(func, ast.Attribute) and called in _WRITES:
            return _target_of(func.value, aliases)
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return _target_of(node, aliases)
    return None


def _target_of(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """``"the environment"`` for ``os.environ`` (``environ``), ``"sys.path"`` for it."""
    name = _dotted(node, aliases)
    if name in ("os.environ", "environ"):
        return "the environment"
    if name == "sys.path":
        return "sys.path"
    return None


def _dotted(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """``a.b.c`` for an attribute chain, its first name resolved through ``aliases``."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base is not None else None
    return None
