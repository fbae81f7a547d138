"""A request our worker sent just before it exited, read after the agent saw the exit, is
late, not foreign: dropped without the untrusted warning (the suite's fixture fails a
test on any such warning; one in a parallel run came from exactly this race)."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from agentd.timer.api import TimerRequest
from agentd.timer.service import Watchdog
from agentd.timer.settings import WatchdogSettings


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_request_of_a_worker_that_exited_is_late_not_untrusted():
    pid = exited_pid()
    watchdog = Watchdog(WatchdogSettings(), dict, "mark", lambda: None)
    watchdog.forget([pid])  # the agent saw it exit
    server = watchdog.timer_server
    server.register_timers([TimerRequest(pid, "step", time.time() + 60)])
    assert server.stats["late"] == 1 and server.stats["untrusted"] == 0
    assert len(server) == 0  # no timer for a process that is gone


def test_a_pid_never_ours_is_still_untrusted():
    watchdog = Watchdog(WatchdogSettings(), dict, "mark", lambda: None)
    server = watchdog.timer_server
    server.register_timers([TimerRequest(exited_pid(), "step", time.time() + 60)])
    assert server.stats["untrusted"] == 1 and server.stats["late"] == 0


def test_a_request_of_a_worker_reaped_before_the_agent_heard_of_its_exit_is_late():
    """A worker forked from the zygote is reaped by the zygote: its pid is gone before
    the agent's worker record says it exited."""
    pid = exited_pid()
    worker = SimpleNamespace(pid=pid, pgid=pid, returncode=None)  # the agent's record of it
    watchdog = Watchdog(WatchdogSettings(), lambda: {0: worker}, "mark", lambda: None)
    server = watchdog.timer_server
    server.register_timers([TimerRequest(worker.pid, "step", time.time() + 60)])
    assert server.stats["late"] == 1 and server.stats["untrusted"] == 0
