"""What the benchmarks that start several launchers share: waiting on a condition with a
deadline, and killing every process of one run by pid.

A run marks its processes by an environment variable (a launcher's workers inherit it),
so :func:`kill_marked` finds what a killed or failed launcher left behind: torchrun's
workers, blocked in gloo, outlive it.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence

import psutil


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.02) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (looked at every
    ``interval``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def kill_marked(env_name: str, marker: str) -> None:
    """SIGKILL, by pid, every process whose environment has ``env_name`` = ``marker``."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(env_name) == marker:
                proc.kill()


def end_run(procs: Sequence[subprocess.Popen[bytes]], env_name: str = "", marker: str = "") -> None:
    """Kill and reap the run's launchers still running; with ``marker``, then every process
    the run marked (:func:`kill_marked`), by pid."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if marker:
        kill_marked(env_name, marker)
