"""A worker the OOM killer took is reported as out of memory, with what the kernel knows.

The files of /proc and /sys are copied into a fake root for the cgroup layouts this machine
does not have; the real OOM kill runs agentd in a memory cgroup the test creates (skipped
where cgroups are not writable)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
import uuid
from pathlib import Path

import pytest

from agentd.reports.oom import MemoryCgroup, OomWatch, describe, kernel_oom_kills
from tests.conftest import wait_until
from tests.helpers.jobs import result_json

MiB = 2**20
NO_MEMORY = "31 1 0:1 / /sys/fs/cgroup/cpu - cgroup cgroup rw,cpu"  # a mount of no memory cgroup
KMSG_KILL = (
    "3,1021,{usec},-;Memory cgroup out of memory: Killed process {pid} (python) "
    "total-vm:1200000kB, anon-rss:150000kB, file-rss:2048kB, shmem-rss:0kB, UID:0 "
    "pgtables:600kB oom_score_adj:0\n"
)


def fake_root(tmp_path: Path, cgroup_line: str, mount: str, files: dict[str, str]) -> Path:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup_line + "\n")
    (root / "proc/self/mountinfo").write_text(
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n" + mount + "\n"
    )
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def v1_root(tmp_path: Path, kills: int = 0) -> Path:
    cg = "sys/fs/cgroup/memory/jobs/a"
    return fake_root(
        tmp_path,
        "4:memory:/jobs/a",
        "35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
        {
            f"{cg}/memory.oom_control": f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n",
            f"{cg}/memory.limit_in_bytes": str(512 * MiB),
            f"{cg}/memory.max_usage_in_bytes": str(300 * MiB),
            "sys/fs/cgroup/memory/jobs/memory.limit_in_bytes": str(256 * MiB),
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        },
    )


def bump_v1(root: Path, kills: int) -> None:
    path = root / "sys/fs/cgroup/memory/jobs/a/memory.oom_control"
    path.write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")


def test_v1_the_counter_names_the_cause_with_the_tightest_limit_and_the_peak(tmp_path):
    root = v1_root(tmp_path)
    watch = OomWatch(kmsg=str(tmp_path / "no-kmsg"), root=root)
    watch.arm()
    assert watch.explain(1234, -signal.SIGKILL) is None  # no kill counted: no claim
    bump_v1(root, 1)
    oom = watch.explain(1234, -signal.SIGKILL)
    assert oom == {
        "scope": None,
        "cgroup": "/jobs/a",
        "limit_bytes": 256 * MiB,
        "peak_bytes": 300 * MiB,
        "rss_bytes": None,
    }
    assert watch.explain(1234, 1) is None  # an exit code is never an OOM kill
    assert watch.explain(1234, -signal.SIGTERM) is None


def test_v2_reads_memory_events_max_and_peak(tmp_path):
    cg = "sys/fs/cgroup/user.slice/job"
    root = fake_root(
        tmp_path,
        "0::/user.slice/job",
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
        {
            f"{cg}/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n",
            f"{cg}/memory.max": "max",
            f"{cg}/memory.peak": str(200 * MiB),
            "sys/fs/cgroup/user.slice/memory.max": str(1024 * MiB),
        },
    )
    cgroup = MemoryCgroup.of("self", root)
    assert cgroup is not None and cgroup.version == 2
    assert (cgroup.oom_kills(), cgroup.limit(), cgroup.peak()) == (0, 1024 * MiB, 200 * MiB)


def test_a_container_sees_its_cgroup_at_the_mount_point(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/docker/abc",
        "30 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw",
        {"sys/fs/cgroup/memory.events": "oom_kill 2\n", "sys/fs/cgroup/memory.max": "1048576"},
    )
    cgroup = MemoryCgroup.of("self", root)
    assert cgroup is not None and cgroup.path == root / "sys/fs/cgroup"
    assert (cgroup.oom_kills(), cgroup.limit()) == (2, 1048576)


def test_no_memory_cgroup_means_no_claim(tmp_path):
    root = fake_root(
        tmp_path, "1:cpu:/", "31 1 0:1 / /sys/fs/cgroup/cpu - cgroup cgroup rw,cpu", {}
    )
    assert MemoryCgroup.of("self", root) is None
    watch = OomWatch(kmsg=str(tmp_path / "none"), root=root)
    watch.arm()
    assert watch.explain(7, -signal.SIGKILL) is None


def test_the_kernel_log_names_the_pid_and_its_resident_memory(tmp_path):
    kmsg = tmp_path / "kmsg"
    old = KMSG_KILL.format(usec=1_000_000, pid=55)  # before the watch was armed
    kmsg.write_text(
        "6,1000,5000000,-;eth0: link up\n SUBSYSTEM=net\n"
        + old
        + KMSG_KILL.format(usec=9_000_000, pid=77)
        + "4,1022,9000001,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=77,uid=0\n"
    )
    kills = kernel_oom_kills(since=2.0, path=str(kmsg))
    assert list(kills) == [77]
    assert kills[77].rss_bytes == (150000 + 2048) * 1024 and kills[77].in_cgroup
    assert kernel_oom_kills(since=0, path=str(tmp_path / "unreadable")) == {}


def test_the_kernel_log_alone_is_enough(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG_KILL.format(usec=10**15, pid=77).replace("Memory cgroup out", "Out"))
    root = fake_root(
        tmp_path, "1:cpu:/", "31 1 0:1 / /sys/fs/cgroup/cpu - cgroup cgroup rw,cpu", {}
    )
    watch = OomWatch(kmsg=str(kmsg), root=root)
    watch.arm()
    oom = watch.explain(77, -signal.SIGKILL)
    assert oom is not None and oom["scope"] == "system" and oom["cgroup"] is None
    assert describe(oom) == "out of memory (the machine ran out, resident 148.5 MiB when killed)"
    assert watch.explain(78, -signal.SIGKILL) is None  # another pid's record is not ours


def test_describe_says_what_is_known():
    assert describe({}) == "out of memory"
    assert describe({"limit_bytes": 256 * MiB, "peak_bytes": 256 * MiB}) == (
        "out of memory (cgroup limit 256 MiB, peak 256 MiB)"
    )


# -- a real OOM kill ------------------------------------------------------------------------


def unavailable(reason: str) -> None:
    """Skip the real OOM kill; in CI as root (CI's machine has memory cgroups) fail instead,
    so the test never stops running there unseen."""
    if os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail(f"the real OOM kill must run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def memory_cgroup(tmp_path):
    """A memory cgroup below this process's own, limited to 1 GiB (room for workers that
    import torch, and a zygote that preloaded it); removed afterwards."""
    mine = MemoryCgroup.of()
    if mine is None:
        unavailable("no memory cgroup to create one under")
    path = mine.path / f"agentd-oom-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        unavailable(f"memory cgroups are not writable here: {exc.strerror}")
    limit = 1024 * MiB
    try:
        limit_file = path / ("memory.max" if mine.version == 2 else "memory.limit_in_bytes")
        if not limit_file.exists():  # v2: the memory controller is not delegated to us
            unavailable(f"{limit_file} is missing: the memory controller is not enabled here")
        limit_file.write_text(str(limit))
        # Where there is swap, the hog would swap instead of being killed.
        swap, value = (
            (path / "memory.swap.max", "0")
            if mine.version == 2
            else (path / "memory.memsw.limit_in_bytes", str(limit))
        )
        if swap.exists():
            swap.write_text(value)
        yield path, limit
    finally:
        procs = path / "cgroup.procs"
        for pid in procs.read_text().split() if procs.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_until(lambda: not procs.exists() or not procs.read_text().split(), 30)
        path.rmdir()


def test_a_worker_killed_for_its_memory_is_reported_out_of_memory(
    run_agentd, tmp_path, memory_cgroup, torch_worker
):
    """Its workers import torch: forked from the zygote, and spawned (the defaults matrix)."""
    cgroup, limit = memory_cgroup
    hog = tmp_path / "hog.py"
    hog.write_text(
        textwrap.dedent("""
        import os, time
        if os.environ["LOCAL_RANK"] == "1":
            chunks = []
            while True:
                chunks.append(b"x" * (8 << 20))  # written, so resident
        time.sleep(60)
    """)
    )
    events = tmp_path / "events.jsonl"

    def enter_cgroup() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--event-log",
        str(events),
        *torch_worker,
        str(hog),
        preexec=enter_cgroup,
    )
    assert agent.wait(120) == 1, agent.stderr()[-3000:]
    root = result_json(agent)["root_cause"]
    assert root["rank"] == 1 and root["signal"] == "SIGKILL"
    assert root["oom"]["limit_bytes"] == limit
    assert root["message"].startswith("out of memory (cgroup limit 1 GiB")
    assert "exit code : -9 (SIGKILL: out of memory)" in agent.stderr()
    failed = [json.loads(line) for line in events.read_text().splitlines()]
    failed = [e for e in failed if e["name"] == "worker_failed"]
    assert failed and failed[0]["metadata"]["oom"]["limit_bytes"] == limit
