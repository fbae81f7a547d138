"""What a worker's command line asks Python to run, so a zygote can run it after a fork.

A worker command is ``PYTHON [OPTIONS] SCRIPT ARGS...`` or ``PYTHON [OPTIONS] -m MODULE
ARGS...`` (what ``agentd run`` and function entrypoints build). The interpreter options
are fixed when an interpreter starts, so the zygote is started with the workers' own
options and every worker of the group must share them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from agentd.exceptions import ConfigError

FLAGS = frozenset("bBdEiIOqsSuvR")
"""Interpreter options without a value that a zygote can be started with."""
VALUED = frozenset("WX")
"""Interpreter options that take a value (``-W error``, ``-X dev``)."""


class PythonCommand(NamedTuple):
    """``python [options] target args``: ``kind`` is ``"script"`` or ``"module"``."""

    executable: str
    options: tuple[str, ...]
    kind: str
    target: str
    args: tuple[str, ...]

    def path0(self, cwd: str) -> str:
        """What ``sys.path[0]`` is for this command run in ``cwd``, as Python sets it."""
        if self.kind == "module":
            return cwd
        script = os.path.realpath(os.path.join(cwd, self.target))
        return script if runs_main_of(script) else os.path.dirname(script)


def runs_main_of(script: str) -> bool:
    """Whether ``python script`` runs a ``__main__.py`` inside it, with ``script`` first on
    its path: a directory, or a zip application (any file but a ``.py`` is looked into)."""
    if os.path.isdir(script):
        return True
    if script.endswith(".py"):
        return False  # without importing the zygote's side for it
    from agentd.preload.child import zip_app

    return zip_app(script) is not None


def is_python(executable: str) -> bool:
    """Whether ``executable`` names a Python interpreter (this one, or ``python*``)."""
    if executable == sys.executable:
        return True
    return os.path.basename(executable).startswith("python")


def parse(argv: Sequence[str]) -> PythonCommand:
    """Read a Python command line; raises ConfigError naming what cannot be preloaded."""
    if not argv or not is_python(argv[0]):
        raise ConfigError(
            f"--preload: the entrypoint must be Python (a script, -m module or "
            f"function), not {argv[0] if argv else ''!r}"
        )
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            return PythonCommand(
                argv[0], tuple(options), "module", argv[i + 1], tuple(argv[i + 2 :])
            )
        if arg == "-" or not arg.startswith("-"):
            if arg == "-":
                break
            return PythonCommand(argv[0], tuple(options), "script", arg, tuple(argv[i + 1 :]))
        if arg[1:2] in VALUED:
            value = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if value is None:
                break
            options += [arg[:2], value]
            i += 1 if arg[2:] else 2
            continue
        if arg[0] == "-" and arg[1:] and set(arg[1:]) <= FLAGS:
            options.append(arg)
            i += 1
            continue
        break
    raise ConfigError(
        f"--preload: cannot run {' '.join(argv[1:])!r} from a zygote; it runs "
        "python [options] script or -m module (no -c, no stdin)"
    )
