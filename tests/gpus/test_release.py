"""The wait for the stopped workers' GPU memory, with real agents and workers and a
stand-in ``nvidia-smi`` on PATH that reports what a file says (no GPU needed; on a GPU,
tests/gpu/ checks the real thing)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentd.gpus.usage import parse_compute_apps
from tests.conftest import wait_until

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None,
    reason="NVML is installed here: the agent would read it, not the stand-in nvidia-smi",
)

JOB = """
import os, sys
held = os.path.join(os.environ["FAKE_GPU_DIR"], "held")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "1":
    with open(held + ".tmp", "w") as fp:
        fp.write(f"{os.getpid()}, 2048\\n4242424, 512\\n")  # ours, and another job's
    os.replace(held + ".tmp", held)
    sys.exit(1)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(os.environ["FAKE_GPU_DIR"], f"attempt{attempt}"), "a") as fp:
    fp.write("x")
"""

NVIDIA_SMI = """#!{python}
import os, sys
query = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
assert sys.argv[1:] == query, sys.argv
try:
    print(open(os.path.join(os.environ["FAKE_GPU_DIR"], "held")).read(), end="")
except FileNotFoundError:
    pass
"""


def start(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_GPU_DIR": str(tmp_path)}
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *flags,
        str(tmp_path / "job.py"),
    ]
    with open(tmp_path / "agent.err", "w") as err:
        return subprocess.Popen(argv, stderr=err, text=True, cwd=tmp_path, env=env)


def finish(proc: subprocess.Popen[str]) -> int:
    try:
        return proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()


def test_the_next_attempt_waits_until_the_stopped_workers_gpu_memory_is_released(tmp_path):
    proc = start(tmp_path)
    err = tmp_path / "agent.err"
    try:
        wait_until(lambda: "for the stopped workers' GPU memory" in err.read_text(), 30, "the wait")
        text = err.read_text()
        assert "Waiting up to 30s for the stopped workers' GPU memory: pid" in text
        assert "holds 2048 MiB" in text and "4242424" not in text  # only our workers count
        assert not (tmp_path / "attempt1").exists() and "attempt 1" not in text
        (tmp_path / "held").write_text("4242424, 512\n")  # ours is released
        assert finish(proc) == 0, err.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()
    text = err.read_text()
    assert "The stopped workers' GPU memory was released after" in text
    assert (tmp_path / "attempt1").read_text() == "xx"


def test_memory_still_held_at_the_timeout_is_named_and_the_restart_goes_on(tmp_path):
    proc = start(tmp_path, "--gpu-release-timeout", "1")
    assert finish(proc) == 0, (tmp_path / "agent.err").read_text()[-3000:]
    text = (tmp_path / "agent.err").read_text()
    [line] = [ln for ln in text.splitlines() if "still hold GPU memory" in ln]
    assert "WARNING" in line and "after 1s (pid " in line and "holds 2048 MiB)" in line
    assert (tmp_path / "attempt1").read_text() == "xx"


def test_with_the_wait_off_nvidia_smi_is_never_run(tmp_path):
    proc = start(tmp_path, "--gpu-release-timeout", "0")
    assert finish(proc) == 0
    assert "GPU memory" not in (tmp_path / "agent.err").read_text()


def test_nvidia_smis_lines_are_read_and_anything_else_skipped():
    text = "1234, 2048\n1234, 512\n99, [N/A]\nNo running processes found\n\n"
    assert parse_compute_apps(text) == {1234: 2560, 99: 0}
