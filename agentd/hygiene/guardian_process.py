"""The guardian program: kills an agent's workers if the agent dies without stopping them.

Run by the agent as ``python -I -S guardian_process.py MARK`` in a session of its own, on
the standard library's lightest modules only: it starts in milliseconds and never competes
with the workers for the CPU. It reads the agent's lines on its stdin:

- ``+PGID`` / ``-PGID``: worker process groups come and go. End of input means the agent
  is gone (exited or killed): the guardian SIGKILLs every group still listed and every
  process whose ``AGENTD_OWNER`` is ``MARK`` (children that left their group), then exits
  (after a clean stop, nothing is listed or marked).
- ``R<path>``: a private directory of the agent's to remove once it is gone, so a killed
  agent leaves no litter in ``/tmp``: only an ``agentd-*`` directory that holds nothing but
  named pipes, and maybe the drain control file (:data:`CONTROL_FILE`), is removed.
- ``F<sha256> <path>`` / ``f<path>``: a secret the agent published (a token file,
  :mod:`agentd.store.token_file`), and its withdrawal: once the agent is gone, the file is
  removed if it still holds a token of that SHA-256 (a newer agent may have replaced it).
- ``W<json>`` / ``W-``: the agent's will (:mod:`agentd.rendezvous.release`): once the agent
  is gone and its workers are seen dead, ``python -m agentd.rendezvous.release`` releases
  its membership with it, so its peers go on at once.
- ``L<seconds>`` / ``L-``: the end of the agent's membership lease (``time.monotonic()``,
  one clock for every process). Not renewed by then (plus :data:`LEASE_SLACK`), the agent
  could not stop its workers in time (frozen, starved): the guardian kills them as above
  and goes on guarding, so no worker outlives the lease on its ranks.

The guardian forks a **twin** as it starts and passes it every chunk it reads, then ``Q``
once it has acted for a gone agent. Should the guardian die first (a frozen agent starts
no other: its workers would outlive the lease unfenced), the twin stands in
(:func:`stand_in`) until another guardian of ``MARK`` runs, acting for the agent if it is
gone too, with a twin of its own that stands in should it die as well.

:func:`marked_processes` and :func:`kill_marked` are also the agent's (see orphans.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import sys
import time
from collections.abc import Callable, Collection, Iterator

OWNER_ENV = "AGENTD_OWNER"


def _proc(pid: int, name: str) -> bytes:
    """The content of ``/proc/PID/NAME`` (empty: unreadable, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fp:
            return fp.read()
    except OSError:
        return b""


def read_mark(pid: int) -> str | None:
    """The ``AGENTD_OWNER`` value in the environment ``pid`` started with, if readable."""
    needle = b"\0" + OWNER_ENV.encode() + b"="
    environ = b"\0" + _proc(pid, "environ")  # every entry after a NUL, the first too
    start = environ.find(needle)
    if start < 0:
        return None
    end = environ.find(b"\0", start + len(needle))
    return environ[start + len(needle) : end if end >= 0 else None].decode(errors="replace")


def marked_processes() -> Iterator[tuple[int, str]]:
    """Every process readable by us that carries an owner mark: ``(pid, mark)``."""
    for pid in _pids():
        if (mark := read_mark(pid)) is not None:
            yield pid, mark


def kill_marked(
    predicate: Callable[[str], bool], sig: int = signal.SIGKILL, spare_groups: Collection[int] = ()
) -> list[int]:
    """Send ``sig`` to every marked process whose mark satisfies ``predicate``, but those in
    the process groups ``spare_groups`` (workers kept across a restart, and their children)."""
    killed = []
    for pid, mark in marked_processes():
        if predicate(mark) and not (spare_groups and _group_of(pid) in spare_groups):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
            killed.append(pid)
    return killed


def _group_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if len(fields) > 2 else None


LEASE_SLACK = 0.5
"""Seconds past the lease's end before the guardian acts (the agent's own stop comes first)."""


def kill_all(groups: set[int], mark: str) -> None:
    """SIGKILL every listed process group and every process carrying ``mark``."""
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    kill_marked(lambda m: m == mark)


WILL_TIMEOUT = 15.0
"""How long the release of a will may take (it gives up on the store sooner)."""
DEAD_WAIT = 2.0
"""How long the workers killed are waited for before a will runs without them dead."""


def wait_dead(groups: set[int], mark: str, timeout: float) -> bool:
    """Whether every process of the listed groups, and every marked one, is dead within
    ``timeout`` seconds. A zombie counts as dead: it runs nothing, and with its agent gone
    nobody may reap it soon (``killpg(pgid, 0)`` still finds it, so it is not used)."""
    deadline = time.monotonic() + timeout
    while any(_alive(pid, groups, mark) for pid in _pids()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _pids() -> list[int]:
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]


def _alive(pid: int, groups: set[int], mark: str) -> bool:
    """Whether ``pid`` runs (not a zombie) in one of ``groups`` or with ``mark``."""
    fields = _stat(pid)
    return _running(fields) and (int(fields[2]) in groups or read_mark(pid) == mark)


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command's name ([]: gone)."""
    return _proc(pid, "stat").rsplit(b")", 1)[-1].split()


def _running(fields: list[bytes]) -> bool:
    """The process of these :func:`_stat` fields runs (neither gone nor a zombie)."""
    return fields[:1] not in ([], [b"Z"], [b"X"])


def run_will(will: bytes) -> None:
    """Release the dead agent's membership as its will says (its one line goes to stderr)."""
    import json
    import subprocess

    try:
        path = json.loads(will).get("path", [])
    except ValueError:
        sys.stderr.write("agentd guardian: the agent's will is not JSON; not released\n")
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if isinstance(p, str))}
    try:
        subprocess.run(
            [sys.executable, "-m", "agentd.rendezvous.release"],
            input=will,
            env=env,
            stdout=subprocess.DEVNULL,
            timeout=WILL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        sys.stderr.write(f"agentd guardian: could not release the membership: {exc}\n")


CONTROL_FILE = "drain.control"  # agentd.wire.control.NAME: this program imports no agentd


def agents_litter(path: str, name: str) -> bool:
    """Whether ``name`` in ``path`` is an agent's: a named pipe, or the control file."""
    mode = os.lstat(os.path.join(path, name)).st_mode
    return stat.S_ISFIFO(mode) or (name == CONTROL_FILE and stat.S_ISREG(mode))


def remove_private_dir(path: str) -> None:
    """Remove ``path`` if it is one of the agent's pipe directories (see the module doc)."""
    if not os.path.basename(path).startswith("agentd-"):
        return
    try:
        names = os.listdir(path)
        if not all(agents_litter(path, name) for name in names):
            return
        for name in names:
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
    except OSError:
        return


def remove_secret_file(path: str, digest: str) -> None:
    """Remove the regular file ``path`` if its content (stripped) has SHA-256 ``digest``."""
    import hashlib  # only here: the guardian's start stays on the lightest modules

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            content = os.read(fd, 4096).strip()
        finally:
            os.close(fd)
        if hashlib.sha256(content).hexdigest() == digest:
            os.unlink(path)
    except OSError:
        return


GUARDIAN_IGNORES = (
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGTERM,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class Charge:
    """What the agent has put in the guardian's care: its lines, read (see above)."""

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.private_dirs: set[str] = set()
        self.secret_files: dict[str, str] = {}
        self.lease: float | None = None
        self.will: bytes | None = None
        self.done = False  # the twin's: Q came (the guardian acted for a gone agent)

    def read(self, line: bytes) -> None:
        if line[:1] == b"+" and line[1:].isdigit():
            self.groups.add(int(line[1:]))
        elif line[:1] == b"-" and line[1:].isdigit():
            self.groups.discard(int(line[1:]))
        elif line[:1] == b"R" and len(line) > 1:
            self.private_dirs.add(os.fsdecode(line[1:]))
        elif line[:1] == b"F" and line[65:66] == b" " and len(line) > 66:
            self.secret_files[os.fsdecode(line[66:])] = line[1:65].decode(errors="replace")
        elif line[:1] == b"f" and len(line) > 1:
            self.secret_files.pop(os.fsdecode(line[1:]), None)
        elif line == b"W-":
            self.will = None
        elif line[:1] == b"W" and len(line) > 1:
            self.will = line[1:]
        elif line == b"L-":
            self.lease = None
        elif line[:1] == b"L":
            with contextlib.suppress(ValueError):
                self.lease = float(line[1:])
        elif line == b"Q":
            self.done = True

    def fence(self, mark: str) -> None:
        """The lease ran out and the agent did not stop its workers: kill them."""
        kill_all(self.groups, mark)
        self.groups.clear()
        self.lease = None

    def carry_out(self, mark: str) -> None:
        """The agent is gone: kill its workers, remove its litter, carry out its will."""
        kill_all(self.groups, mark)
        for path in self.private_dirs:
            remove_private_dir(path)
        for path, digest in self.secret_files.items():
            remove_secret_file(path, digest)
        if self.will is not None:  # fencing: the ranks are given away once the workers died
            if wait_dead(self.groups, mark, DEAD_WAIT):
                run_will(self.will)
            else:
                sys.stderr.write("agentd guardian: workers still alive; membership not released\n")


def guard(fd: int, mark: str, charge: Charge, twin: int | None, fences: bool) -> int | None:
    """Read the agent's lines from ``fd`` into ``charge`` until its end, passing each on to
    the pipe ``twin`` (None: none, or gone, which it returns); ``fences``: fence the lease
    (the guardian does; its twin leaves that to it while it lives)."""
    pending = b""
    while True:
        lease = charge.lease if fences else None
        timeout = None if lease is None else max(0.0, lease + LEASE_SLACK - time.monotonic())
        readable, _, _ = select.select([fd], [], [], timeout)
        if not readable:  # the lease ran out and the agent did not stop its workers
            charge.fence(mark)
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return twin
        if twin is not None:
            twin = _tell(twin, chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            charge.read(raw.strip())


def _tell(twin: int, chunk: bytes) -> int | None:
    """Pass ``chunk`` (≤ 4096 bytes: one atomic write) to the twin; None once it is gone,
    or does not read (stopped): the guardian never waits on its twin."""
    try:
        os.write(twin, chunk)
    except OSError:
        os.close(twin)
        return None
    return twin


TWIN_LOOKS_EVERY = 0.25
"""How often a twin standing in looks for a guardian, the agent, and the lease's end."""


def start_twin(mark: str, charge: Charge, agent: int) -> tuple[int, int] | None:
    """Fork the twin of a guardian (or of a twin standing in) of ``agent`` (see the module
    docstring): the pipe to it and its pid (None: none started)."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid:
        os.close(read_end)
        os.set_blocking(write_end, False)
        return write_end, pid
    os.close(write_end)
    os.close(0)  # the agent's pipe is the guardian's alone: 0 is /dev/null's now
    os.open(os.devnull, os.O_RDONLY)
    try:
        guard(read_end, mark, charge, None, fences=False)
        if not charge.done:
            stand_in(mark, charge, agent)
    finally:
        os._exit(0)  # the twin never returns into the guardian's code


def stand_in(mark: str, charge: Charge, agent: int) -> None:
    """The guardian died first (or let this twin go): fence the lease until another
    guardian of ``mark`` runs (the agent's new one), or act for the agent once it is gone.
    A twin of its own stands in should it die too (the agent may stay frozen)."""
    twin = start_twin(mark, charge, agent)
    try:
        while not _another_guardian(mark, but=twin[1] if twin else 0):  # ours, if it let us go
            if not _running(_stat(agent)):
                charge.carry_out(mark)
                return
            if charge.lease is not None and time.monotonic() >= charge.lease + LEASE_SLACK:
                charge.fence(mark)
            time.sleep(TWIN_LOOKS_EVERY)
    finally:
        if twin is not None:
            _let_go(*twin)


def _let_go(pipe: int | None, twin: int) -> None:
    """Tell the twin on ``pipe`` it has nothing to do (``Q``), and wait for it if it took that."""
    wait = os.WNOHANG
    if pipe is not None and _tell(pipe, b"Q\n") is not None:
        os.close(pipe)  # the end of its input ends it
        wait = 0
    with contextlib.suppress(ChildProcessError):
        os.waitpid(twin, wait)


def _another_guardian(mark: str, but: int) -> bool:
    """Whether a guardian of ``mark`` runs, other than this process and ``but`` (its twin)."""
    for pid in set(_pids()) - {but}:
        args = _proc(pid, "cmdline").split(b"\0")[:-1]
        if args[-2:-1] and args[-2].endswith(b"guardian_process.py") and args[-1] == mark.encode():
            return True
    return False


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python guardian_process.py MARK\n")
        return 2
    mark = argv[0]
    # only the end of the agent's pipe ends the guardian (a scheduler's signal to every
    # process of the job, Slurm's SIGUSR1 warning included, is the agent's to act on)
    for sig in GUARDIAN_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    charge = Charge()
    twin = start_twin(mark, charge, os.getppid())
    pipe = guard(sys.stdin.fileno(), mark, charge, twin[0] if twin else None, fences=True)
    charge.carry_out(mark)
    if twin is not None:  # gone with the guardian
        _let_go(pipe, twin[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
