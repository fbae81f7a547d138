"""The zygote program: import the preload modules once, then fork a worker per request.

``python [options] -m agentd.preload.zygote FD PATH0 MODULE[,MODULE...] SPARES[:cuda]
[SCRIPT [PADDING]]``: run by the agent in a session of its own with a parent-death signal,
``FD`` being its end of the control channel (:mod:`agentd.preload.wire`). It sets
``sys.path[0]`` to ``PATH0`` (what the workers will have), imports the modules, refuses
to go on when that started a CUDA context (a forked child cannot use its parent's), and
says ``ready`` with the threads alive (fork copies only the calling one) and the
variables of a worker's own that each module read at import (:mod:`.import_state`), having
looked up the names ``SCRIPT`` takes from them (:mod:`.taken_names`). Then
it only forks: the zygote itself never runs user code, so every worker is a fork of the
same pristine process, and it keeps ``SPARES`` children forked ahead of the requests, one per
slot, which compile ``SCRIPT`` (``-`` for none: the job runs a module) while they wait,
and with ``:cuda`` initialise CUDA on their slot's device (:mod:`agentd.preload.spare`).
It reaps its workers and reports each wait status; it exits when the agent closes the channel.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from agentd.hygiene.orphans import set_parent_death_signal
from agentd.preload import child, import_state, spare, taken_names, wire


def import_problem(name: str, exc: BaseException) -> str:
    """One line naming the module and why it failed (with where, for an error it raised)."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not isinstance(exc, ModuleNotFoundError):
        last = frames[-1]
        where = f" ({os.path.basename(last.filename)}:{last.lineno})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"--preload: importing {name!r} failed: {type(exc).__name__}: {text}{where}"


def cuda_problem() -> str | None:
    """Why the zygote must not fork: a CUDA context exists (torch's own flag)."""
    cuda = sys.modules.get("torch.cuda")
    is_initialized = getattr(cuda, "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        return (
            "--preload: the preloaded modules initialized CUDA; a forked worker cannot "
            "use its parent's CUDA context: preload only modules that do not touch the "
            "GPU at import"
        )
    return None


def live_threads() -> list[str]:
    """Threads other than this one: Python's by name, native ones by their ``comm``."""
    names = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    try:
        tids = [t for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
    except OSError:
        return names
    python_tids = {t.native_id for t in threading.enumerate()}
    for tid in tids:
        if int(tid) not in python_tids:
            try:
                with open(f"/proc/self/task/{tid}/comm") as fp:
                    names.append(f"{fp.read().strip()} (native)")
            except OSError:
                continue
    return names


def preload(sock: socket.socket, path0: str, modules: list[str], script: str | None) -> bool:
    """Import ``modules`` and the names ``script`` takes from them; tell the agent ready
    or failed."""
    sys.path[0] = path0
    began = time.monotonic()
    reads: dict[str, set[str]] = {}
    names = taken_names.taken(script, path0, modules) if modules else {}
    looked_up: dict[str, list[str]] = {}
    for name in modules:
        try:
            with import_state.environment_reads() as reads[name]:
                module = importlib.import_module(name)
                looked_up[name] = taken_names.look_up(module, names.get(name, ()))
        except BaseException as exc:  # SystemExit and KeyboardInterrupt at import too
            wire.send(sock, {"failed": import_problem(name, exc)})
            return False
    problem = cuda_problem()
    if problem is not None:
        wire.send(sock, {"failed": problem})
        return False
    wire.send(
        sock,
        {
            "ready": True,
            "pid": os.getpid(),
            "modules": modules,
            "names": {name: found for name, found in looked_up.items() if found},
            "seconds": round(time.monotonic() - began, 6),
            "threads": live_threads(),
            "worker_reads": {
                name: unshared
                for name, read in reads.items()
                if (unshared := import_state.unshared_reads(read))
            },
        },
    )
    return True


SPARE_QUIET = 0.1
"""Seconds without a message or a child's exit before the zygote forks the spares it
lacks: the forks of an attempt's start, and its workers' first steps, never wait on
them."""


@dataclass
class _Child:
    """A child forked, until it says it leads its process group."""

    pid: int
    pidfd: int
    request: int | None = None
    """The request it was forked for (None: a spare)."""
    channel: socket.socket | None = None
    """A spare's channel: the end its request will come through, for the agent."""
    slot: int = -1
    """A spare's slot: the local rank it stands for first."""

    def fds(self) -> list[int]:
        """The descriptors the zygote holds for it (a forked child closes them)."""
        return [self.pidfd] if self.channel is None else [self.pidfd, self.channel.fileno()]

    def close(self) -> None:
        os.close(self.pidfd)
        if self.channel is not None:
            self.channel.close()


class Zygote:
    """The fork loop: requests on the channel, SIGCHLD through a wakeup socket, and each
    new child's word that it leads its process group, which its reply waits for (the next
    request is forked meanwhile: the workers set themselves up side by side).

    With ``spares``, it keeps that many children forked ahead of any request, each leading
    its group and waiting on a channel of its own, which the zygote hands to the agent
    (``{"spare": pid}`` with the spare's pidfd and channel): the agent then starts a
    worker by writing its request to a spare, with no fork and no round trip through the
    zygote, and says ``{"taken": pid}``. Spares are forked once the channel has been
    quiet for :data:`SPARE_QUIET`; every child's exit is reported, spares' too; none
    outlives the zygote.
    """

    def __init__(
        self, sock: socket.socket, spares: int = 0, script: str | None = None, cuda: bool = False
    ) -> None:
        self.sock = sock
        self.script = script
        """The job's script, which each spare compiles while it waits (None: ``-m``)."""
        self.wake_r, self.wake_w = socket.socketpair()
        self.selector = selectors.DefaultSelector()
        self.unanswered: dict[int, _Child] = {}
        """Children that did not say yet that they lead their group, by that pipe."""
        self.spares_wanted = spares
        self.cuda = cuda
        """Each spare initialises CUDA on its slot's device while it waits."""
        self.spares_out: dict[int, int] = {}
        """Spares handed to the agent and not taken (nor dead) since: their slots, by pid."""

    def serve(self) -> int:
        for s in (self.wake_r, self.wake_w):
            s.setblocking(False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        try:
            while True:
                events = self.selector.select(SPARE_QUIET if self.lacking() else None)
                if not events:
                    self.fork_spare()
                for key, _ in events:
                    if key.fileobj is self.wake_r:
                        with contextlib.suppress(BlockingIOError):
                            while self.wake_r.recv(4096):
                                pass
                    elif key.fileobj is self.sock:
                        if not self.on_message():
                            return 0
                    elif key.fd in self.unanswered:
                        self.answer(key.fd)
                self.reap()
        except (BrokenPipeError, ConnectionResetError):  # the agent closed its end after the
            return 0  # select (a worker's exit and the agent's, at the end of a job)
        finally:
            self.end_spares()
            self.stop_waking()

    def stop_waking(self) -> None:
        """Take SIGCHLD's handler and wakeup descriptor back before the wakeup socket
        closes: a child exiting later (a worker, before its parent-death signal) would
        have the handler write to a closed descriptor, or to whatever reused its number."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in (self.wake_r, self.wake_w):
            sock.close()

    def lacking(self) -> bool:
        """Whether the agent holds, or will soon, fewer spares than wanted."""
        coming = sum(child.request is None for child in self.unanswered.values())
        return len(self.spares_out) + coming < self.spares_wanted

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.spares_out.pop(pid, None)
            for leading, pending in list(self.unanswered.items()):
                if pending.pid == pid:  # it died before it said it leads: its pid comes first
                    self.answer(leading)
            wire.send(self.sock, {"exited": pid, "status": status})

    def answer(self, leading: int) -> None:
        """A child leads its process group (or died trying), so from now on a signal to
        its group reaches it: reply to its request, or hand it to the agent as a spare."""
        pending = self.unanswered.pop(leading)
        self.selector.unregister(leading)
        os.close(leading)
        try:
            if pending.channel is None:
                wire.send(
                    self.sock, {"forked": pending.request, "pid": pending.pid}, [pending.pidfd]
                )
            else:
                wire.send(
                    self.sock,
                    {"spare": pending.pid, "slot": pending.slot},
                    [pending.pidfd, pending.channel.fileno()],
                )
                self.spares_out[pending.pid] = pending.slot
        finally:
            pending.close()

    def on_message(self) -> bool:
        """Handle one message; False when the agent closed the channel."""
        try:
            received = wire.recv(self.sock)
        except BlockingIOError:
            return True
        except (ConnectionResetError, BrokenPipeError):  # the agent is gone (killed)
            return False
        except wire.WireError as exc:
            sys.stderr.write(f"agentd zygote: bad request dropped: {exc}\n")
            return True
        if received is None:
            return False
        message, fds = received
        if "taken" in message and not fds:  # that spare is a worker now
            self.spares_out.pop(message["taken"], None)
            return True
        try:
            request = child.ForkRequest.from_message(message, len(fds))
        except ValueError as exc:
            _close(fds)
            wire.send(self.sock, {"forked": message.get("fork"), "error": str(exc)})
            return True
        self.fork(request, fds)
        return True

    def fork(self, request: child.ForkRequest, fds: list[int]) -> None:
        """Fork the worker; it is answered by :meth:`answer` once it leads its group."""
        leading, pid = self._fork_child(
            lambda own, led: child.become_worker(request, fds, own, led)
        )
        _close(fds)
        self._pending(leading, _Child(pid, os.pidfd_open(pid), request=request.id))

    def fork_spare(self) -> None:
        """Fork one spare, for the lowest slot none stands for; it goes to the agent once
        it leads its group."""
        taken = {*self.spares_out.values(), *(c.slot for c in self.unanswered.values())}
        slot = next(n for n in range(len(taken) + 1) if n not in taken)
        agents, theirs = wire.socketpair()
        channel = theirs.fileno()
        start = spare.SpareStart(self.script, slot, self.cuda)
        leading, pid = self._fork_child(
            lambda own, led: spare.become_spare(channel, [*own, agents.fileno()], led, start)
        )
        theirs.close()
        self._pending(leading, _Child(pid, os.pidfd_open(pid), channel=agents, slot=slot))

    def _fork_child(self, become: Callable[[list[int], int], NoReturn]) -> tuple[int, int]:
        """Fork; the child dies with the zygote, and runs ``become(the zygote's descriptors,
        its leading pipe)``."""
        zygote = os.getpid()  # (the child's own reading may name a new parent already)
        leading, led = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            set_parent_death_signal(zygote)
            own = [
                self.sock.fileno(),
                self.wake_r.fileno(),
                self.wake_w.fileno(),
                self.selector.fileno(),
                leading,
                *self.unanswered,
                *(fd for pending in self.unanswered.values() for fd in pending.fds()),
            ]
            become(own, led)
        os.close(led)
        return leading, pid

    def _pending(self, leading: int, forked: _Child) -> None:
        # The pidfd was opened before any reap: the pid cannot have been reused.
        self.unanswered[leading] = forked
        self.selector.register(leading, selectors.EVENT_READ)

    def end_spares(self) -> None:
        """Kill and reap the spares, handed out or on their way: none outlives the zygote
        (workers die of their parent-death signal)."""
        pids = [*self.spares_out, *(c.pid for c in self.unanswered.values() if c.request is None)]
        for pid in pids:  # our unreaped children: their pids cannot have been reused
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.spares_out.clear()


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def main(argv: list[str]) -> int:
    spares, _, cuda = argv[3].partition(":") if len(argv) > 3 else ("", "", "")
    if len(argv) < 4 or not argv[0].isdigit() or not spares.isdigit() or cuda not in ("", "cuda"):
        sys.stderr.write(
            "usage: python -m agentd.preload.zygote FD PATH0 MODULE[,MODULE...] SPARES[:cuda] "
            "[SCRIPT [PADDING]]\n"
        )
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    sock.set_inheritable(False)
    script = argv[4] if len(argv) > 4 and argv[4].strip() and argv[4] != "-" else None
    try:
        if not preload(sock, argv[1], [m for m in argv[2].split(",") if m], script):
            return 2
    except (BrokenPipeError, ConnectionResetError):  # the agent stopped before our report
        return 0
    return Zygote(sock, spares=int(spares), script=script, cuda=bool(cuda)).serve()


def leave(code: int) -> NoReturn:
    """Exit as the interpreter would, its ``atexit`` functions run, without its teardown
    of every module the zygote preloaded (torch's: 0.8 s, which held the agent's own
    exit at the end of every job): the zygote ran no user code, so nothing else is owed."""
    from agentd.support.compat.atexit import run_exit_functions

    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
