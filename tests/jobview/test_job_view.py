"""The job at a glance with real agents (issue 50): three nodes on 127.0.0.1-3, one of
them computing twice as long; ``agentd status --job`` asked of one agent lists the three
nodes with their hosts and ranks, the slow one as the outlier."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import TESTS, free_port, wait_until
from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args

TRAIN = str(TESTS / "drain" / "train_steps.py")


def status_job(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentd", "status", "--job", url, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def three_nodes(run_agentd, run_store, tmp_path) -> tuple[list, str, Path]:
    """Three agents on 127.0.0.1-3 with two workers each, the third computing twice as
    long; the first serves its health endpoint. Their agents, its URL, the stop file."""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN, "TEST_AGENTD_COMPUTE": "0.02"}
    # a 10 s lease: FAST's 2 s lapsed on a loaded CI (2026-12-02), failing the 3:3 job
    rdzv = agent_args(store.endpoint, "3:3", conf=STEADY_MEMBER)
    agents = [
        run_agentd(
            *rdzv,
            *("--local-addr", f"127.0.0.{i + 1}", "--nproc-per-node", "2"),
            *(("--health-port", "0") if i == 0 else ()),
            *("--straggler-interval", "0.5", TRAIN, str(out), str(stop)),
            env={**env, **({"TEST_AGENTD_SLOW": "2"} if i == 2 else {})},
        )
        for i in range(3)
    ]
    found = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agents[0].stderr()),
        30,
        what="the health endpoint",
    )
    return agents, found.group(1), stop


def stop_all(agents: list, stop: Path) -> None:
    stop.touch()
    for agent in agents:
        assert agent.wait(30) == 0, agent.stderr()[-3000:]


def test_status_job_lists_every_node_and_marks_the_slow_one(run_agentd, run_store, tmp_path):
    agents, url, stop = three_nodes(run_agentd, run_store, tmp_path)

    def view() -> dict:
        answer = status_job(url, "--json")
        assert answer.returncode == 0, answer.stderr
        return json.loads(answer.stdout)

    def settled() -> dict | None:
        doc = view()
        rows = doc["nodes"]
        # a node's steps are its slowest rank's: 0 until that one has stepped, while the
        # other's step time already gives the node a ratio (CI: a row with 0 steps)
        timed = all(r["state"] == "HEALTHY" and r["ratio"] is not None and r["steps"] for r in rows)
        return doc if len(rows) == 3 and timed and max(r["ratio"] for r in rows) >= 1.5 else None

    doc = wait_until(settled, 60, what="three nodes, stepping and timed, one slow")
    rows = doc["nodes"]
    assert (doc["size"], doc["min_nodes"], doc["max_nodes"], doc["world_size"]) == (3, 3, 3, 6)
    assert sorted(r["host"] for r in rows) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert sorted(rank for r in rows for rank in r["ranks"]) == list(range(6))
    assert all(len(r["ranks"]) == 2 and r["steps"] > 0 for r in rows)
    slowest = max(rows, key=lambda r: r["ratio"])
    assert slowest["host"] == "127.0.0.3", rows
    assert all(r["ratio"] < 1.5 for r in rows if r is not slowest), rows

    table = status_job(url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"run job  round {doc['generation']}  world size 6  nodes 3 (3:3)")
    [marked] = [line for line in lines if re.search(r"\d! ", line)]
    assert "127.0.0.3" in marked
    stop_all(agents, stop)


def test_a_drain_that_is_over_is_not_shown_on_the_nodes_that_followed_it(
    run_agentd, run_store, tmp_path
):
    """The third node is drained; the other two follow the drain, and re-form without it.
    Their rows say no drain then: it was over. (They said ``draining: POST /drain`` for as
    long as they ran, as though they were the ones leaving.)"""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    agents = [
        run_agentd(
            *agent_args(store.endpoint, "2:3", conf=STEADY_MEMBER),
            *("--local-addr", f"127.0.0.{i + 1}", "--health-port", "0"),
            *(TRAIN, str(out), str(stop)),
            env={"AGENTD_STORE_TOKEN": TOKEN},
        )
        for i in range(3)
    ]
    urls = [
        wait_until(
            lambda a=agent: re.search(r"Health endpoint on (http://\S+)", a.stderr()), 30
        ).group(1)
        for agent in agents
    ]

    def rows() -> list[dict]:
        answer = status_job(urls[0], "--json")
        assert answer.returncode == 0, answer.stderr
        return json.loads(answer.stdout)["nodes"]

    wait_until(lambda: len(rows()) == 3, 60, what="three nodes")
    drain = [sys.executable, "-m", "agentd", "drain", "--url", urls[2]]
    assert subprocess.run(drain, capture_output=True, timeout=30).returncode == 0
    assert agents[2].wait(60) == 0, agents[2].stderr()[-3000:]

    def running_again() -> list[dict] | None:
        found = rows()
        return found if len(found) == 2 and all(r["steps"] for r in found) else None

    after = wait_until(running_again, 60, what="two nodes, running again")
    assert [r["drain"] for r in after] == [None, None], after
    stop_all(agents[:2], stop)


def test_a_static_job_shows_every_node_from_any_of_them(run_agentd, tmp_path):
    """torchrun's default backend, two nodes on 127.0.0.1-2: asked of node 1, ``agentd
    status --job`` lists both nodes, their hosts, ranks and steps, read from node 0's store.
    It listed node 1 alone, and node 0 as UNKNOWN, without a host (a static job kept no
    records)."""
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    port = str(free_port())
    agents = [
        run_agentd(
            *("--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", str(2 - i)),
            *(
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--local-addr",
                f"127.0.0.{i + 1}",
            ),
            *(("--health-port", "0") if i == 1 else ()),
            *(TRAIN, str(out), str(stop)),
        )
        for i in range(2)
    ]
    found = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agents[1].stderr()), 30
    )

    def settled() -> dict | None:
        answer = status_job(found.group(1), "--json")
        assert answer.returncode == 0, answer.stderr
        doc = json.loads(answer.stdout)
        rows = doc["nodes"]
        ready = len(rows) == 2 and all(r["state"] == "HEALTHY" and r["steps"] for r in rows)
        return doc if ready else None

    doc = wait_until(settled, 60, what="both nodes, stepping")
    assert (doc["size"], doc["min_nodes"], doc["max_nodes"], doc["world_size"]) == (2, 2, 2, 3)
    assert doc["store"] == {"where": f"127.0.0.1:{port}"}
    rows = {r["group_rank"]: r for r in doc["nodes"]}
    assert {g: (r["host"], r["ranks"]) for g, r in rows.items()} == {
        0: ("127.0.0.1", [0, 1]),
        1: ("127.0.0.2", [2]),
    }
    stop_all(agents, stop)
