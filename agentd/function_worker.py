"""Runs a Python function entrypoint inside a worker subprocess.

``python -m agentd.function_worker CALL RESULT``: ``CALL`` holds two pickles written by the
agent (the agent's ``sys.path``, then ``(function, args)``; the function travels by
reference, so it must be importable). The return value is pickled to ``RESULT``; an
exception goes to the error file in torch's format and the worker exits 1. These files
are private to the user (mode 0600) and never cross a network.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from agentd.errors import record


def write_call(path: Path, function: Any, args: tuple[Any, ...]) -> None:
    """Write the call file for one worker (agent side)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fp:
        pickle.dump(list(sys.path), fp)
        pickle.dump((function, args), fp)


def read_result(path: Path) -> Any:
    """The function's return value (agent side); None when it wrote none."""
    try:
        with open(path, "rb") as fp:
            return pickle.load(fp)
    except FileNotFoundError:
        return None


def main(argv: list[str]) -> int:
    call_path, result_path = argv
    with open(call_path, "rb") as fp:
        for entry in reversed(pickle.load(fp)):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        function, args = pickle.load(fp)
    value = record(function)(*args)
    tmp = f"{result_path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fp:
        pickle.dump(value, fp)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
