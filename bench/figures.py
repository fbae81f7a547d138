"""The figures the docs quote, kept in one data file, ``docs/figures.json``.

    python bench/figures.py check     # exit 1 naming every quoted figure that differs
    python bench/figures.py render    # write every quoted figure from the data file

A page quotes a figure as ``<!--fig:NAME-->TEXT<!--/fig-->`` (the marks do not show once
rendered): TEXT must be the data file's ``text`` for NAME, which ``tests/test_figures.py``
checks for README.md and every page under docs/. Each entry says how it was measured
(``command``), when, and on what machine. A benchmark run with ``--record`` writes what it
measured into the file (:func:`record`); ``render`` then carries it to every page.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from report_files import write_report

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "figures.json"
MARK = re.compile(r"<!--fig:([a-z0-9_]+)-->(.*?)<!--/fig-->", re.DOTALL)


def load(path: Path = DATA) -> dict[str, dict[str, Any]]:
    """Every figure by name: ``text`` (as the pages quote it), ``command``, ``measured``
    (a date), ``machine``, and optionally ``note``."""
    return json.loads(path.read_text())


def record(
    name: str, text: str, command: str, note: str = "", path: Path = DATA, device: str = ""
) -> None:
    """Store figure ``name`` as measured now by ``command`` (a benchmark's ``--record``),
    on this machine and ``device`` (a GPU's name, versions), where one was used."""
    figures = load(path) if path.exists() else {}
    machine = f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    entry = {
        "text": text,
        "command": command,
        "measured": time.strftime("%Y-%m-%d"),
        "machine": f"{device}, {machine}" if device else machine,
    }
    if note:
        entry["note"] = note
    figures[name] = entry
    write_report(path, json.dumps(dict(sorted(figures.items())), indent=2) + "\n")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"  recorded {name} = {text!r} in {shown}")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may quote figures: README.md and the manual."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def problems(root: Path = ROOT) -> list[str]:
    """One line for each quoted figure that is unknown or differs from the data file, and
    for each figure in the file that no page quotes."""
    figures = load(root / "docs" / "figures.json")
    found: list[str] = []
    quoted: set[str] = set()
    for page in pages(root):
        for mark in MARK.finditer(page.read_text()):
            name, text = mark[1], mark[2]
            quoted.add(name)
            where = page.relative_to(root)
            if name not in figures:
                found.append(f"{where}: figure {name!r} is not in docs/figures.json")
            elif text != figures[name]["text"]:
                found.append(
                    f"{where}: {name} says {text!r}, docs/figures.json {figures[name]['text']!r}"
                )
    found += [f"docs/figures.json: {name} is quoted nowhere" for name in figures.keys() - quoted]
    return found


def render(root: Path = ROOT) -> int:
    """Write every quoted figure from the data file; returns how many changed."""
    figures = load(root / "docs" / "figures.json")
    changed = 0
    for page in pages(root):
        text = page.read_text()

        def put(mark: re.Match[str]) -> str:
            entry = figures.get(mark[1])
            return mark[0] if entry is None else f"<!--fig:{mark[1]}-->{entry['text']}<!--/fig-->"

        new = MARK.sub(put, text)
        if new != text:
            write_report(page, new)
            changed += 1
    return changed


def main(argv: list[str]) -> int:
    if argv[1:] == ["render"]:
        print(f"{render()} page(s) changed")
        return 0
    if argv[1:] == ["check"]:
        found = problems()
        for line in found:
            print(line)
        return 1 if found else 0
    print(__doc__.split("\n\n")[1])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
