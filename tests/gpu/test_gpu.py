"""In-process restarts and restarts on a real GPU (skipped without CUDA): the model on
the GPU, NCCL groups aborted and rebuilt in process, and the stopped workers' GPU memory
released before the next attempt starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TESTS

WORKERS = TESTS / "workers"


def agentd(
    tmp_path: Path, nproc: int, *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--log-dir",
        str(tmp_path / "logs"),
        *args,
    ]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preload", [False, True], ids=["spawned", "preload"])
def test_a_model_on_the_gpu_restarts_in_process_and_the_new_rank_gets_its_weights(
    tmp_path, preload
):
    """4 gloo ranks, the model and 256 MiB on the GPU; rank 2 dies at step 5. The others
    keep their pid and CUDA memory, the new rank gets their weights, and training ends
    where an uninterrupted run ends."""
    flags = ["--preload", "torch"] if preload else ["--no-preload"]
    env = {"TEST_DEVICE": "cuda", "TEST_BALLAST_MB": "256"}
    runs = {}
    for name, crash in (("plain", []), ("crashed", ["5"])):
        (tmp_path / name).mkdir()
        done = agentd(
            tmp_path,
            4,
            "--max-restarts",
            "1",
            *flags,
            str(WORKERS / "torch_inprocess.py"),
            str(tmp_path / name),
            "12",
            *crash,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = {
            r["rank"]: r
            for r in map(json.loads, map(Path.read_text, (tmp_path / name).glob("rank*.json")))
        }
        if crash:
            assert "in-process fallback" not in done.stderr, done.stderr[-3000:]
            assert "Started 4 worker(s), attempt 1" in done.stderr
    crashed, plain = runs["crashed"], runs["plain"]
    for rank in (0, 1, 3):  # the same process, called twice, its CUDA memory kept
        assert crashed[rank]["calls"] == 2 and crashed[rank]["restart"] == 1
        first, second = crashed[rank]["allocated"]
        assert second >= first > 256 * 2**20  # kept: the model, ballast, now grads and momentum
    assert crashed[2]["calls"] == 1 and crashed[2]["restart"] == 0
    for report in crashed.values():
        assert report["weights"] == pytest.approx(plain[0]["weights"], abs=1e-5)


@pytest.mark.timeout(300)
def test_a_standby_with_its_cuda_ready_takes_the_lost_ranks_place(tmp_path):
    """``--standby-cuda``: 4 gloo ranks, the model and 256 MiB on the GPU; rank 2 dies
    once the standby of its slot has its CUDA context. That standby becomes rank 2 (its
    pid known before the crash), held no more than a context on the GPU before, and
    the job ends with every rank's weights alike."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"TEST_DEVICE": "cuda", "TEST_BALLAST_MB": "256", "TEST_WAIT_STANDBY": "cuda"}
    done = agentd(
        tmp_path,
        4,
        "--max-restarts",
        "1",
        "--preload",
        "torch",
        "--standby-cuda",
        str(WORKERS / "torch_inprocess.py"),
        str(out),
        "12",
        "5",
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = {r["rank"]: r for r in map(json.loads, map(Path.read_text, out.glob("rank*.json")))}
    crash = json.loads((out / "crash.json").read_text())
    print(json.dumps(crash))  # the standby's GPU memory: docs/inprocess.md quotes it
    for line in done.stderr.splitlines():  # the lost rank's memory at the hand-over: it
        if "GPU memory" in line:  # fits beside it, or was waited for (or gone at once)
            print("agent:", line.split(" ", 2)[2])
    assert crash["standby"] is not None and reports[2]["pid"] == crash["standby"]
    assert reports[2]["calls"] == 1 and reports[2]["started"] < crash["since_boot"]
    if shutil.which("nvidia-smi"):
        assert crash["mib"] is not None and 0 < crash["mib"] <= 1024, crash  # a context
    for report in reports.values():
        assert report["weights"] == pytest.approx(reports[0]["weights"], abs=1e-5)
    assert "in-process fallback" not in done.stderr and "could not be started" not in done.stderr


@pytest.mark.timeout(300)
def test_a_one_rank_nccl_job_that_raises_five_times_stays_in_one_process_and_flat(tmp_path):
    (tmp_path / "out").mkdir()
    done = agentd(
        tmp_path,
        1,
        "--max-restarts",
        "5",
        "--inprocess-quick-restarts",
        "0",
        str(WORKERS / "torch_nccl_inprocess.py"),
        str(tmp_path / "out"),
        "raise",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    calls = lines(tmp_path / "out" / "rank0.jsonl")
    print(json.dumps(calls))
    assert [c["call"] for c in calls] == [1, 2, 3, 4, 5, 6]
    assert len({c["pid"] for c in calls}) == 1  # one process: the NCCL group was rebuilt
    assert [c["count"] for c in calls] == [0, 1, 2, 3, 4, 5]
    assert all(c["value"] == c["call"] for c in calls)
    assert len({c["allocated"] for c in calls}) == 1  # the allocator: flat
    used = [c["device_used"] for c in calls[1:]]
    assert max(used) - min(used) <= 64 * 2**20, used  # the device, NCCL's buffers too: flat
    assert "in-process fallback" not in done.stderr
    raised = [float(t) for t in (tmp_path / "out" / "rank0.raised").read_text().split()]
    restarts = [c["called_at"] - r for c, r in zip(calls[1:], raised, strict=True)]
    teardowns = [c["teardown_s"] for c in calls[1:]]
    assert all(t > 0 for t in teardowns)  # each park tore the NCCL group down
    print(  # bench/gpu_check.sh's table quotes these lines
        "nccl restart ms: " + " ".join(f"{t * 1000:.0f}" for t in restarts),
        "| park's teardown ms: " + " ".join(f"{t * 1000:.1f}" for t in teardowns),
    )


@pytest.mark.timeout(300)
def test_a_rank_busy_in_nccl_is_interrupted_aborted_and_resumes_in_process(tmp_path):
    (tmp_path / "out").mkdir()
    done = agentd(
        tmp_path,
        2,
        "--max-restarts",
        "1",
        str(WORKERS / "torch_nccl_inprocess.py"),
        str(tmp_path / "out"),
        "blocked",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = lines(tmp_path / "out" / "rank0.jsonl")
    assert second["pid"] == first["pid"] and second["count"] == 1
    new = lines(tmp_path / "out" / "rank1.jsonl")
    assert new[-1]["pid"] != new[0]["pid"]
    assert "in-process fallback" not in done.stderr


@pytest.mark.timeout(300)
def test_the_next_attempt_starts_once_the_stopped_workers_gpu_memory_is_released(tmp_path):
    pytest.importorskip("pynvml")
    (tmp_path / "out").mkdir()
    done = agentd(
        tmp_path,
        2,
        "--max-restarts",
        "1",
        str(WORKERS / "torch_gpu_release.py"),
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / "out" / f"seen{rank}.json").read_text())
        assert seen["old_pids_holding"] == [], (seen, done.stderr[-3000:])
    assert "still hold GPU memory" not in done.stderr
    print(done.stderr)
