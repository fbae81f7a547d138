from __future__ import annotations

import os
import subprocess
import sys

import psutil

from agentd.hygiene import orphans
from tests.conftest import wait_until


def reaper_of_this_test() -> orphans.ZombieReaper:
    """A reaper that owns every child this process has already: other tests' leftovers
    in a shared pytest worker (zombies of dropped Popen objects) are not this test's to
    reap (reaped here, their Popen warns later, in another test)."""
    reaper = orphans.ZombieReaper()
    for child in psutil.Process().children():
        reaper.own(child.pid)
    return reaper


def is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fp:
        return fp.read().rsplit(") ", 1)[1][0] == "Z"


def test_owner_mark_round_trip():
    mark = orphans.owner_mark("run-1")
    pid, ticks, namespace, run = orphans.parse_owner_mark(mark)
    assert (pid, namespace, run) == (os.getpid(), orphans.pid_namespace(), "run-1")
    assert orphans.agent_alive(pid, ticks, namespace)
    assert not orphans.agent_alive(pid, (ticks or 0) + 1, namespace)  # same pid, other process
    assert orphans.parse_owner_mark("garbage") is None
    assert orphans.parse_owner_mark("12.34/run-0") == (12, 34, None, "run-0")  # before namespaces


def test_an_agent_of_another_pid_namespace_counts_as_alive():
    """A mark (or pipe directory) made in another PID namespace names its agent by a pid
    of that namespace: here it is another process or none, so it is never taken for dead."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not orphans.agent_alive(gone.pid, 1, orphans.pid_namespace())
    assert orphans.agent_alive(gone.pid, 1, orphans.pid_namespace() + 1)


def test_an_agent_that_cannot_be_looked_up_counts_as_alive():
    """Out of descriptors, a sweep cannot read a live agent's /proc entry: before, that
    made it dead, and its pipe directory was swept under it."""
    code = (
        "import os, resource, sys\n"
        "from agentd.hygiene import orphans\n"
        "pid, ticks = os.getppid(), orphans.process_start_ticks(os.getppid())\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))\n"
        "print(orphans.process_start_ticks(pid), orphans.agent_alive(pid, ticks))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["None", "True"], done.stderr
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not orphans.agent_alive(gone.pid, None)  # known gone: dead


def test_marked_processes_finds_mark_anywhere_in_environ():
    mark = f"{os.getpid()}.1/find-me-{os.getpid()}"
    env = {"A": "1", "AGENTD_OWNER": mark, "Z": "2"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        wait_until(
            lambda: (proc.pid, mark) in set(orphans.marked_processes()),
            what="the mark to be visible",
        )
        assert orphans.kill_marked(lambda m: m == mark) == [proc.pid]
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait()


def test_zombie_reaper_reaps_orphans_but_not_owned_children():
    reaper = reaper_of_this_test()
    # an owned child that exits: left alone for its owner
    owned = subprocess.Popen([sys.executable, "-c", "pass"])
    reaper.own(owned.pid)
    wait_until(lambda: is_zombie(owned.pid), what="owned child to exit")
    assert reaper.reap() == 0
    assert owned.wait(timeout=5) == 0  # its status is still ours to collect
    # a child we do not own (an orphan re-parented to us, as far as the reaper can tell)
    stray = subprocess.Popen(["true"])
    stray_pid = stray.pid
    stray.returncode = 0  # tell Popen not to reap it: the reaper must
    wait_until(lambda: reaper.reap() == 1, what="the stray to be reaped")
    assert not os.path.exists(f"/proc/{stray_pid}")


def test_reaping_waits_while_a_spawn_is_in_flight():
    reaper = reaper_of_this_test()
    child = subprocess.Popen(["true"])
    child.returncode = 0
    with reaper.spawning():
        wait_until(lambda: is_zombie(child.pid), what="child to exit")
        assert reaper.reap() == 0  # deferred
        assert os.path.exists(f"/proc/{child.pid}")
    assert not os.path.exists(f"/proc/{child.pid}")  # reaped on leaving the spawn
