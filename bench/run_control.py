"""What the benchmarks that start several launchers share: a port and whether something
listens on it, waiting on a condition with a deadline, and killing every process of one
run by pid.

A run marks its processes by an environment variable (a launcher's workers inherit it),
so :func:`kill_marked` finds what a killed or failed launcher left behind: torchrun's
workers, blocked in gloo, outlive it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence

import psutil


def free_port() -> int:
    """A port of 127.0.0.1 nothing holds now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.02) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (looked at every
    ``interval``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def marked_env(env_name: str) -> tuple[dict[str, str], str]:
    """A run's environment and its new marker (``env_name`` = marker): this one's, without
    agentd's and torchrun's options (``AGENTD_*``, ``PET_*``), warnings silenced."""
    marker = os.urandom(6).hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "PET_"))}
    return {**env, "PYTHONWARNINGS": "ignore", env_name: marker}, marker


def kill_marked(env_name: str, marker: str) -> None:
    """SIGKILL, by pid, every process whose environment has ``env_name`` = ``marker``."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(env_name) == marker:
                proc.kill()


def end_run(procs: Sequence[subprocess.Popen[bytes]], env_name: str = "", marker: str = "") -> None:
    """Kill and reap the run's launchers still running (a stopped one is continued first:
    a run may SIGSTOP one); with ``marker``, then every process the run marked
    (:func:`kill_marked`), by pid."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    if marker:
        kill_marked(env_name, marker)


def tally(name: str, runs: int, job: Callable[[int], tuple[bool, float, str]]) -> None:
    """Run ``job(run)`` (-> succeeded, wall seconds, why not) ``runs`` times and print one
    row: ``name``, how many succeeded, the median wall time, and the first failure."""
    succeeded, walls, first_failure = 0, [], ""
    for run in range(runs):
        good, wall, why = job(run)
        succeeded += good
        walls.append(wall)
        if not good and not first_failure:
            first_failure = f"run {run}: {why}"
    row = f"{name:<14} {f'{succeeded}/{runs}':>10} {statistics.median(walls):>9.2f}"
    print(row, flush=True)
    if first_failure:
        print("  first failure: " + first_failure.replace("\n", "\n    "), flush=True)


def launchers_parser(doc: str, hows: Sequence[str]) -> argparse.ArgumentParser:
    """The options of a benchmark that runs launchers through faults: ``--runs``,
    ``--launchers`` (agentd, torchrun), ``--hows`` (of ``hows``) and ``--timeout``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--hows", default=",".join(hows), help="the fault, or faults")
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser
