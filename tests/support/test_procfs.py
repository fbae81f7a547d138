"""What /proc says of real processes: a zombie's status, a stopped one's state, a group of
zombies that runs nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agentd.support.procfs import runs_in_group, state_in_words, zombie_status


def until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_zombies_exit_status_is_read_and_nothing_of_a_live_or_gone_process():
    exits = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    killed = subprocess.Popen(["sleep", "600"])
    killed.send_signal(signal.SIGKILL)
    for proc, code in ((exits, 7), (killed, -signal.SIGKILL)):
        until(lambda p=proc: state_in_words(p.pid) == "a zombie")  # not reaped: we wait later
        assert zombie_status(proc.pid) == code
        proc.wait()
        assert zombie_status(proc.pid) is None and state_in_words(proc.pid) == "gone"
    assert zombie_status(os.getpid()) is None
    assert runs_in_group(os.getpgid(0))


def test_a_stopped_process_says_so():
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        proc.send_signal(signal.SIGSTOP)
        until(lambda: state_in_words(proc.pid) == "stopped")
        assert runs_in_group(proc.pid)
        proc.kill()
        until(lambda: not runs_in_group(proc.pid))  # its zombie, until reaped, runs nothing
    finally:
        proc.kill()
        proc.wait()
