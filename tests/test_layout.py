"""The house rules (docs/architecture.md): no import cycles, a small top level, small
modules, and services that see the agent only through its view."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentd"
MAX_TOP_LEVEL = 15
MAX_LINES = 450


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every agentd module ``name`` imports, anywhere in the file (``from pkg import mod``
    counts as the submodule). A package's __init__ re-exports are left out: they do not
    couple features."""
    if path.name == "__init__.py":
        return set()
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif node.module in known:
                    found.add(node.module)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_small_top_level_and_small_modules():
    found = modules()
    top = [name for name, path in found.items() if path.parent == PACKAGE]
    assert len(top) <= MAX_TOP_LEVEL, sorted(top)
    long = {name: n for name, path in found.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


CORE_AND_EDGES = (
    "agentd.agent",
    "agentd.elastic",
    "agentd.cli",
    "agentd.launcher",
    "agentd.config.build",
)
"""The core, and the edges that compose it (the CLI builds its agent in config/build.py)."""


def test_services_see_the_agent_only_through_its_view():
    reaching = sorted(
        name
        for name, deps in graph().items()
        if "agentd.agent.local" in deps and not name.startswith(CORE_AND_EDGES)
    )
    assert reaching == []
