"""``/status`` lists the recent restarts, and ``agentd status`` says what caused each."""

from __future__ import annotations

from agentd.group import WorkerFailure
from agentd.health.history import KEEP, RestartHistory
from agentd.health.status_cli import render


def status_doc(restarts: list[dict]) -> dict:
    return {
        "run_id": "job",
        "role": "default",
        "state": "HEALTHY",
        "host": "node1",
        "agent_pid": 1,
        "node_rank": 0,
        "group_world_size": 2,
        "world_size": 4,
        "generation": 2,
        "restart_count": 1,
        "max_restarts": 3,
        "started_at": 0.0,
        "watchdog": {"alive": True},
        "workers": [],
        "recent_restarts": restarts,
    }


def test_each_restart_keeps_its_root_cause_and_a_membership_change_none():
    history = RestartHistory()
    history.worker_failed(WorkerFailure(1, 4242, 3, global_rank=3, host="node1"))
    history.worker_failed(WorkerFailure(0, 4241, -9, global_rank=2, host="node1"))  # after it
    history.restarted("failure", 1)
    history.restarted("membership", 1)
    first, second = history.document()
    assert first["reason"] == "failure" and first["restart_count"] == 1
    assert first["cause"] == "rank 3 (pid 4242 on node1) failed with exit code 3"
    assert second["reason"] == "membership" and second["cause"] is None


def test_only_the_last_restarts_are_kept():
    history = RestartHistory()
    for count in range(KEEP + 5):
        history.restarted("unhealthy", count)
    kept = history.document()
    assert len(kept) == KEEP and kept[-1]["restart_count"] == KEEP + 4


def test_status_says_what_caused_each_recent_restart():
    history = RestartHistory()
    history.worker_failed(WorkerFailure(1, 4242, 3, global_rank=3, host="node1"))
    history.restarted("failure", 1)
    history.restarted("membership", 1)
    text = render(status_doc(history.document()))
    assert "recent restarts:" in text
    assert "restart 1: rank 3 (pid 4242 on node1) failed with exit code 3" in text
    assert "re-formed for a membership change (no restart spent)" in text
