"""A child dies with the process that forked it, even where that process died before the
child asked to (``prctl(PR_SET_PDEATHSIG)`` binds to the parent of the moment: one that
died already is never signalled for).

The child judged whether its parent had died by comparing ``getppid()`` before and after
the ``prctl``: an agent SIGKILLed in the moments after the fork, before the child's first
``getppid()``, left a worker that read its new parent both times and ran on, an orphan
beside a pipe directory nobody removed (found by SIGKILLing agents 50-400 ms into their
start: 1 worker of 40 starts). The parent is now read before the fork.

Here a process forks a child that waits until its parent is dead, then asks to die with
it, as agentd's worker and zygote children do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import pid_alive, wait_until

PARENT = """
import os, sys, time
from agentd.hygiene.orphans import set_parent_death_signal
me = os.getpid()
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.close(write_end)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the test reads the parent's output to its end
    os.dup2(devnull, 2)
    os.read(read_end, 1)  # end of file: the parent is dead
    set_parent_death_signal(me)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # dead before the child asks
"""


def test_a_child_whose_parent_died_before_it_asked_dies_at_once():
    parent = subprocess.run(
        [sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60, check=True
    )
    child = int(parent.stdout)
    try:
        wait_until(lambda: not pid_alive(child), timeout=10, what="the orphan to kill itself")
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)
