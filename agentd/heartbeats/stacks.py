"""Stack dumps of hung workers: ask for them, wait for them, read where each rank was.

A worker that heartbeats has registered :mod:`faulthandler` on the agent's dump signal
(it says so in its first message): the agent sends it that signal, and the worker
writes every thread's Python stack to its ``stacks.txt`` from within the signal handler,
even while its main thread is blocked in C code (a collective). A worker that did not
register is dumped with ``py-spy dump`` when py-spy is installed (and allowed to trace
it); the agent never sends a dump signal to a process that did not ask for it, because
that signal's default action would kill it.

Each dump is then read for its main thread: the innermost frame, and whether the thread
waits in torch.distributed (a collective) or in autograd's backward (where
DistributedDataParallel's gradient all_reduce waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.support.owned import output_within, owned
from agentd.support.secrets import child_env

if TYPE_CHECKING:
    from agentd.view import Helpers

PY_SPY_TIMEOUT = 10.0
_SETTLE = 0.1
"""A dump that has not grown for this long is complete."""
_POLL = 0.02
_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>.+):(?P<line>\d+)\)$")
_COLLECTIVE_FILES = ("/torch/distributed/", "/torch/nn/parallel/distributed.py")
_BACKWARD_FILES = ("/torch/autograd/",)
_WRAPPERS = ("wrapper", "inner", "<lambda>")


@dataclass(frozen=True)
class DumpTarget:
    """Dump worker ``pid`` (local rank ``local_rank``) to ``path``: by ``dump_signal``
    when it registered one, else with py-spy."""

    local_rank: int
    pid: int
    dump_signal: int
    path: Path


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.func} ({self.file}:{self.line})"


@dataclass(frozen=True)
class StackDump:
    """Where one worker was: ``frames`` of its main thread, innermost first."""

    local_rank: int
    path: Path
    method: str
    """faulthandler, py-spy, or why there is no dump."""
    frames: tuple[Frame, ...] = ()
    threads: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.frames)

    @property
    def waiting_in(self) -> str | None:
        """``all_reduce`` (a torch.distributed call), ``backward`` or None."""
        for frame in self.frames:
            if any(part in frame.file for part in _COLLECTIVE_FILES):
                if frame.func.startswith("_") or frame.func in _WRAPPERS:
                    continue
                return frame.func
        for frame in self.frames:
            if any(part in frame.file for part in _BACKWARD_FILES):
                return "backward"
        return None

    @property
    def where(self) -> str:
        """The innermost frame of the main thread in the job's own code, else the
        innermost frame (``func (file:line)``)."""
        for frame in self.frames:
            if "/site-packages/" not in frame.file and "/lib/python" not in frame.file:
                return str(frame)
        return str(self.frames[0]) if self.frames else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "method": self.method,
            "where": self.where or None,
            "waiting_in": self.waiting_in,
            "threads": self.threads,
        }


async def capture(
    targets: list[DumpTarget], wait: float, helpers: Helpers | None = None
) -> dict[int, StackDump]:
    """Dump every target at once and read the dumps, within about ``wait`` seconds
    (py-spy gets up to :data:`PY_SPY_TIMEOUT`). Never raises for one worker's sake.
    ``helpers``: the agent's process hygiene, which must leave py-spy's exit to us."""
    offsets: dict[int, int] = {}
    signalled: list[DumpTarget] = []
    spies: dict[int, asyncio.Task[str]] = {}
    py_spy = shutil.which("py-spy")
    for target in targets:
        offsets[target.local_rank] = _size(target.path)
        if target.dump_signal:
            try:
                os.kill(target.pid, target.dump_signal)
            except OSError:
                continue
            signalled.append(target)
        elif py_spy:
            spies[target.local_rank] = asyncio.create_task(_py_spy(py_spy, target, helpers))
    await _settle([t.path for t in signalled], offsets, wait)
    dumps: dict[int, StackDump] = {}
    for target in targets:
        lr = target.local_rank
        if target in signalled:
            text = _read_from(target.path, offsets[lr])
            frames, threads = parse_faulthandler(text)
            method = "faulthandler" if frames else "faulthandler: no dump came"
        elif lr in spies:
            try:
                text = await spies[lr]
            except Exception as exc:
                text = f"py-spy failed: {exc}"
            frames, threads = parse_py_spy(text)
            if frames:
                method = "py-spy"
                _append(target.path, text)
            else:
                lines = text.strip().splitlines()
                method = f"py-spy: {lines[-1][:200] if lines else 'no output'}"
        else:
            frames, threads = (), 0
            method = (
                "none: the worker never heartbeated (which registers the dump) and "
                "py-spy is not installed"
            )
        dumps[lr] = StackDump(lr, target.path, method, frames, threads)
    return dumps


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def _settle(paths: list[Path], offsets: dict[int, int], wait: float) -> None:
    """Wait until every file grew and then stopped growing, or ``wait`` seconds passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    sizes = {p: _size(p) for p in paths}
    grown_at: dict[Path, float] = {}
    pending = set(paths)
    while pending and loop.time() < deadline:
        await asyncio.sleep(_POLL)
        now = loop.time()
        for path in list(pending):
            size = _size(path)
            if size != sizes[path]:
                sizes[path], grown_at[path] = size, now
            elif path in grown_at and now - grown_at[path] >= _SETTLE:
                pending.discard(path)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fp:
            fp.seek(offset)
            return fp.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""


def _append(path: Path, text: str) -> None:
    with contextlib.suppress(OSError), open(path, "a") as fp:
        fp.write(text)


async def _py_spy(py_spy: str, target: DumpTarget, helpers: Helpers | None) -> str:
    start = asyncio.create_subprocess_exec(
        py_spy,
        "dump",
        "--pid",
        str(target.pid),
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with owned(helpers, start) as proc:
        output = await output_within(proc, PY_SPY_TIMEOUT)
    return "py-spy failed: timed out" if output is None else output[0].decode(errors="replace")


def parse_faulthandler(text: str) -> tuple[tuple[Frame, ...], int]:
    """The main thread's frames (innermost first) of a faulthandler dump, and the number
    of threads. The main thread is the one not started by ``threading``."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif threads and (match := _FAULTHANDLER_FRAME.match(line)):
            threads[-1].append(Frame(match["file"], int(match["line"]), match["func"]))
    return _main_thread(threads), len(threads)


def parse_py_spy(text: str) -> tuple[tuple[Frame, ...], int]:
    """The same for ``py-spy dump`` output (threads are named: MainThread is the main)."""
    threads: list[list[Frame]] = []
    main: list[Frame] | None = None
    for line in text.splitlines():
        if line.startswith("Thread "):
            threads.append([])
            if '"MainThread"' in line:
                main = threads[-1]
        elif threads and (match := _PY_SPY_FRAME.match(line)):
            threads[-1].append(Frame(match["file"], int(match["line"]), match["func"]))
    if main:
        return tuple(main), len(threads)
    return _main_thread(threads), len(threads)


def _main_thread(threads: list[list[Frame]]) -> tuple[Frame, ...]:
    for frames in threads:
        if frames and not (frames[-1].func == "_bootstrap" and "threading" in frames[-1].file):
            return tuple(frames)
    return tuple(threads[0]) if threads else ()
