"""The agent's side of the guardian (see :mod:`agentd.hygiene.guardian_process`), and the
secret files this process publishes, kept known to a guardian (:class:`SecretFiles`) that
removes them if the process is killed before it can withdraw them: the agent's
(:class:`~agentd.hygiene.service.ProcessHygiene` gives it the guardian of its workers),
or, with :func:`guarded_secrets`, one of its own for ``agentd store``, which has no
workers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from agentd.hygiene import guardian_process
from agentd.support.aio import use_pidfd_child_watcher
from agentd.support.secrets import child_env, on_published

log = logging.getLogger(__name__)


class Guardian:
    """Starts the guardian program and keeps it told of the worker process groups;
    ``on_lost(pid, exit_code)`` is called when it dies while it was not asked to stop.

    What it is told before :meth:`start` is in its pipe before it runs: an agent killed
    in the moments after the guardian's spawn (before the loop wrote another line) still
    has its charge carried out. Before, the lines were written once the spawn returned,
    and an agent killed between the two left its pipe directory, its token files and its
    will to nobody (its workers died all the same: the guardian kills what bears its mark)."""

    def __init__(self, mark: str, on_lost: Callable[[int, int], None] | None = None) -> None:
        self._mark = mark
        self._on_lost = on_lost
        self._process: asyncio.subprocess.Process | None = None
        self._input: asyncio.WriteTransport | None = None
        self._told: list[bytes] | None = []
        """Lines told while its input is not open yet (None once it is)."""
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        use_pidfd_child_watcher()
        env = child_env()
        env.pop(guardian_process.OWNER_ENV, None)
        read_end, write_end = os.pipe()
        try:
            os.set_blocking(write_end, False)
            first = b"".join(self._told or ())
            self._told = [first[_write_some(write_end, first) :]]  # the rest follows it
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                guardian_process.__file__,
                self._mark,
                stdin=read_end,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._watch = asyncio.ensure_future(self._watch_exit(self._process))
        pipe = os.fdopen(write_end, "wb", buffering=0)  # the transport closes it
        transport, _ = await asyncio.get_running_loop().connect_write_pipe(
            asyncio.BaseProtocol, pipe
        )
        self._input = transport
        rest, self._told = b"".join(self._told), None
        if rest:
            transport.write(rest)

    async def _watch_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if not self._stopping and self._on_lost is not None:
            self._on_lost(proc.pid, code)

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def set_lease(self, deadline: float | None) -> None:
        """The workers must be gone by ``deadline`` (monotonic); None: no such limit."""
        self._send("L-\n" if deadline is None else f"L{deadline:.6f}\n")

    def set_will(self, doc: dict[str, Any] | None) -> None:
        """The agent's will (see :mod:`agentd.rendezvous.release`); None takes it back."""
        self._send("W-\n" if doc is None else f"W{json.dumps(doc, separators=(',', ':'))}\n")

    def remove_when_gone(self, path: str) -> None:
        """Remove the agent's private pipe directory ``path`` once the agent is gone."""
        self._send(f"R{path}\n")

    def remove_secret_when_gone(self, path: str, digest: str) -> None:
        """Remove the file ``path`` once the agent is gone, if it still holds the secret of
        SHA-256 ``digest``."""
        self._send(f"F{digest} {path}\n")

    def keep_secret(self, path: str) -> None:
        """Take back :meth:`remove_secret_when_gone` for ``path``."""
        self._send(f"f{path}\n")

    def unwatch(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        if self._told is not None:  # not started yet, or starting
            self._told.append(line.encode())
            return
        if self._input is None or self._input.is_closing():
            return  # gone (its loss is said as it is reaped) or stopped
        self._input.write(line.encode())

    async def stop(self) -> None:
        """Close the guardian's input (nothing is left to kill) and reap it."""
        self._stopping = True
        proc = self._process
        if proc is None:
            return
        if self._input is not None:
            self._input.close()  # once what was written is flushed
        await proc.wait()
        if self._watch is not None:
            await self._watch
            self._watch = None
        self._process = None


def _write_some(fd: int, data: bytes) -> int:
    """Write what a non-blocking pipe ``fd`` takes of ``data`` now; how much that was."""
    try:
        return os.write(fd, data) if data else 0
    except BlockingIOError:
        return 0


class SecretFiles:
    """The secret files this process published and has not withdrawn, kept known to the
    guardian given to :meth:`attach` (path: the SHA-256 of the content, stripped)."""

    def __init__(self) -> None:
        self._digests: dict[str, str] = {}
        self._guardian: Guardian | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def follow(self) -> None:
        """From now on, learn of every secret file published or withdrawn (and of those
        published before)."""
        if self._unsubscribe is None:
            self._unsubscribe = on_published(self._on_secret)

    def attach(self, guardian: Guardian | None) -> None:
        """``guardian`` removes the files if this process dies first (None: none runs; a
        guardian attached later is told of every file at once)."""
        self._guardian = guardian
        if guardian is not None:
            for path, digest in self._digests.items():
                guardian.remove_secret_when_gone(path, digest)

    def stop(self) -> None:
        """A clean stop: their owners withdraw the files (several agents may share one
        process, and a store another one serves must keep its token), so the guardian is
        told to keep every one, and nothing more is followed."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._guardian is not None:
            for path in self._digests:
                self._guardian.keep_secret(path)
        self._digests.clear()

    def _on_secret(self, path: Path, token: str | None) -> None:
        name = str(path)
        if token is None:
            if self._digests.pop(name, None) is not None and self._guardian is not None:
                self._guardian.keep_secret(name)
            return
        digest = self._digests[name] = hashlib.sha256(token.strip().encode()).hexdigest()
        if self._guardian is not None:
            self._guardian.remove_secret_when_gone(name, digest)


@contextlib.asynccontextmanager
async def guarded_secrets(what: str) -> AsyncIterator[None]:
    """Within, a guardian removes the secret files this process publishes if it is killed
    (SIGKILL, out of memory) before it withdraws them. A guardian that cannot start costs
    only that: ``what`` runs without one, and a WARNING says so."""
    guardian: Guardian | None = None
    try:
        started = Guardian(f"{what}-{os.getpid()}")  # marks no process: it only removes files
        await started.start()
        guardian = started
    except OSError as exc:
        log.warning("No guardian for the %s (%s): if it is killed, its token file stays", what, exc)
    secrets = SecretFiles()
    secrets.follow()
    secrets.attach(guardian)
    try:
        yield
    finally:
        secrets.stop()
        if guardian is not None:
            await guardian.stop()
