"""torch's launcher API (``elastic_launch``, ``LaunchConfig``) through both implementations."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import free_port
from tests.torch_api.conftest import (
    LAUNCHERS,
    PREFIXES,
    RUNS_SCRIPTS,
    SCRIPT_TIMEOUT,
    SCRIPTS,
    run_script,
)

pytestmark = RUNS_SCRIPTS


def test_elastic_launch_returns_the_return_values_by_rank(impl):
    out = run_script(impl, "launch.py", "ok", str(free_port()))
    assert out["outputs"] == {"0": 0, "1": 10}


def test_a_failed_launch_raises_child_failed_error_and_record_passes_the_root_cause_up(
    impl, tmp_path
):
    error_file = tmp_path / "launcher_error.json"
    env = {
        **os.environ,
        "ELASTIC": PREFIXES[impl],
        "LAUNCHER": LAUNCHERS[impl],
        "PYTHONWARNINGS": "ignore",
        "TORCHELASTIC_ERROR_FILE": str(error_file),
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "launch.py"), "fail", str(free_port())],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        env=env,
    )
    assert proc.returncode != 0
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed_rank"] == 1
    assert "rank 1 gave up" in out["message"] and "rank 1 gave up" in out["text"]
    copied = json.loads(error_file.read_text())
    assert "rank 1 gave up" in json.dumps(copied)  # the worker's error, not the launcher's
