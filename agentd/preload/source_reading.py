"""How ``--preload auto`` reads a script's module-level code, without running it: which
libraries it imports before anything that may change the process (see
:mod:`agentd.preload.auto`, which chooses from what this reads).

A statement keeps the reading going when it is a docstring, a constant, a definition (a
function without decorators, an assignment of constants), an ``if`` whose test calls
nothing or a ``try`` (their blocks are read), an import of a module known to leave the
process as it found it (``auto``'s :data:`~agentd.preload.auto.INERT`), an import of a
library the reader collects, or an import of the job's own module (found in its folder),
read the same way. Anything else stops it: a call (a helper that sets the environment,
``exec``, ``site.addsitedir``), a write to ``os.environ`` or ``sys.path`` under any
alias, an import of another library.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Collection, Mapping
from importlib.machinery import PathFinder

_WRITES = frozenset(
    {"setdefault", "update", "pop", "popitem", "clear", "insert", "append", "extend", "remove"}
)
"""Methods that change ``os.environ`` or ``sys.path`` when called on them."""
_ENV_CALLS = frozenset({"putenv", "unsetenv", "load_dotenv"})
"""Calls that change the environment whatever they are called on."""
_RUNS_CODE = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
"""Expressions that run code of their own (or change a name) when evaluated."""


class Reader:
    """Reads module-level code as Python would run it, following the job's own modules
    (found in ``path0``), each file once, imports of the ``inert`` modules passed over:
    it collects the ``libraries`` imported (:attr:`reached`, in order) until the first
    statement that may change the process (:attr:`problem`), where it stops."""

    def __init__(self, path0: str, libraries: Collection[str], inert: Collection[str]) -> None:
        self._path0 = path0
        self._libraries = libraries
        self._inert = inert
        self._read: set[str] = set()
        self._aliases: dict[str, str] = {}
        """The current file's imported names -> what they were imported as."""
        self.reached: list[str] = []
        """The libraries imported before :attr:`problem`, in order."""
        self.problem: str | None = None
        """The first statement that may change the process, as ``file:line what``."""
        self.taken: dict[str, list[str]] = {}
        """The names taken from a library itself before :attr:`problem` (``from
        transformers import Trainer``: ``{"transformers": ["Trainer"]}``), in order."""

    def scan_file(self, path: str, display: str) -> None:
        """Read the file at ``path`` (``display`` names it in :attr:`problem`)."""
        real = os.path.realpath(path)
        if real in self._read or self.problem is not None:  # a second import runs nothing
            return
        self._read.add(real)
        try:
            tree = parse(path)
        except (OSError, SyntaxError, ValueError) as exc:
            self.problem = f"{display}: cannot be read ({type(exc).__name__})"
            return
        self.scan(tree, display)

    def scan(self, tree: ast.Module, display: str) -> None:
        """Read a parsed file (see :meth:`scan_file`)."""
        outer, self._aliases = self._aliases, {}
        try:
            self._statements(tree.body, display)
        finally:
            self._aliases = outer

    def _statements(self, body: list[ast.stmt], display: str) -> None:
        for node in body:
            if self.problem is not None:
                return
            self._statement(node, display)

    def _statement(self, node: ast.stmt, display: str) -> None:
        where = f"{display}:{node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            self._import(node, where)
        elif isinstance(node, ast.If) and _inert(node.test):
            self._statements(node.body, display)
            self._statements(node.orelse, display)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse):
                self._statements(block, display)
            self._statements(node.finalbody, display)
        elif not _defines_only(node):
            what = _changes_environment(node, self._aliases)
            self.problem = (
                f"{where} changes {what}"
                if what is not None
                else f"{where} runs `{_snippet(node)}`"
            )

    def _import(self, node: ast.Import | ast.ImportFrom, where: str) -> None:
        if isinstance(node, ast.ImportFrom) and node.level:  # a package's own relative import
            self.problem = f"{where} imports .{node.module or ''} (relative)"
            return
        for alias in node.names:  # what each bound name stands for (``env``: os.environ)
            if isinstance(node, ast.ImportFrom):
                self._aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif alias.asname:
                self._aliases[alias.asname] = alias.name
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        for dotted in map(str, names):
            top = dotted.split(".")[0]
            if top in self._libraries:
                if top not in self.reached:
                    self.reached.append(top)
                if isinstance(node, ast.ImportFrom) and dotted == top:
                    taken = self.taken.setdefault(top, [])
                    taken += [a.name for a in node.names if a.name not in taken and a.name != "*"]
                continue
            files = own_files(dotted, self._path0)
            if files and isinstance(node, ast.ImportFrom):  # submodules it names run too
                for alias in node.names:
                    extra = own_files(f"{dotted}.{alias.name}", self._path0)
                    files += [path for path in extra if path not in files]
            for path in files:
                self.scan_file(path, display(path, self._path0))
            if self.problem is not None:
                return
            if not files and top not in self._inert:
                self.problem = f"{where} imports {top} (not known to leave the process unchanged)"
                return


def parse(path: str) -> ast.Module:
    with open(path, "rb") as fp:
        return ast.parse(fp.read(), path)


def display(path: str, base: str) -> str:
    """``path`` as the start line names it: relative to the job's folder when inside."""
    relative = os.path.relpath(path, base)
    return path if relative.startswith("..") else relative


def own_files(dotted: str, path0: str) -> list[str]:
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
