"""Failures end to end: the root cause reported, restarts, non-retryable codes, crash loops."""

from __future__ import annotations

import json

from tests.conftest import WORKER, processes_of_agent
from tests.helpers.jobs import result_json


def test_a_crash_loop_keeps_its_log_dir_bounded(run_agentd, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = run_agentd(
        "--rdzv-id",
        "loop",
        "--max-restarts",
        "12",
        "--keep-attempts",
        "3",
        "--event-log",
        str(events),
        WORKER,
        "crash",
        "--code",
        "5",
    )
    assert agent.wait(60) == 1
    run = agent.log_dir / "loop"
    assert sorted(p.name for p in run.glob("attempt_*")) == [
        "attempt_0",
        "attempt_10",
        "attempt_11",
        "attempt_12",
    ]
    assert json.loads((run / "result.json").read_text())["restarts"] == 12
    assert len([ln for ln in events.read_text().splitlines() if '"restart"' in ln]) == 12


def test_failure_report_names_root_cause(run_agentd):
    agent = run_agentd(
        "--nproc-per-node", "2", WORKER, "crash", "--rank", "1", "--code", "7", "--after", "0.2"
    )
    assert agent.wait() == 1
    err = agent.stderr()
    assert "worker.py FAILED" in err
    assert "rank      : 1 (local rank 1" in err
    assert "exit code : 7" in err
    assert "rank 1 crashing with 7" in err  # the stderr tail, for lack of an error file
    doc = result_json(agent)
    assert doc["state"] == "FAILED"
    assert doc["root_cause"]["rank"] == 1 and doc["root_cause"]["exitcode"] == 7
    assert len(doc["failures"]) == 1  # rank 0 was stopped by us, not failed


def test_record_error_file_in_report(run_agentd, torch_worker):
    agent = run_agentd(
        "--nproc-per-node", "1", *torch_worker, "record", "--message", "disk on fire"
    )
    assert agent.wait() == 1
    err = agent.stderr()
    assert "message   : ValueError: disk on fire" in err
    assert "error file:" in err
    assert result_json(agent)["root_cause"]["message"] == "ValueError: disk on fire"


def test_death_by_signal_is_named(run_agentd):
    agent = run_agentd(WORKER, "signal-self")
    assert agent.wait() == 1
    assert "exit code : -9 (SIGKILL)" in agent.stderr()
    assert result_json(agent)["root_cause"]["signal"] == "SIGKILL"


def test_restarts_until_success(run_agentd):
    agent = run_agentd(
        "--nproc-per-node", "2", "--max-restarts", "3", WORKER, "flaky", "--until-attempt", "2"
    )
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout().count("succeeded on restart 2") == 2
    doc = result_json(agent)
    assert (doc["restarts"], doc["attempts"]) == (2, 3)
    assert len(list(agent.log_dir.glob("*/attempt_*"))) == 3


def test_non_retryable_exit_code_fails_at_once(run_agentd):
    agent = run_agentd(
        "--max-restarts",
        "5",
        "--non-retryable-exit-codes",
        "3,4",
        WORKER,
        "flaky",
        "--code",
        "4",
        "--until-attempt",
        "9",
    )
    assert agent.wait() == 1
    assert "non-retryable" in agent.stderr()
    assert result_json(agent)["restarts"] == 0


def test_crash_seen_while_grandchild_holds_the_pipe(run_agentd):
    agent = run_agentd("--stop-timeout", "5", WORKER, "crash-holding-pipe", "--code", "5")
    assert agent.wait() == 1
    assert "exit code : 5" in agent.stderr()
    assert processes_of_agent(agent.pid) == []
