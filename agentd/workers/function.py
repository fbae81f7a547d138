"""Runs a Python function entrypoint inside a worker subprocess, as multiprocessing's
``spawn`` start method runs a ``Process`` target (torch's ``start_method="spawn"``).

``python -m agentd.workers.function CALL RESULT``: ``CALL`` holds two pickles written by the
agent: multiprocessing's preparation data (the launching script's ``sys.path``, working
directory, argv and main module), then ``(function, args)``. The worker prepares itself as
a spawned child does, re-running the launching script as ``__mp_main__`` (so a function
defined in it, under an ``if __name__ == "__main__":`` guard, resolves), then unpickles the
call. Multiprocessing objects in ``args`` (a ``Queue``, a ``Pipe``, a ``Lock``) arrive by
inheritance: their descriptors are passed to the worker under the same numbers.

The return value is pickled to ``RESULT``; the worker then waits for the other workers of
its attempt (:mod:`agentd.workers.release_gate`) and exits 0. Any exception, loading the
function included, goes to the error file in torch's format and the worker exits 1. These
files are private to the user (mode 0600) and never cross a network.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from agentd.errors.record import record
from agentd.workers.release_gate import wait_for_release


class _SpawnRecorder:
    """Stands in for multiprocessing's spawning Popen while the call is pickled: each
    descriptor an object hands over is noted, to be passed to the worker as it is."""

    def __init__(self) -> None:
        from multiprocessing.popen_spawn_posix import _DupFd

        self.DupFd = _DupFd
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return fd


def write_call(path: Path, function: Any, args: tuple[Any, ...]) -> list[int]:
    """Write the call file for one worker (agent side); returns the descriptors the
    worker must inherit (those of multiprocessing objects among ``args``)."""
    from multiprocessing import context, reduction, spawn

    recorder = _SpawnRecorder()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fp:
        context.set_spawning_popen(recorder)  # type: ignore[arg-type]
        try:
            reduction.dump(spawn.get_preparation_data("agentd-worker"), fp)
            reduction.dump((function, args), fp)
        finally:
            context.set_spawning_popen(None)
    return recorder.fds


def read_result(path: Path) -> Any:
    """The function's return value (agent side); None when it wrote none."""
    try:
        with open(path, "rb") as fp:
            return pickle.load(fp)
    except FileNotFoundError:
        return None


def _load_and_call(call_path: str) -> Any:
    from multiprocessing import spawn

    from agentd.support.compat.multiprocessing import inheriting

    with inheriting(), open(call_path, "rb") as fp:  # as multiprocessing's spawn
        spawn.prepare(pickle.load(fp))
        function, args = pickle.load(fp)
    return function(*args)


def main(argv: list[str]) -> int:
    call_path, result_path = argv
    value = record(_load_and_call)(call_path)
    tmp = f"{result_path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fp:
        pickle.dump(value, fp)
    os.replace(tmp, result_path)
    wait_for_release()  # leave with the others, not under a peer's last collective
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
