"""In a worker just forked by the zygote: become what a spawned worker is, then run the
target as ``python script.py`` or ``python -m module`` would, and exit as Python does.

Before any user code runs the worker has its own session and process group, a
parent-death signal, the agent's descriptors as its stdin/stdout/stderr and inherited
descriptors, its working directory and environment, fresh ``sys.std*`` streams (buffered as
Python buffers them for that environment), default signal handlers, reseeded random
generators, and what the preloaded libraries derived from the zygote's environment and
streams at import derived again from its own (:mod:`agentd.preload.import_state`).
``__main__``, ``__file__``, ``sys.argv`` and ``sys.path[0]`` are what the command line
gives. At the end, non-daemon threads are joined, ``atexit`` handlers run and
the streams are flushed, with Python's exit status (an uncaught ``KeyboardInterrupt`` ends
by SIGINT, as it does in Python).
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import io
import os
import signal
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from agentd.preload import import_state

Compiled = Callable[[str], types.CodeType | None]
"""The script's code object compiled ahead, for its absolute path (None: compile it now)."""

START_FAILED = 127
"""The exit status of a worker that could not be set up (its stderr says why)."""


@dataclass(frozen=True)
class ForkRequest:
    """One worker to fork: the descriptors arrive beside it, in ``targets`` order."""

    id: int
    kind: str
    target: str
    args: tuple[str, ...]
    path0: str
    cwd: str | None
    set_env: Mapping[str, str]
    unset_env: tuple[str, ...]
    targets: tuple[int, ...]
    argv: tuple[str, ...] = ()
    """The worker's command line, as ``ps`` should show it."""
    gated: bool = False
    """The last descriptor is the agent's gate: the worker reads it before it runs the
    target (see :func:`become_worker`)."""

    @classmethod
    def from_message(cls, message: Mapping[str, Any], fd_count: int) -> ForkRequest:
        """Checks every field; raises ValueError naming the first that is wrong."""
        env = message.get("env")
        if not isinstance(env, dict):
            raise ValueError("env: must be an object")
        fields: dict[str, Any] = {
            "id": message.get("fork"),
            "kind": message.get("kind"),
            "target": message.get("target"),
            "args": message.get("args"),
            "path0": message.get("path0"),
            "set_env": env.get("set"),
            "unset_env": env.get("unset"),
            "targets": message.get("fds"),
        }
        ok = (
            isinstance(fields["id"], int)
            and fields["kind"] in ("script", "module")
            and isinstance(fields["target"], str)
            and isinstance(fields["path0"], str)
            and _strings(fields["args"])
            and isinstance(fields["set_env"], dict)
            and _strings([*fields["set_env"], *fields["set_env"].values()])
            and _strings(fields["unset_env"])
            and isinstance(fields["targets"], list)
            and all(isinstance(t, int) and t >= 0 for t in fields["targets"])
            and _strings(message.get("argv", []))
        )
        if not ok:
            raise ValueError(f"malformed fork request: {sorted(message)}")
        gated = message.get("gated", False)
        if not isinstance(gated, bool):
            raise ValueError(f"gated: {gated!r} is not a boolean")
        installed = fd_count - int(gated)
        if len(fields["targets"]) != installed or fields["targets"][:3] != [0, 1, 2]:
            raise ValueError(f"fds: {fields['targets']} for {installed} descriptor(s)")
        cwd = message.get("cwd")
        return cls(
            id=fields["id"],
            kind=fields["kind"],
            target=fields["target"],
            args=tuple(fields["args"]),
            path0=fields["path0"],
            cwd=cwd if isinstance(cwd, str) else None,
            set_env=fields["set_env"],
            unset_env=tuple(fields["unset_env"]),
            targets=tuple(fields["targets"]),
            argv=tuple(message.get("argv", [])),
            gated=gated,
        )


def _strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values)


def become_worker(
    request: ForkRequest, fds: Sequence[int], zygote_fds: Sequence[int], leading: int
) -> NoReturn:
    """In the forked child: set up, wait at the gate, run, exit. Never returns.

    One byte on ``leading`` tells the zygote the worker leads its own session and process
    group. A gated request's last descriptor is the agent's gate: the worker runs nothing
    of the user's until the agent writes a byte to it, which the agent does once it knows
    the worker's pid (so its first timer request or heartbeat is trusted). A gate closed
    without that byte means the agent gave the worker up: it exits with
    :data:`START_FAILED`, having run nothing.
    """
    try:
        detach(zygote_fds, leading)
    except BaseException as exc:
        start_failed(exc)
    become(request, fds)


def become(request: ForkRequest, fds: Sequence[int], compiled: Compiled | None = None) -> NoReturn:
    """Take on ``request``: its descriptors, directory, environment and command line;
    wait at its gate; run it (``compiled`` gives the script's code where it is the file
    compiled ahead); exit."""
    gate = -1
    try:
        if request.gated:
            # Above every target and close-on-exec: the user's children never inherit it.
            gate = fcntl.fcntl(fds[-1], fcntl.F_DUPFD_CLOEXEC, max(request.targets) + 1)
            os.close(fds[-1])
            fds = fds[:-1]
        _take_on(request, fds)
        if gate >= 0 and not _wait_at_gate(gate):
            os._exit(START_FAILED)
    except BaseException as exc:
        start_failed(exc)
    os._exit(_run(request, compiled))


def start_failed(exc: BaseException) -> NoReturn:
    """Nothing of the user's ran yet: say why, plainly, and exit :data:`START_FAILED`."""
    with contextlib.suppress(OSError):
        os.write(2, f"agentd: could not start the worker from the zygote: {exc!r}\n".encode())
    os._exit(START_FAILED)


def _wait_at_gate(gate: int) -> bool:
    """Block until the agent lets this worker run (True) or gives it up (False)."""
    try:
        while True:
            try:
                return os.read(gate, 1) == b"1"
            except InterruptedError:
                continue
    finally:
        os.close(gate)


def detach(zygote_fds: Sequence[int], leading: int) -> None:
    """Lead a session and process group of our own, say so on ``leading``, and drop the
    zygote's signal set-up and descriptors (the zygote's fork made us die with it)."""
    os.setsid()
    os.write(leading, b"1")
    os.close(leading)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for fd in zygote_fds:
        os.close(fd)


def _take_on(request: ForkRequest, fds: Sequence[int]) -> None:
    _install_fds(fds, request.targets)
    if request.cwd is not None:
        os.chdir(request.cwd)
    for name in request.unset_env:
        os.environ.pop(name, None)
    os.environ.update(request.set_env)
    zygote_streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    _fresh_std_streams()
    _reseed()
    import_state.rederive(zygote_streams)
    show_command_line(request.argv)


def show_command_line(argv: Sequence[str]) -> bool:
    """Make ``/proc/<pid>/cmdline`` (what ``ps`` shows) read ``argv`` instead of the
    zygote's command, by rewriting the process's own argument area in place; the zygote
    pads its command line so there is room. False when it does not fit."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as fp:
            fields = fp.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat 48, 49)
    except (OSError, IndexError, ValueError):
        return False
    text = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    if not start or len(text) > end - start:
        return False
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)
    return True


def _install_fds(fds: Sequence[int], targets: Sequence[int]) -> None:
    """Put each received descriptor at its target number (inheritable, as spawn does)."""
    floor = max(targets, default=2) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)


def _fresh_std_streams() -> None:
    """``sys.stdin/stdout/stderr`` as Python makes them for this worker's descriptors."""
    zygote_stdout = sys.stdout  # write-through when the interpreter runs with -u
    unbuffered = bool(
        getattr(zygote_stdout, "write_through", False) or os.environ.get("PYTHONUNBUFFERED")
    )
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        try:
            raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        except OSError:  # a closed descriptor: Python leaves the stream None
            setattr(sys, name, None)
            setattr(sys, f"__{name}__", None)
            continue
        buffer: Any
        if fd == 0:
            buffer = io.BufferedReader(raw)
        else:
            buffer = raw if unbuffered else io.BufferedWriter(raw)
        line_buffering = not unbuffered and (fd == 2 or raw.isatty())
        stream = io.TextIOWrapper(
            buffer, encoding, errors, "\n", line_buffering=line_buffering, write_through=unbuffered
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    """Generators that would otherwise repeat the zygote's sequence in every worker
    (``random`` reseeds itself at fork)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _run(request: ForkRequest, compiled: Compiled | None) -> int:
    code = 0
    try:
        _run_target(request, compiled)
    except SystemExit as exc:
        code = _exit_status(exc)
    except BaseException as exc:
        exc.__traceback__ = _from_the_target(exc.__traceback__)  # what Python prints
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
        if isinstance(exc, KeyboardInterrupt):
            code = -signal.SIGINT
    return _finalize(code)


def _from_the_target(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without agentd's frames before the target's: a forked worker's traceback
    starts where a spawned one's does (the script's ``<module>``, or runpy's for ``-m``)."""
    from agentd.support.compat import runpy

    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in ours:
        tb = tb.tb_next
    return tb


def _run_target(request: ForkRequest, compiled: Compiled | None) -> None:
    sys.path[0] = request.path0
    if request.kind == "module":
        from agentd.support.compat.runpy import run_module_as_main

        sys.argv = ["-m", *request.args]
        run_module_as_main(request.target)
        return
    path = os.path.abspath(request.target)
    folder = os.path.isdir(path)
    archive = None if folder else zip_app(path)
    if folder or archive is not None:  # python runs its __main__.py
        path = os.path.join(path, "__main__.py")
    sys.argv = [request.target, *request.args]
    main = types.ModuleType("__main__")
    from importlib.machinery import SourceFileLoader

    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=archive or SourceFileLoader("__main__", path),
    )
    sys.modules["__main__"] = main
    code = compiled(path) if compiled is not None and archive is None else None
    if archive is not None:
        code = archive.get_code("__main__")
    if code is None:
        with io.open_code(path) as fp:
            source = fp.read()
        code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def zip_app(path: str) -> Any:
    """The importer of a zip application (``python app.pyz``), None for any other file (a
    ``.py`` is taken as a script unread)."""
    if path.endswith(".py"):
        return None
    import zipimport

    try:
        return zipimport.zipimporter(path)
    except zipimport.ZipImportError:
        return None


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    if sys.stderr is not None:
        sys.stderr.write(f"{code}\n")
    return 1


def _finalize(code: int) -> int:
    """What the interpreter does on its way out: threads, atexit, streams."""
    from agentd.support.compat.atexit import run_exit_functions
    from agentd.support.compat.threading import join_non_daemon_threads

    with contextlib.suppress(BaseException):
        join_non_daemon_threads()
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            code = code or 120
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code
