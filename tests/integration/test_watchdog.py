"""The watchdog end to end: real agents, real workers, the real named pipe."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import WORKER, pid_alive


def result_json(agent) -> dict:
    [path] = agent.log_dir.glob("*/result.json")
    return json.loads(path.read_text())


def test_hung_worker_is_reaped_and_the_group_restarts(run_agentd, torch_worker):
    agent = run_agentd(
        "--file-timer",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *torch_worker,
        "timer-hang",
        "--until-attempt",
        "1",
    )
    assert agent.wait(timeout=60) == 0, agent.stderr()
    assert agent.stdout().count("finished in time on restart 1") == 2
    err = agent.stderr()
    assert "expired: sent SIGKILL to its process group" in err
    assert re.search(r"Timer '[^']+' of rank \d, local rank \d \(pid \d+\) expired", err), err
    # one line names who failed, how, and what is done about it
    assert re.search(
        r"Rank \d \(pid \d+ on \S+\) failed with signal SIGKILL: timer expired: .*; "
        r"restarting the group \(restart 1 of 1\)",
        err,
    ), err
    assert result_json(agent)["restarts"] == 1
    assert pid_alive(agent.pid) is False  # exited normally, was never killed


def test_reaped_without_restarts_reports_the_timer(run_agentd):
    agent = run_agentd("--file-timer", WORKER, "timer-hang", "--until-attempt", "9")
    assert agent.wait(timeout=60) == 1
    root = result_json(agent)["root_cause"]
    assert root["message"].startswith("timer expired: scope '")
    assert "worker.py#" in root["message"] and root["signal"] == "SIGKILL"
    assert "message   : timer expired" in agent.stderr()


def test_torch_file_timer_client_works_unchanged(run_agentd, torch_worker):
    """Issue 48's job: torch's own client, its first request sent before anything else."""
    agent = run_agentd(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *torch_worker,
        "torch-timer-hang",
        "--until-attempt",
        "1",
        env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"},
    )
    assert agent.wait(timeout=120) == 0, agent.stderr()
    assert agent.stdout().count("torch timer ok on restart 1") == 2
    assert "expired: sent SIGKILL" in agent.stderr()


@pytest.mark.foreign_requests
def test_foreign_pid_is_never_signalled(run_agentd):
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        agent = run_agentd("--file-timer", WORKER, "timer-foreign", "--code", str(bystander.pid))
        assert agent.wait(timeout=60) == 0, agent.stderr()
        assert "foreign request sent" in agent.stdout()
        assert bystander.poll() is None
        assert f"pid {bystander.pid} is not one of our workers" in agent.stderr()
    finally:
        bystander.kill()
        bystander.wait()


def test_garbage_on_the_pipe_does_not_stop_a_valid_timer(run_agentd):
    agent = run_agentd(
        "--file-timer", "--max-restarts", "1", WORKER, "timer-garbage", "--until-attempt", "1"
    )
    assert agent.wait(timeout=60) == 0, agent.stderr()
    assert "survived garbage on restart 1" in agent.stdout()
    err = agent.stderr()
    assert "Timer request dropped (invalid" in err and "oversized" in err


def test_dump_signal_then_kill(run_agentd):
    agent = run_agentd(
        "--file-timer",
        "--timer-dump-signal",
        "SIGUSR1",
        "--timer-dump-grace",
        "0.3",
        WORKER,
        "timer-dump",
    )
    assert agent.wait(timeout=60) == 1
    err = agent.stderr()
    assert "sent SIGUSR1, killing in 0.3s" in err
    assert "in main" in err  # faulthandler's stack dump of the hung worker
    assert result_json(agent)["root_cause"]["signal"] == "SIGKILL"


def test_existing_file_at_timer_path_refused_exit_3(run_agentd, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    agent = run_agentd("--file-timer", "--timer-file", str(precious), WORKER, "ok")
    assert agent.wait() == 3
    assert "refusing to use or delete it" in agent.stderr()
    assert precious.read_text() == "keep me"


def test_an_agent_sweeps_the_pipe_dirs_dead_agents_left(run_agentd, tmp_path):
    """The sweep runs once the agent's first workers run: a dead agent's pipe directory
    goes, the agent's own works and is removed at its exit as always."""
    import os

    gone = subprocess.Popen(["true"])
    gone.wait()
    temp = tmp_path / "temp"
    stale = temp / f"agentd-timer-{gone.pid}.12345-abc"
    stale.mkdir(parents=True)
    os.mkfifo(stale / "timer.fifo")
    agent = run_agentd("--file-timer", WORKER, "ok", env={"TMPDIR": str(temp)})
    assert agent.wait(timeout=60) == 0, agent.stderr()
    assert not stale.exists()
    assert list(temp.iterdir()) == []  # its own pipe directory went at exit
