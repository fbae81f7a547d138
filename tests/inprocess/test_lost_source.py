"""A kept rank lost after its node told the round it kept it must not hand its state over:
the ranks agree among themselves which of them holds the job's state.

Before: a node's join record said it kept ranks 0 and 1; rank 0 was then killed while
the round waited for the other node; the agent started a new process in its place, and
every rank still took it for the rank that hands the state over (the lowest kept rank).
The new process's step 0 and initial weights went to every rank, and the job trained
again from its start (``bench/bench_chaos.py --inprocess``, seeds 9 and 10: 53 and 82
steps trained again). Skipped where torch is not installed."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from tests.conftest import TESTS, AgentProc, wait_until
from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

JOB = str(TESTS / "workers" / "torch_inprocess.py")
STEPS = 12
CRASH = 5


def first_pids(agent: AgentProc) -> list[int]:
    """The pids of the agent's attempt 0, by local rank (its log's "Started" line)."""
    found = re.search(r"Started \d+ worker\(s\), attempt 0, pids \[([\d, ]+)\]", agent.stderr())
    assert found, agent.stderr()[-2000:]
    return [int(pid) for pid in found.group(1).split(",")]


@pytest.mark.timeout(300)
def test_a_kept_rank_lost_while_its_round_forms_hands_nothing_over(run_agentd, run_store, tmp_path):
    from tests.inprocess.test_torch_job import uninterrupted_weights

    store = run_store()
    out = tmp_path / "shared"
    out.mkdir()

    def agent(backoff: str) -> AgentProc:
        args = agent_args(
            store.endpoint,
            "2",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--restart-backoff",
            backoff,
            conf=STEADY_MEMBER,
        )
        env = {"AGENTD_STORE_TOKEN": TOKEN}
        return run_agentd(*args, JOB, str(out), str(STEPS), str(CRASH), env=env)

    first = agent("0")  # node 0 (it joins first): ranks 0 and 1, back at once
    wait_until(lambda: "joined round 0 as node 0" in first.stderr(), 60, "node 0")
    late = agent("6")  # node 1: rank 2 crashes; back 6 s later, the others waiting for it
    wait_until(lambda: "joined round 1 as node 0" in first.stderr(), 120, "node 0's rejoin")
    assert "Restarting worker group" not in late.stderr()  # still within its backoff
    os.kill(first_pids(first)[0], signal.SIGKILL)  # kept, announced, then lost: rank 0
    agents = [first, late]
    assert [a.wait(120) for a in agents] == [0, 0], [a.stderr()[-3000:] for a in agents]
    reports = {}
    for path in out.glob("rank*.json"):
        report = json.loads(path.read_text())
        reports[report["rank"]] = report
    assert sorted(reports) == [0, 1, 2, 3]
    assert reports[0]["restart"] == 0 and reports[1]["restart"] == 1  # new, and kept
    # every rank resumed where the kept ranks were, not at the new rank 0's step 0
    assert {r["resumed"] for r in reports.values()} == {CRASH}
    expected = uninterrupted_weights()
    for rank, report in reports.items():
        assert report["weights"] == pytest.approx(expected, abs=1e-5), rank
