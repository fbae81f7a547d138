"""A guardian that dies is never a silent loss: the agent says so in one ERROR line and
starts another, which learns every worker group again, so a killed agent still leaves
nothing behind (not even a grandchild that escaped into its own session)."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from tests.conftest import WORKER, pid_alive, wait_until


def guardian_of(agent_pid: int, but: tuple[int, ...] = ()) -> int | None:
    """The agent's guardian; ``but``: pids that are not it (a dead guardian's twin, which
    comes to the agent, a subreaper, until it steps aside)."""
    for child in psutil.Process(agent_pid).children():
        try:
            if child.pid not in but and any("guardian_process.py" in p for p in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def test_a_dead_guardian_is_named_and_replaced(run_agentd):
    agent = run_agentd(WORKER, "tree")
    pids = agent.wait_ready(1)  # the worker, a grandchild in its group, one escaped
    first = wait_until(lambda: guardian_of(agent.pid), what="the guardian")
    twins = wait_until(lambda: psutil.Process(first).children(), what="its twin")
    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: f"Guardian pid {first} died (exit status -9); starting a new one" in agent.stderr(),
        what="the agent to name the loss",
    )
    second = wait_until(
        lambda: (pid := guardian_of(agent.pid, (first, twins[0].pid))) and pid,  # type: ignore[index]
        what="a new guardian",
    )
    wait_until(lambda: "guards 1 worker group(s)" in agent.stderr(), what="it learned the group")
    assert pid_alive(second)
    agent.proc.kill()  # the new guardian does what the first would have done
    agent.wait()
    gone = [*pids, second]
    wait_until(lambda: not any(pid_alive(p) for p in gone), what="every process gone")
    for pid in gone:  # orphans come to this process when it is a subreaper
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
