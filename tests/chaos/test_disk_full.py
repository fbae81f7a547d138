"""A log dir on a full filesystem: the job's outcome, the console copy and the failure
report's tail are unaffected, and the agent says so in one line (no tracebacks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.chaos.conftest import require_root
from tests.conftest import WORKER


def on_a_small_tmpfs(logs: Path, then: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the shell command ``then`` with ``logs`` a 256 KiB tmpfs, in a private mount
    namespace (the tmpfs is gone with it)."""
    require_root("a tmpfs that fills up")
    logs.mkdir()
    script = f"mount -t tmpfs -o size=256k agentd-full {logs} && {{ {then}; }}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        timeout=120,
        cwd=cwd,
    )


def test_a_full_log_dir_changes_nothing_but_the_log_files(tmp_path):
    logs = tmp_path / "logs"
    agent = (
        f"{sys.executable} -m agentd run --log-dir {logs} --rdzv-id full -t 3 "
        f"{WORKER} chatty --after 3000 --code 7"
    )
    # the result.json the agent reserved at start is copied out before the tmpfs goes
    copy = f"cp {logs}/full/result.json {tmp_path}/result.json"
    out = on_a_small_tmpfs(logs, f"{agent}; code=$?; {copy}; exit $code", tmp_path)
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
    now each attempt runs without one, and says so."""
    logs = tmp_path / "logs"
    agent = (
        f"{sys.executable} -m agentd run --log-dir {logs} --rdzv-id full --nproc-per-node 2 "
        f"--max-restarts 1 {WORKER} flaky"  # fails on attempt 0, succeeds on attempt 1
    )
    fill = f"dd if=/dev/zero of={logs}/fill bs=4k 2>/dev/null"
    out = on_a_small_tmpfs(logs, f"{fill}; {agent}", tmp_path)
    stderr = out.stderr.decode()
    assert out.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    for attempt in (0, 1):
        assert (
            f"{logs}/full/drain.control (No space left on device): a drain of attempt "
            f"{attempt} stops its workers without asking them to checkpoint" in stderr
        ), stderr[-3000:]
