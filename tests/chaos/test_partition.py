"""A network partition of one agent, in network namespaces on a bridge this test creates.

Before: a partitioned agent's workers ran on as a duplicate rank for 56 s, 26 s after the
partition healed: its heartbeat was renewed without ending its round, and its long poll
sat on a dead TCP connection. Now its workers are stopped within the heartbeat TTL + 1 s
of the cut, before anyone else holds their ranks, and it rejoins soon after the heal.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.chaos.conftest import require_root
from tests.chaos.netns import Bridge
from tests.conftest import pid_alive, wait_until
from tests.jobs import TOKEN, agent_args, latest_attempt, member_job, members, one_round

TTL = 2.0
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"


@pytest.fixture
def bridge():
    require_root("network namespaces")
    net = Bridge(subnet=os.getpid() % 200 + 20)
    try:
        yield net
    finally:
        net.close()


def test_a_partitioned_agent_stops_its_workers_in_time_and_rejoins(
    run_agentd, run_store, tmp_path, bridge
):
    store = run_store(host=bridge.address)  # off loopback: the token is required
    stop = tmp_path / "stop"
    agents = []
    for host in ("h0", "h1", "h2"):
        address = bridge.add_host(host)
        agents.append(run_agentd(
            *agent_args(store.endpoint, "2:3", "--local-addr", address, conf=FAST),
            *member_job(stop), env={"AGENTD_STORE_TOKEN": TOKEN}, prefix=tuple(bridge.run_in(host)),
        ))  # fmt: skip
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    victim_index, victim = next((i, a) for i, a in enumerate(agents)
                                if members(a, 0)[0]["RANK"] == "0")  # fmt: skip
    [worker] = [int(m["PID"]) for m in members(victim, 0)]
    others = [a for a in agents if a is not victim]
    before = {a.pid: latest_attempt(a) for a in agents}
    bridge.cut(f"h{victim_index}")
    cut = time.time()
    wait_until(lambda: not pid_alive(worker), timeout=10, what="the cut-off agent's worker")
    died = time.time()
    assert died - cut <= TTL + 1.0, f"its worker lived {died - cut:.2f}s after the cut"
    wait_until(lambda: one_round(others, 2, after=before), timeout=30, what="a job of two")
    successors = [m for a in others for m in members(a, latest_attempt(a))]
    assert min(float(m["STARTED"]) for m in successors) > died  # rank 0 was never held twice
    shrunk = {a.pid: latest_attempt(a) for a in agents}
    bridge.heal(f"h{victim_index}")
    healed = time.time()
    wait_until(lambda: one_round(agents, 3, after=shrunk), timeout=30,
               what="the healed agent to rejoin")  # fmt: skip
    assert time.time() - healed < 15, "the healed agent took too long to rejoin"
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]
