"""agentd as a container's PID 1, in a fresh PID namespace (``unshare``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
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
                "--fork",
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
