"""Process hygiene: no worker, and no child of a worker, outlives the agent that started it.

Four mechanisms, each covering what the others cannot:

* every worker carries an owner mark in its environment (``AGENTD_OWNER``), inherited by
  everything it starts, so the agent's processes can be found even after ``setsid``;
* the agent is a *child subreaper*: orphaned grandchildren are re-parented to it and it
  reaps them (:class:`ZombieReaper`), as it also must when it runs as PID 1 in a container;
* a guardian process (:mod:`agentd.hygiene.guardian_process`) kills the workers' process
  groups and every marked process when the agent dies without stopping them (``kill -9``);
* at start, an agent kills marked processes of the same run whose agent is gone.

"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable, Iterator

from agentd.hygiene.guardian_process import OWNER_ENV, kill_marked, marked_processes, read_mark

log = logging.getLogger(__name__)

__all__ = ["OWNER_ENV", "kill_marked", "marked_processes", "read_mark"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up once: it also runs in every forked worker before exec


def _prctl(option: int, value: int) -> bool:
    return _PRCTL is not None and _PRCTL(option, value, 0, 0, 0) == 0


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False where unsupported."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(parent: int, sig: int = signal.SIGKILL) -> None:
    """In a forked child: die with ``sig`` when its parent dies, and at once if it has died
    already. ``parent`` is the forker's pid as the forker read it before the fork: one read
    in the child after a parent's death names the new parent, and nothing would ever signal
    the orphan (an agent SIGKILLed just after a worker's fork left that worker running)."""
    _prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot; None if it does not exist (or
    cannot be read)."""
    try:
        return _start_ticks(pid)
    except OSError:
        return None


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fp:
        stat = fp.read()
    return int(stat.rsplit(b")", 1)[1].split()[19])


def pid_namespace(pid: int | str = "self") -> int | None:
    """The PID namespace ``pid`` runs in (the inode of ``/proc/<pid>/ns/pid``); None where
    it cannot be read."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def agent_identity(pid: int | None = None) -> str:
    """``<pid>.<start ticks>.<PID namespace>``: one agent process, told apart from a later
    process given its pid (the ticks) and from a process of another PID namespace (a
    container's agent, sharing this host's temporary folder or seen in its process table,
    numbers its processes on its own)."""
    pid = os.getpid() if pid is None else pid
    namespace = pid_namespace(pid)
    return f"{pid}.{process_start_ticks(pid)}" + ("" if namespace is None else f".{namespace}")


def parse_identity(text: str) -> tuple[int, int | None, int | None] | None:
    """``(pid, start ticks, PID namespace)`` from :func:`agent_identity` (the ticks and the
    namespace None where it did not say them); None if malformed."""
    pid_text, _, rest = text.partition(".")
    ticks_text, _, namespace_text = rest.partition(".")
    if not pid_text.isdigit():
        return None
    ticks = int(ticks_text) if ticks_text.isdigit() else None
    return int(pid_text), ticks, int(namespace_text) if namespace_text.isdigit() else None


def owner_mark(run_id: str, pid: int | None = None) -> str:
    """The ``AGENTD_OWNER`` value that identifies one agent process and its run."""
    return f"{agent_identity(pid)}/{run_id}"


def parse_owner_mark(mark: str) -> tuple[int, int | None, int | None, str] | None:
    """``(agent pid, its start ticks, its PID namespace, run id)`` from a mark; None if
    malformed."""
    owner, sep, run_id = mark.partition("/")
    identity = parse_identity(owner)
    if not sep or identity is None:
        return None
    return *identity, run_id


def agent_alive(pid: int, ticks: int | None, namespace: int | None = None) -> bool:
    """Whether the agent process named by a mark still runs (pid reuse is told apart).
    Only a process known gone counts as dead: one whose entry cannot be read for another
    reason (the caller out of descriptors, say) counts as alive, and so does one of
    another PID namespace than ours (its pid means another process here), so what may be
    a live agent's pipes or workers are never swept or killed."""
    if namespace is not None and namespace != pid_namespace():
        return True
    try:
        current = _start_ticks(pid)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return ticks is None or current == ticks


def kill_leftovers(run_id: str) -> list[int]:
    """Kill processes left by an earlier, dead agent of ``run_id``; live agents' are spared."""

    def is_leftover(mark: str) -> bool:
        parsed = parse_owner_mark(mark)
        if parsed is None:
            return False
        pid, ticks, namespace, mark_run = parsed
        return mark_run == run_id and not agent_alive(pid, ticks, namespace)

    killed = kill_marked(is_leftover)
    if killed:
        log.warning(
            "Killed %d process(es) left by an earlier agent of run %s: %s",
            len(killed),
            run_id,
            killed,
        )
    return killed


def child_pids() -> list[int]:
    """This process's children, from ``/proc`` (every thread's ``children`` list)."""
    pids: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as fp:
                pids.extend(int(p) for p in fp.read().split())
        except OSError:
            continue
    return pids


class ZombieReaper:
    """Reap children this process did not spawn itself, on every SIGCHLD.

    Children the agent spawns are *owned*: their exit status belongs to asyncio's child
    watcher, so they are never reaped here. Everything else is an orphan re-parented to
    this subreaper (or to PID 1) and is reaped, so no zombie piles up. While a spawn is in
    flight its pid is not known yet, so reaping waits until the spawn is registered.
    """

    def __init__(self) -> None:
        self._owned: set[int] = set()
        self._spawning = 0
        self._deferred = False

    def own(self, pid: int) -> None:
        self._owned.add(pid)

    def disown(self, pid: int) -> None:
        self._owned.discard(pid)

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Hold reaping off while a child is being spawned and not yet owned."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1
            if not self._spawning and self._deferred:
                self.reap()

    def reap(self) -> int:
        """Reap every exited child that is not owned; returns how many were reaped."""
        if self._spawning:
            self._deferred = True
            return 0
        self._deferred = False
        count = 0
        for pid in child_pids():
            if pid in self._owned:
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                count += 1
        return count
