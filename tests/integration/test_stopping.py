"""Stopping end to end: signals, the stop timeout, a second Ctrl-C, kill -9, leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from tests.conftest import WORKER, free_port, pid_alive, wait_until
from tests.helpers.jobs import STEADY, agent_args, member_job, result_json, world_sizes


def test_sigterm_stops_workers_and_exits_143(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", WORKER, "tree")
    pids = agent.wait_ready(2)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 128 + signal.SIGTERM
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=5, what="workers gone")
    assert "stopped by SIGTERM" in agent.stderr()
    assert result_json(agent)["state"] == "STOPPED"


def test_stop_timeout_then_sigkill(run_agentd):
    agent = run_agentd("--stop-timeout", "0.3", WORKER, "ignore-term")
    [pid] = agent.wait_ready(1)
    agent.proc.send_signal(signal.SIGINT)
    assert agent.wait() == 128 + signal.SIGINT
    assert not pid_alive(pid)
    # the kill is said, with whom it killed: it was silent, a 30 s gap in the log
    assert f"Local rank(s) [0] (pid(s) {pid}) still ran 0.3s after SIGTERM" in agent.stderr()


def test_second_sigint_forces_kill(run_agentd):
    agent = run_agentd("--stop-timeout", "600", WORKER, "ignore-term")
    [pid] = agent.wait_ready(1)
    agent.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "Stopping 1 running worker" in agent.stderr(), what="stop started")
    agent.proc.send_signal(signal.SIGINT)
    assert agent.wait(timeout=10) == 128 + signal.SIGINT
    assert not pid_alive(pid)


def test_kill_9_leaves_nothing_behind(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", WORKER, "tree")
    pids = agent.wait_ready(2)
    assert len(pids) == 6  # 2 workers, each with a grandchild in its group and one escaped
    pipe_dir = Path(worker_env(pids[0])["AGENTD_PROGRESS_PIPE"]).parent
    assert pipe_dir.is_dir() and pipe_dir.name.startswith("agentd-timer-")
    agent.proc.kill()
    agent.wait()
    wait_until(
        lambda: not any(pid_alive(p) for p in pids),
        timeout=1.0,
        what="workers and grandchildren dead within a second",
    )
    # (killed as its guardian started, an agent left it: tests/hygiene/test_guardian_start.py)
    wait_until(lambda: not pipe_dir.exists(), what="the guardian to remove its directory")


def test_kill_9_of_a_store_host_leaves_no_token_file(run_agentd, tmp_path):
    """The tokens a killed agent published for this user (its store's, its health
    endpoint's) cannot be withdrawn by it: its guardian removes them."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    agent = run_agentd(
        *agent_args(f"127.0.0.1:{free_port()}", "1", "--health-port", "0", conf=STEADY),
        *member_job(tmp_path / "stop"),
        env={"XDG_RUNTIME_DIR": str(runtime)},
    )
    wait_until(lambda: world_sizes(agent, 0) == {1}, what="the job's worker")
    wait_until(lambda: guardian_of(agent.proc.pid) is not None, what="the agent's guardian")
    published = runtime / "agentd"
    assert sorted(p.name.split("-")[0] for p in published.iterdir()) == ["health", "store"]
    agent.proc.kill()
    agent.wait()
    wait_until(lambda: not any(published.iterdir()), what="the guardian to remove the tokens")


def test_kill_9_of_a_member_leaves_no_copy_of_the_jobs_token(run_agentd, tmp_path):
    """A member standing by for a loopback seed keeps a copy of the job's token (for a
    store restarted at the endpoint); killed, its guardian removes the copy, and the
    seed's own file stays."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    port = free_port()
    agents = [
        run_agentd(
            *agent_args(f"127.0.0.1:{port}", "2", conf=STEADY),
            *member_job(tmp_path / "stop"),
            env={"XDG_RUNTIME_DIR": str(runtime)},
        )
        for _ in range(2)
    ]
    wait_until(lambda: all(world_sizes(a, 0) == {2} for a in agents), what="a job of two")
    published = runtime / "agentd"
    copies = lambda: list(published.glob(f"store-{port}.*.token"))  # noqa: E731
    [copy] = wait_until(copies, what="the member's copy of the token")
    seed = published / f"store-{port}.token"
    assert copy.read_text() == seed.read_text()
    [member] = [a for a in agents if "Hosting the rendezvous store" not in a.stderr()]
    wait_until(lambda: guardian_of(member.proc.pid) is not None, what="the member's guardian")
    member.proc.kill()
    member.wait()
    wait_until(lambda: not copies(), what="the guardian to remove the copy")
    assert seed.exists()


def guardian_of(pid: int) -> psutil.Process | None:
    for child in psutil.Process(pid).children():
        if any(arg.endswith("guardian_process.py") for arg in child.cmdline()):
            return child
    return None


def worker_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item)


def test_leftovers_of_a_dead_agent_are_cleaned_at_start(run_agentd):
    run = f"leftovers-{os.getpid()}"  # no other test's agent shares it (they run side by side)
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names an agent that no longer exists
    mark = f"{dead.pid}.1/{run}"
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "AGENTD_OWNER": mark})
    other_run = subprocess.Popen(["sleep", "600"], env={**os.environ, "AGENTD_OWNER": mark + "x"})
    try:
        agent = run_agentd("--rdzv-id", run, WORKER, "ok")
        assert agent.wait() == 0
        assert leftover.wait(timeout=5) == -signal.SIGKILL
        assert f"left by an earlier agent of run {run}" in agent.stderr()
        assert other_run.poll() is None  # another run's processes are not ours
    finally:
        for proc in (leftover, other_run):
            proc.kill()
            proc.wait()


def test_leftover_cleanup_spares_live_agents(run_agentd):
    first = run_agentd("--rdzv-id", "same", WORKER, "sleep")
    [old] = first.wait_ready(1)
    os.kill(first.pid, signal.SIGSTOP)  # a frozen agent still counts as alive
    second = run_agentd("--rdzv-id", "same", WORKER, "ok")
    assert second.wait() == 0
    assert pid_alive(old)  # a live agent's workers are never touched
    os.kill(first.pid, signal.SIGCONT)
