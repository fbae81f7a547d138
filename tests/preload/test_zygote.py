"""The zygote's fork loop, on a real socket pair: how it sees its agent go."""

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentd.preload import wire
from agentd.preload.zygote import Zygote

ROOT = Path(__file__).parents[2]


@contextmanager
def zygote_after(reports: int) -> Iterator[Zygote]:
    """A zygote whose agent closed its end with ``reports`` of the zygote's unread."""
    agent, zygote_end = wire.socketpair()
    for pid in range(reports):
        wire.send(zygote_end, {"exited": 100 + pid, "status": 0})
    agent.close()  # as the kernel closes it when the agent is SIGKILLed
    zygote = Zygote(zygote_end)
    try:
        yield zygote
    finally:
        for sock in (zygote_end, zygote.wake_r, zygote.wake_w):
            sock.close()
        zygote.selector.close()


def test_an_agent_killed_with_reports_unread_ends_the_loop_quietly():
    with zygote_after(reports=1) as zygote:  # its read is a reset: no traceback
        assert zygote.on_message() is False


def test_an_agent_that_closed_the_channel_ends_the_loop():
    with zygote_after(reports=0) as zygote:
        assert zygote.on_message() is False


def test_an_agent_gone_while_a_worker_exit_is_reported_ends_the_loop_quietly():
    """A job's end: its last worker exits and so does the agent. The zygote, woken by the
    worker's SIGCHLD, reports the exit on a channel the agent closed since its select: a
    BrokenPipeError traceback on the agent's stderr after the job succeeded (seen once in
    CI). The loop ends with 0 instead. Run in a process of its own: ``serve()`` takes
    SIGCHLD and reaps any child."""
    code = """
import os, selectors, sys
from agentd.preload import wire
from agentd.preload.zygote import Zygote

agent, zygote_end = wire.socketpair()
zygote = Zygote(zygote_end)
child = os.fork()
if child == 0:
    os._exit(0)
select = zygote.selector.select

def woken_by_the_exit_alone(timeout=None):  # the select returned before the agent closed
    zygote.selector.select = select
    while os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT) is None:
        pass
    agent.close()
    return [(zygote.selector.get_key(zygote.wake_r), selectors.EVENT_READ)]

zygote.selector.select = woken_by_the_exit_alone
print(zygote.serve())
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "0", "")


def test_a_child_that_exits_after_the_loop_ended_writes_to_no_closed_descriptor():
    """The zygote's SIGCHLD wakes its loop through a socket (``signal.set_wakeup_fd``); once
    the loop ended, that socket is closed. A child exiting after that (a worker, in the
    moments before its parent-death signal) had the signal handler write to the closed
    descriptor: "Exception ignored ... OSError: [Errno 9] Bad file descriptor" and a
    traceback on the agent's stderr after the job succeeded (CI), or, had the number been
    reused, a byte into another file. The loop ends with neither handler nor wakeup
    descriptor left behind."""
    code = """
import gc, os, signal
from agentd.preload import wire
from agentd.preload.zygote import Zygote

go, wait = os.pipe()
child = os.fork()
if child == 0:
    os.close(wait)
    os.read(go, 1)  # exits once the loop has ended
    os._exit(0)
os.close(go)
agent, zygote_end = wire.socketpair()
agent.close()
print(Zygote(zygote_end).serve())
gc.collect()
os.close(wait)
os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # its SIGCHLD has been sent
print(signal.set_wakeup_fd(-1), signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL)
os.waitpid(child, 0)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert (out.returncode, out.stdout.split(), out.stderr) == (0, ["0", "-1", "True"], "")
