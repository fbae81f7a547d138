"""The zygote program: import the preload modules once, then fork a worker per request.

``python [options] -m agentd.preload.zygote FD PATH0 MODULE[,MODULE...] [PADDING]``: run by
the agent in a session of its own with a parent-death signal, ``FD`` being its end of the
control channel (:mod:`agentd.preload.wire`). It sets ``sys.path[0]`` to ``PATH0`` (what
the workers will have), imports the modules, refuses to go on when that started a CUDA
context (a forked child cannot use its parent's), and says ``ready`` with the threads alive
(fork copies only the calling one). Then it only forks: the zygote itself never runs user
code, so every worker is a fork of the same pristine process. It reaps its workers and
reports each wait status; it exits when the agent closes the channel.
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

from agentd.preload import child, wire


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


def preload(sock: socket.socket, path0: str, modules: list[str]) -> bool:
    """Import ``modules``; tell the agent ready or failed."""
    sys.path[0] = path0
    began = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name)
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
            "seconds": round(time.monotonic() - began, 6),
            "threads": live_threads(),
        },
    )
    return True


class Zygote:
    """The fork loop: requests on the channel, SIGCHLD through a wakeup socket, and each
    new worker's word that it leads its process group, which its reply waits for (the
    next request is forked meanwhile: the workers set themselves up side by side)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = socket.socketpair()
        self.selector = selectors.DefaultSelector()
        self.unanswered: dict[int, tuple[int, int, int]] = {}
        """Forks not yet answered: their ``leading`` pipe -> (request id, pid, pidfd)."""

    def serve(self) -> int:
        for s in (self.wake_r, self.wake_w):
            s.setblocking(False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while self.wake_r.recv(4096):
                            pass
                elif key.fileobj is self.sock:
                    if not self.on_request():
                        return 0
                elif key.fd in self.unanswered:
                    self.answer(key.fd)
            self.reap()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for leading, (_, forked, _) in list(self.unanswered.items()):
                if forked == pid:  # it died before it said it leads: its pid comes first
                    self.answer(leading)
            wire.send(self.sock, {"exited": pid, "status": status})

    def answer(self, leading: int) -> None:
        """Reply to a fork: its worker leads its process group (or died trying), so from
        now on a signal to its group reaches it."""
        request_id, pid, pidfd = self.unanswered.pop(leading)
        self.selector.unregister(leading)
        os.close(leading)
        try:
            wire.send(self.sock, {"forked": request_id, "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def on_request(self) -> bool:
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
        try:
            request = child.ForkRequest.from_message(message, len(fds))
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            wire.send(self.sock, {"forked": message.get("fork"), "error": str(exc)})
            return True
        self.fork(request, fds)
        return True

    def fork(self, request: child.ForkRequest, fds: list[int]) -> None:
        """Fork the worker; it is answered by :meth:`answer` once it leads its group."""
        leading, led = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            own = [
                self.sock.fileno(),
                self.wake_r.fileno(),
                self.wake_w.fileno(),
                self.selector.fileno(),
                leading,
                *(
                    fd
                    for pending in self.unanswered
                    for fd in (pending, self.unanswered[pending][2])
                ),
            ]
            child.become_worker(request, fds, own, led)
        os.close(led)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)  # before any reap: the pid cannot be reused yet
        self.unanswered[leading] = (request.id, pid, pidfd)
        self.selector.register(leading, selectors.EVENT_READ)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit():
        sys.stderr.write(
            "usage: python -m agentd.preload.zygote FD PATH0 MODULE[,MODULE...] [PADDING]\n"
        )
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    sock.set_inheritable(False)
    try:
        if not preload(sock, argv[1], [m for m in argv[2].split(",") if m]):
            return 2
    except (BrokenPipeError, ConnectionResetError):  # the agent stopped before our report
        return 0
    return Zygote(sock).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
