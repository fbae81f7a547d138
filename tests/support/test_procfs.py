"""What /proc says of real processes: a zombie's status, a stopped one's state, a group of
zombies that runs nothing, a tree's processes and what they use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from agentd.support.procfs import ProcessTable, runs_in_group, state_in_words, zombie_status


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


HOLDER = """
import time
held = bytearray(64 << 20)
for i in range(0, len(held), 4096):  # touched: resident
    held[i] = 1
began = time.process_time()
while time.process_time() - began < 0.3:
    pass
print("ready", flush=True)
time.sleep(600)
"""


def test_a_tree_is_its_root_and_every_descendant_with_their_cpu_and_memory():
    """The table agrees with psutil's walk of the same tree (a worker whose child holds
    64 MiB and burned 0.3 s of CPU), and a root that is gone has nothing."""
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLDER!r}])"
    with subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True) as root:
        try:
            assert root.stdout is not None and root.stdout.readline() == "ready\n"
            walked = psutil.Process(root.pid).children(recursive=True)
            expected = {root.pid, *(child.pid for child in walked)}
            table = ProcessTable()
            assert table.tree(root.pid) == expected and len(expected) == 2
            cpu, rss = table.tree_usage(root.pid)
            assert 0.25 <= cpu < 10 and 64 << 20 < rss < 1 << 30  # (/proc counts ticks)
            psutil_rss = sum(psutil.Process(pid).memory_info().rss for pid in expected)
            assert abs(rss - psutil_rss) < 8 << 20
        finally:
            for pid in ProcessTable().tree(root.pid):
                os.kill(pid, signal.SIGKILL)
            root.wait()
    gone = ProcessTable()
    assert gone.tree(root.pid) == set() and gone.tree_usage(root.pid) == (0.0, 0)


def test_a_recent_table_is_kept_a_second_unless_a_root_is_new_to_it(monkeypatch):
    """``/status`` polled in a loop reads /proc once a second, never missing a worker."""
    monkeypatch.setattr(ProcessTable, "MAX_AGE", 60.0)  # however loaded the machine
    first = ProcessTable.recent([os.getpid()])
    assert ProcessTable.recent([os.getpid()]) is first
    with subprocess.Popen(["sleep", "600"]) as new:
        try:
            again = ProcessTable.recent([os.getpid(), new.pid])
            assert again is not first and again.tree(new.pid) == {new.pid}
            assert ProcessTable.recent([new.pid]) is again
            monkeypatch.setattr(ProcessTable, "MAX_AGE", -1.0)
            assert ProcessTable.recent([new.pid]) is not again
        finally:
            new.kill()
