"""The house rules (docs/architecture.md): folders in declared layers, no import cycles, a
small top level, small modules, and services that see the agent only through its view."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentd"
MAX_TOP_LEVEL = 15
MAX_LINES = 400
LONG_REASON = "Longer than 400 lines because"
"""A module over :data:`MAX_LINES` says why in its docstring, in a sentence starting so."""


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of every node under an ``if TYPE_CHECKING:`` (imports for annotations)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def imports_of(name: str, path: Path, known: set[str], run_time: bool = False) -> set[str]:
    """Every agentd module ``name`` imports, anywhere in the file (``from pkg import mod``
    counts as the submodule); with ``run_time``, those under ``if TYPE_CHECKING:`` left
    out. A package's __init__ re-exports are left out of the module graph: they do not
    couple features (``run_time`` keeps them: at run time they do import)."""
    if path.name == "__init__.py" and not run_time:
        return set()
    tree = ast.parse(path.read_text())
    skip = type_checking_nodes(tree) if run_time else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
    long = {
        name: n
        for name, path in found.items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
        and LONG_REASON not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    }
    assert long == {}


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("exceptions", "support")),
    ("contracts", ("wire", "errors", "view")),
    ("domain", ("restart_policy", "spec", "group")),
    ("stores", ("store", "tcpstore", "rendezvous")),
    ("processes", ("hygiene", "workers")),
    (
        "services",
        (
            "gpus",
            "reports",
            "telemetry",
            "preload",
            "timer",
            "nodecheck",
            "drain",
            "heartbeats",
            "inprocess",  # its worker side starts each attempt's step count (heartbeats)
            "slownodes",
            "jobview",
            "joblogs",
            "health",
        ),
    ),
    ("assembly", ("assembly",)),
    ("agent", ("agent",)),
    ("edges", ("schedulers", "config", "elastic", "launcher", "integrations", "cli", "__main__")),
)
"""agentd's folders (a top-level module is its own), bottom-up, as docs/architecture.md
draws them: at run time each imports only folders listed before it. Imports under
``if TYPE_CHECKING:`` are annotations, and may name any folder's types."""
ORDER = [folder for _, folders in LAYERS for folder in folders]


def folder_of(module: str) -> str:
    """``agentd.x.y`` -> ``x``; a top-level module ``agentd.x`` is its own folder."""
    return module.split(".")[1]


def upward_imports(order: list[str]) -> list[str]:
    """Each run-time import of a folder not listed before the importer's own, as
    ``importer -> imported``."""
    found = modules()
    known = set(found)
    rank = {folder: i for i, folder in enumerate(order)}
    wrong = set()
    for name, path in found.items():
        if name == "agentd":
            continue  # the package's lazy public names
        for target in imports_of(name, path, known, run_time=True):
            if target == "agentd" or folder_of(target) == folder_of(name):
                continue
            if rank[folder_of(target)] >= rank[folder_of(name)]:
                wrong.add(f"{name} -> {target}")
    return sorted(wrong)


def test_every_folder_has_its_place_in_the_layers():
    folders = {folder_of(name) for name in modules() if name != "agentd"}
    assert sorted(folders - set(ORDER)) == [], "add it to LAYERS (and docs/architecture.md)"
    assert sorted(set(ORDER) - folders) == []
    assert len(ORDER) == len(set(ORDER))


def test_folders_import_only_the_layers_below_them():
    assert upward_imports(ORDER) == []


def test_the_layer_check_sees_an_import_upward():
    """``spec`` imports ``restart_policy`` at run time: with the order reversed, that is an
    import of a folder above it, and the check names it."""
    swapped = ["spec", "restart_policy", *(f for f in ORDER if f not in ("spec", "restart_policy"))]
    assert "agentd.spec -> agentd.restart_policy" in upward_imports(swapped)


def test_the_documented_layers_are_the_checked_ones():
    """docs/architecture.md draws every layer with its folders, in this order (a row
    without a name goes on with the row above)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    drawn: list[tuple[str, tuple[str, ...]]] = []
    for line in text.split("```")[1].splitlines():
        name, _, rest = line.partition("│")
        folders = tuple(rest.replace("/", " ").replace(".py", " ").split())
        if name.strip():
            drawn.append((name.strip(), folders))
        elif folders:
            drawn[-1] = (drawn[-1][0], drawn[-1][1] + folders)
    assert tuple(reversed(drawn)) == LAYERS


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
