"""Capturing stack dumps: py-spy, a helper the agent spawns, is left to the task that
waits for it by the agent's orphan reaper (a child subreaper reaps every child it does
not own)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from agentd.heartbeats.stacks import DumpTarget, capture

DUMP = """#!/bin/sh
echo 'Thread 0x7F00 (idle): "MainThread"'
echo '    train (/job/train.py:42)'
"""


class Hygiene:
    """Records what a service tells the agent's process hygiene."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self._spawning = False

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        self._spawning = True
        try:
            yield
        finally:
            self._spawning = False

    def own(self, pid: int | None) -> None:
        assert self._spawning, "owned after the spawn was over: the reaper could take it"
        self.calls.append(("own", pid))

    def disown(self, pid: int | None) -> None:
        self.calls.append(("disown", pid))


async def test_py_spy_is_owned_while_it_runs_and_disowned_once_reaped(tmp_path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text(DUMP)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    hygiene = Hygiene()
    target = DumpTarget(local_rank=0, pid=os.getpid(), dump_signal=0, path=tmp_path / "stack")
    dumps = await capture([target], wait=1.0, helpers=hygiene)
    assert dumps[0].method == "py-spy" and dumps[0].where == "train (/job/train.py:42)"
    [(first, pid), (second, same)] = hygiene.calls
    assert (first, second) == ("own", "disown") and pid == same and pid != os.getpid()
