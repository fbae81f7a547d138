"""A log dir on a full filesystem: the job's outcome, the console copy and the failure
report's tail are unaffected, and the agent says so in one line (no tracebacks)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.chaos.conftest import require_root
from tests.conftest import WORKER
from tests.drain.test_drain import TRAIN, notes, stepping

FILL = "dd if=/dev/zero of=logs/fill bs=4k 2>/dev/null"
"""Fills the tmpfs ``logs`` (the test's folder is the command's working directory)."""


def on_a_small_tmpfs(logs: Path, then: str) -> list[str]:
    """The command that runs the shell command ``then`` with ``logs`` a 256 KiB tmpfs, in a
    private mount namespace (the tmpfs is gone with it; ``exec`` in ``then``: the command's
    pid is then that of what it runs)."""
    require_root("a tmpfs that fills up")
    logs.mkdir()
    script = f"mount -t tmpfs -o size=256k agentd-full {logs} && {{ {then}; }}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def run_on_a_small_tmpfs(logs: Path, then: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run :func:`on_a_small_tmpfs`'s command to its end."""
    return subprocess.run(on_a_small_tmpfs(logs, then), capture_output=True, timeout=120, cwd=cwd)


def test_a_full_log_dir_changes_nothing_but_the_log_files(tmp_path):
    logs = tmp_path / "logs"
    agent = (
        f"{sys.executable} -m agentd run --log-dir {logs} --rdzv-id full -t 3 "
        f"{WORKER} chatty --after 3000 --code 7"
    )
    # the result.json the agent reserved at start is copied out before the tmpfs goes
    copy = f"cp {logs}/full/result.json {tmp_path}/result.json"
    out = run_on_a_small_tmpfs(logs, f"{agent}; code=$?; {copy}; exit $code", tmp_path)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 1, stderr[-3000:]  # the worker's failure: not 3, not a crash
    assert stdout.count("[default0]:out ") == 3000  # the console copy never stopped
    assert "final words" in stderr  # the failure report quotes the tail all the same
    assert "exit code : 7" in stderr
    assert stderr.count("log dir full: cannot write") == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    result = json.loads((tmp_path / "result.json").read_text())  # reserved at start: complete
    assert result["state"] == "FAILED" and result["root_cause"]["exitcode"] == 7
    assert "final words" in result["root_cause"]["stderr_tail"]
    assert f"Failure report written to {logs}/full/result.json" in stderr


def test_an_agent_started_on_a_full_log_dir_runs_its_job_and_its_restart(tmp_path):
    """An agent started again onto the disk its logs filled (systemd's ``Restart=``): it
    crashed before, with a traceback, making the drain control file in the run directory;
    now it makes it in the agent's private runtime directory, and says so."""
    logs = tmp_path / "logs"
    agent = (
        f"{sys.executable} -m agentd run --log-dir {logs} --rdzv-id full --nproc-per-node 2 "
        f"--max-restarts 1 {WORKER} flaky"  # fails on attempt 0, succeeds on attempt 1
    )
    out = run_on_a_small_tmpfs(logs, f"{FILL}; {agent}", tmp_path)
    stderr = out.stderr.decode()
    assert out.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    made = re.findall(
        rf"Could not create the drain control file {logs}/full/drain.control \(No space "
        rf"left on device\): attempt (\d)'s is (\S+/agentd-timer-\S+/drain.control)",
        stderr,
    )
    # said once: attempt 1 uses the same file (a kept worker maps the first attempt's)
    assert [attempt for attempt, _ in made] == ["0"], stderr[-3000:]
    assert stderr.count("drain control file") == 1
    assert "Started 2 worker(s), attempt 1" in stderr
    assert not Path(made[0][1]).parent.exists()  # gone with the agent


def test_a_drain_on_a_full_log_dir_still_has_every_rank_checkpoint(tmp_path):
    """Preempted while its log disk is full: the workers are still asked to checkpoint
    (through the control file in the private runtime directory), where they were stopped
    without a checkpoint before."""
    logs, job = tmp_path / "logs", tmp_path / "job"
    job.mkdir()
    agent = (
        f"exec {sys.executable} -m agentd run --log-dir {logs} --rdzv-id full "
        f"--nproc-per-node 2 --drain-on SIGUSR1 {TRAIN} {job} {tmp_path / 'stop'}"
    )
    with (
        open(tmp_path / "agent.err", "wb") as err,
        subprocess.Popen(
            on_a_small_tmpfs(logs, f"{FILL}; {agent}"), stderr=err, cwd=tmp_path
        ) as proc,
    ):
        try:
            stepping(job, 2)
            proc.send_signal(signal.SIGUSR1)
            proc.wait(60)
        finally:
            proc.kill()  # nothing, unless the test failed before the agent's end
    stderr = (tmp_path / "agent.err").read_text()
    assert proc.returncode == 128 + signal.SIGUSR1, stderr[-3000:]
    ckpts = notes(job, "ckpt_0_*")
    assert len(ckpts) == 2 and len({c["step"] for c in ckpts}) == 1, stderr[-3000:]
    assert "drain control file" in stderr and "Traceback" not in stderr
