"""The wait for the stopped workers' GPU memory, with real agents and workers and a
stand-in ``nvidia-smi`` on PATH that reports what a file says (no GPU needed; on a GPU,
tests/gpu/ checks the real thing)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from agentd.gpus.release import fits
from agentd.gpus.usage import NvidiaSmiUsage, NvmlUsage, parse_readings
from agentd.hygiene.orphans import ZombieReaper
from tests.conftest import wait_until

pytestmark = pytest.mark.skipif(
    NvmlUsage.open() is not None,
    reason="NVML answers here: the agent would read it, not the stand-in nvidia-smi",
)

JOB = """
import os, sys
held = os.path.join(os.environ["FAKE_GPU_DIR"], "held")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "1":
    with open(held + ".tmp", "w") as fp:  # ours, and another job's, on GPU 1
        fp.write(f"GPU-bbb, {os.getpid()}, 2048\\nGPU-bbb, 4242424, 512\\n")
    os.replace(held + ".tmp", held)
    sys.exit(1)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(os.environ["FAKE_GPU_DIR"], f"attempt{attempt}"), "a") as fp:
    fp.write("x")
"""

NVIDIA_SMI = """#!{python}
import os, sys
apps = ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
gpus = ["--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"]
assert sys.argv[1:] in (apps, gpus), sys.argv
name = "held" if sys.argv[1:] == apps else "gpus"
try:
    print(open(os.path.join(os.environ["FAKE_GPU_DIR"], name)).read(), end="")
except FileNotFoundError:
    pass
"""

NEARLY_FULL = "0, GPU-aaa, 70000\n1, GPU-bbb, 2000\n"
"""GPU 1 has less free than the lost rank holds there: its successor must wait."""


def start(tmp_path: Path, *flags: str, gpus: str = NEARLY_FULL) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    (tmp_path / "gpus").write_text(gpus)
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
    """On a GPU without room for it, the lost rank's memory is waited for; the next round
    forms meanwhile (the wait runs from the stop), and only the start waits."""
    proc = start(tmp_path)
    err = tmp_path / "agent.err"
    try:
        wait_until(lambda: "for the stopped workers' GPU memory" in err.read_text(), 30, "the wait")
        wait_until(lambda: "generation=1" in err.read_text(), 30, "the next round, meanwhile")
        text = err.read_text()
        assert "Waiting up to 30s for the stopped workers' GPU memory: pid" in text
        assert "holds 2048 MiB on GPU 1; GPU 1 has 2000 MiB free" in text
        assert "4242424" not in text  # only our workers count
        assert not (tmp_path / "attempt1").exists() and "attempt 1" not in text
        (tmp_path / "held").write_text("GPU-bbb, 4242424, 512\n")  # ours is released
        assert finish(proc) == 0, err.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()
    text = err.read_text()
    assert "The stopped workers' GPU memory was released after" in text
    assert (tmp_path / "attempt1").read_text() == "xx"


def test_memory_that_fits_beside_the_next_workers_is_not_waited_for(tmp_path):
    """GPU 1 has more free than the lost rank holds: its successor starts while the
    driver still lists the dead pid (here, for good), and no wait is logged."""
    proc = start(tmp_path, gpus="0, GPU-aaa, 70000\n1, GPU-bbb, 2048\n")
    assert finish(proc) == 0, (tmp_path / "agent.err").read_text()[-3000:]
    text = (tmp_path / "agent.err").read_text()
    [line] = [ln for ln in text.splitlines() if "GPU memory" in ln]
    assert "fits in what their GPUs have free (pid " in line
    assert "holds 2048 MiB on GPU 1; GPU 1 has 2048 MiB free)" in line
    assert (tmp_path / "attempt1").read_text() == "xx"


def test_memory_still_held_at_the_timeout_is_named_and_the_restart_goes_on(tmp_path):
    proc = start(tmp_path, "--gpu-release-timeout", "1")
    assert finish(proc) == 0, (tmp_path / "agent.err").read_text()[-3000:]
    text = (tmp_path / "agent.err").read_text()
    [line] = [ln for ln in text.splitlines() if "still hold GPU memory" in ln]
    assert "WARNING" in line and "after 1s (pid " in line and "holds 2048 MiB on GPU 1" in line
    assert (tmp_path / "attempt1").read_text() == "xx"


def test_with_the_wait_off_nvidia_smi_is_never_run(tmp_path):
    proc = start(tmp_path, "--gpu-release-timeout", "0")
    assert finish(proc) == 0
    assert "GPU memory" not in (tmp_path / "agent.err").read_text()


def test_nvidia_smis_lines_are_read_and_anything_else_skipped():
    gpus = "0, GPU-aaa, 80000\n1, GPU-bbb, [N/A]\nNo devices were found\n"
    apps = "GPU-aaa, 1234, 2048\nGPU-bbb, 1234, 512\nGPU-ccc, 99, [N/A]\n"
    apps += "No running processes found\n\n"
    memory = parse_readings(gpus, apps)
    assert memory.held == {1234: {"0": 2048, "1": 512}, 99: {"GPU-ccc": 0}}
    assert memory.free == {"0": 80000} and memory.by_pid() == {1234: 2560, 99: 0}


def test_a_gpu_without_room_or_without_a_free_figure_is_waited_for():
    held = {7: {"0": 1000, "1": 10}, 8: {"0": 1000}}
    assert fits(held, {"0": 2000, "1": 10})
    assert not fits(held, {"0": 1999, "1": 10})
    assert not fits(held, {"0": 2000})  # GPU 1's free memory unknown


async def test_the_agents_reaper_leaves_nvidia_smis_exit_status_to_the_reading(
    tmp_path, monkeypatch
):
    """The agent reaps every child it does not own on SIGCHLD: an nvidia-smi it did not
    own was reaped under asyncio's watcher, read as exit 255, and the wait ended early.
    Here a reaper reaps every millisecond while readings are taken."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(NVIDIA_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    (tmp_path / "gpus").write_text(NEARLY_FULL)
    (tmp_path / "held").write_text("GPU-bbb, 4242424, 512\n")
    reaper = ZombieReaper()
    for child in psutil.Process().children():  # other tests' leftovers are not ours to reap
        reaper.own(child.pid)

    async def reap_all_along() -> None:
        while True:
            reaper.reap()
            await asyncio.sleep(0.001)

    monkeypatch.setenv("FAKE_GPU_DIR", str(tmp_path))
    usage = NvidiaSmiUsage(str(smi), reaper)
    reaping = asyncio.create_task(reap_all_along())
    try:
        readings = [await usage.read() for _ in range(4)]
    finally:
        reaping.cancel()
    assert all(r is not None and r.held == {4242424: {"1": 512}} for r in readings), readings


async def test_nvmls_processes_and_free_memory_make_one_reading():
    """NVML's calls as the reading makes them (a stand-in module: no GPU here)."""
    mib = 2**20

    class Nvml:
        devices = [(80000 * mib, [(7, 2048 * mib), (8, None)]), (100 * mib, [(7, 512 * mib)])]

        def nvmlDeviceGetCount(self):
            return len(self.devices)

        def nvmlDeviceGetHandleByIndex(self, index):
            return self.devices[index]

        def nvmlDeviceGetMemoryInfo(self, device):
            return SimpleNamespace(free=device[0])

        def nvmlDeviceGetComputeRunningProcesses(self, device):
            return [SimpleNamespace(pid=p, usedGpuMemory=used) for p, used in device[1]]

    memory = await NvmlUsage(Nvml()).read()
    assert memory is not None
    assert memory.held == {7: {"0": 2048, "1": 512}, 8: {"0": 0}}
    assert memory.free == {"0": 80000, "1": 100}


async def test_a_start_cut_short_leaves_the_wait_for_the_next_one():
    """``settled()`` cancelled (a stop signal during the start) leaves the wait that
    ``stopped()`` began running: the shutdown's ``settled()`` waits for it."""
    from agentd.gpus.release import GpuRelease
    from agentd.gpus.usage import GpuMemory

    class Usage:
        name = "a stand-in"
        held = True

        async def read(self) -> GpuMemory:
            held = {7: {"0": 2048}} if self.held else {}
            return GpuMemory(held=held, free={"0": 1024})

    release = GpuRelease(30.0)
    release._usage = Usage()
    release.stopped({7})
    start = asyncio.create_task(release.settled())
    await asyncio.sleep(0.1)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    [wait] = release._waits
    assert not wait.done()
    release._usage.held = False
    await asyncio.wait_for(release.settled(), 5)
    assert wait.done() and release._waits == []


async def test_a_stop_cut_short_while_the_gpus_are_looked_for_leaves_the_look_to_the_next(
    monkeypatch,
):
    """The first look for the GPUs (NVML loads in a thread, tens of milliseconds) is shared
    by every caller: a stop cancelled while it ran cancelled the look too, and every later
    stop, and the shutdown's ``settled()``, raised CancelledError of their own."""
    import threading

    from agentd.gpus import release as release_module
    from agentd.gpus import usage as usage_module

    begun, go_on = threading.Event(), threading.Event()

    def slow_open(helpers: object) -> None:
        begun.set()
        go_on.wait(10)  # no GPU found, once let through

    monkeypatch.setattr(release_module, "may_have_gpus", lambda: True)
    monkeypatch.setattr(usage_module, "open_usage", slow_open)
    gpus = release_module.GpuRelease(30.0)
    first = asyncio.create_task(gpus.watched([os.getpid()]))
    assert await asyncio.to_thread(begun.wait, 10)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    go_on.set()
    assert await asyncio.wait_for(gpus.watched([os.getpid()]), 10) == set()
