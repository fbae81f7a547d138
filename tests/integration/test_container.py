"""agentd as a container's PID 1, in a fresh PID namespace (``unshare``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TESTS, wait_until

ROOT = Path(__file__).parents[2]


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not can_unshare(), reason="needs unshare of a PID namespace")


def test_pid1_reaps_orphans_and_stops_on_sigterm(tmp_path):
    out = tmp_path / "out"
    with open(out, "wb") as fp:
        proc = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--kill-child",  # --fork, and what it forked is killed with it
                "--mount-proc",
                sys.executable,
                "-m",
                "agentd",
                "run",
                "--log-dir",
                str(tmp_path / "logs"),
                str(TESTS / "workers" / "orphan_maker.py"),
            ],
            stdout=fp,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    try:
        wait_until(lambda: "ready" in out.read_text(), what="worker ready")
        text = out.read_text()
        assert "reaped; agent is pid 1" in text, text
        [agent] = [
            int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        ]
        os.kill(agent, signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert "stopped by SIGTERM" in out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()  # unshare's child, PID 1 of the namespace, dies with everything in it
            proc.wait()


HEARTBEATS = """
import os, sys, time, agentd
while not os.path.exists(sys.argv[1]):  # the pipe is reached for at the first heartbeat
    time.sleep(0.05)
while True:
    agentd.heartbeat()
    time.sleep(0.05)
"""


def in_container(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """``agentd run ARGS`` as PID 1 of a PID namespace of its own, sharing this host's /tmp
    (a container with the host's temporary folder mounted); its output's path."""
    out = tmp_path / f"{name}.out"
    box = ["unshare", "--pid", "--kill-child", "--mount-proc"]  # its child dies with it
    agentd = [sys.executable, "-m", "agentd", "run", "--log-dir", str(tmp_path / f"{name}-logs")]
    with open(out, "wb") as fp:
        proc = subprocess.Popen(
            [*box, *agentd, *args],
            stdout=fp,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    return proc, out


def heartbeats_reach(read: Callable[[], str]) -> bool:
    """Whether the agent whose output ``read`` gives has seen its worker's heartbeats (an
    AssertionError if the worker could not reach it)."""
    text = read()
    assert "heartbeats are off" not in text, text[-2000:]
    url = re.search(r"Health endpoint on (http://\S+)", text).group(1)
    doc = json.loads(urllib.request.urlopen(url + "/status", timeout=10).read())
    return any(w["steps"] for w in doc["heartbeats"]["workers"])


def test_agents_of_other_pid_namespaces_keep_their_pipes(run_agentd, tmp_path):
    """Agents on one host sharing /tmp, some in PID namespaces of their own: each one sweeps
    the pipe directories of dead agents as its first workers start, and took the others'
    for dead (their pids name other processes, or none, in its namespace). A container's
    agent removed the host agent's pipe under it, and the other way round: a worker that
    reached for it afterwards ran with no watchdog and no heartbeats ("cannot reach the
    agent ... heartbeats are off"), the Hugging Face drain test's flake in the suite."""
    worker = tmp_path / "heartbeats.py"
    worker.write_text(HEARTBEATS)
    started = re.compile(r"Started 1 worker")
    boxed, boxed_out = in_container(
        tmp_path, "boxed", "--health-port", "0", str(worker), str(tmp_path / "go-boxed")
    )
    try:
        wait_until(lambda: started.search(boxed_out.read_text()), what="the container's workers")
        host = run_agentd("--health-port", "0", str(worker), str(tmp_path / "go-host"))
        wait_until(lambda: started.search(host.stderr()), what="the host's workers")  # swept
        late, late_out = in_container(tmp_path, "late", "--no-python", "true")
        assert late.wait(timeout=60) == 0, late_out.read_text()  # swept at its start too
        (tmp_path / "go-boxed").touch()
        (tmp_path / "go-host").touch()
        wait_until(lambda: heartbeats_reach(host.stderr), what="the host agent's heartbeats")
        wait_until(lambda: heartbeats_reach(boxed_out.read_text), what="the container's")
    finally:
        boxed.kill()  # unshare's child, PID 1 of the namespace, dies with everything in it
        boxed.wait()
