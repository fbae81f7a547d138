"""The names a script takes from a preloaded library that loads them only when asked.

``from transformers import Trainer`` imports the library's top module at once and
``Trainer``'s own modules (most of the import) only when the name is looked up. A zygote
that imported only the top module would leave the rest to every worker of every attempt,
so the zygote also looks up the names the script takes from each preloaded library
itself (``from LIB import a, b``) at module level, before anything that may change the
process, read as ``--preload auto`` reads it (:mod:`agentd.preload.source_reading`). It
runs nothing the worker would not have run before its first line of its own: the names'
modules, under the same watch of the environment and CUDA as the preload.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType


def taken(script: str | None, path0: str, libraries: Sequence[str]) -> dict[str, list[str]]:
    """The names ``script`` (None for ``-m``: nothing) takes from ``libraries`` at module
    level before anything that may change the process ({} where it cannot be read)."""
    if script is None:
        return {}
    from agentd.preload.auto import INERT
    from agentd.preload.source_reading import Reader, parse

    reader = Reader(path0, libraries, INERT)
    try:
        tree = parse(script)
    except (OSError, SyntaxError, ValueError):
        return {}
    reader.scan(tree, os.path.basename(script))
    return reader.taken


def look_up(module: ModuleType, names: Sequence[str]) -> list[str]:
    """Look up each of ``names`` that ``module`` has not loaded yet; return those that
    loaded now. A name that fails is left for the worker's own import to report."""
    loaded = []
    for name in names:
        if name in vars(module):
            continue
        try:
            getattr(module, name)
        except Exception:
            continue
        loaded.append(name)
    return loaded
