"""A network partition of one agent, in network namespaces on a bridge this test creates,
on agentd's own store and on etcd.

Before: a partitioned agent's workers ran on as a duplicate rank for 56 s, 26 s after the
partition healed: its heartbeat was renewed without ending its round, and its long poll
sat on a dead TCP connection. Now its workers are stopped within the heartbeat TTL + 1 s
of the cut, before anyone else holds their ranks, and it rejoins soon after the heal.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos.conftest import require_root
from tests.chaos.netns import Bridge
from tests.conftest import AgentProc, pid_alive, wait_until
from tests.helpers.etcd_server import EtcdCluster, require_etcd
from tests.helpers.jobs import TOKEN, agent_args, latest_attempt, member_job, members, one_round
from tests.integration.test_etcd import etcd_args

TTL = 2.0
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"


@pytest.fixture
def bridge():
    require_root("network namespaces")
    net = Bridge()
    try:
        yield net
    finally:
        net.close()


def test_a_partitioned_agent_stops_its_workers_in_time_and_rejoins(
    run_agentd, run_store, tmp_path, bridge
):
    store = run_store(host=bridge.address)  # off loopback: the token is required
    stop = tmp_path / "stop"
    agents = [
        run_agentd(
            *agent_args(store.endpoint, "2:3", "--local-addr", bridge.add_host(host), conf=FAST),
            *member_job(stop),
            env={"AGENTD_STORE_TOKEN": TOKEN},
            prefix=tuple(bridge.run_in(host)),
        )
        for host in ("h0", "h1", "h2")
    ]
    cut_rank_0s_agent_off_and_heal(agents, bridge)
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]


def cut_rank_0s_agent_off_and_heal(agents: list[AgentProc], bridge: Bridge) -> None:
    """Once the three agents (on hosts h0-h2) run a job of three, cut rank 0's off: its
    worker is stopped within the TTL + 1 s, before the other two hold its rank in a job
    of two; heal it: it rejoins within 15 s."""
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    # The round of three is each agent's latest attempt: a third agent that came after the
    # first round was sealed made the other two restart once (their attempt 0 may have
    # been stopped before its worker reported).
    before = {a.pid: latest_attempt(a) for a in agents}
    victim_index, victim = next(
        (i, a) for i, a in enumerate(agents) if members(a, before[a.pid])[0]["RANK"] == "0"
    )
    [worker] = [int(m["PID"]) for m in members(victim, before[victim.pid])]
    others = [a for a in agents if a is not victim]
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
    wait_until(
        lambda: one_round(agents, 3, after=shrunk), timeout=30, what="the healed agent to rejoin"
    )
    assert time.time() - healed < 15, "the healed agent took too long to rejoin"


def test_a_partition_from_the_store_host_leaves_one_server_on_the_larger_side(
    run_agentd, tmp_path, bridge
):
    """Candidates on h0 and h1; h0 serves and is cut off. h1 takes over for h1 and h2,
    who go on at two; h0, alone, forms no round (MIN is 2) and its worker is stopped
    within the lease bound; after the heal, h0's server steps down and h0 joins the
    others."""
    addresses = [bridge.add_host(host) for host in ("h0", "h1", "h2")]
    port = 29400
    endpoints = f"{addresses[0]}:{port},{addresses[1]}:{port}"
    stop = tmp_path / "stop"
    agents = []
    for index, host in enumerate(("h0", "h1", "h2")):
        agents.append(
            run_agentd(
                *agent_args(endpoints, "2:3", "--local-addr", addresses[index], conf=FAST),
                *member_job(stop),
                env={"AGENTD_STORE_TOKEN": TOKEN},
                prefix=tuple(bridge.run_in(host)),
            )
        )
        if index == 0:
            wait_until(lambda: "now serving" in agents[0].stderr(), what="h0 to serve")
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    cut_off, others = agents[0], agents[1:]
    [worker] = [int(m["PID"]) for m in members(cut_off, latest_attempt(cut_off))]
    before = {a.pid: latest_attempt(a) for a in agents}
    bridge.cut("h0")
    wait_until(lambda: one_round(others, 2, after=before), timeout=30, what="a job of two")
    wait_until(lambda: not pid_alive(worker), timeout=10, what="the cut-off agent's worker")
    died = time.time()
    successors = [m for a in others for m in members(a, latest_attempt(a))]
    overlap = died - min(float(m["STARTED"]) for m in successors)
    assert overlap <= TTL + 1.0  # the lease invariant: a rank is never held twice for longer
    assert latest_attempt(cut_off) == before[cut_off.pid]  # no round formed on h0's side
    assert all("now using " + f"{addresses[1]}:{port}" in a.stderr() for a in others)
    shrunk = {a.pid: latest_attempt(a) for a in agents}
    bridge.heal("h0")
    wait_until(lambda: "stepping down" in cut_off.stderr(), timeout=30, what="h0 to step down")
    wait_until(lambda: one_round(agents, 3, after=shrunk), timeout=60, what="a job of three")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]


def test_a_store_host_cut_off_from_every_other_candidate_steps_down(run_agentd, tmp_path, bridge):
    """One ``--rdzv-endpoint`` (a growing list, the defaults under Slurm and Kubernetes),
    nnodes 1:3: h0 serves the store and is cut off. h1 and h2 fail over and go on at two;
    h0 hears no other candidate for 3 s and steps down, so its agent renews no lease there
    and forms no round alone, as MIN 1 would allow (before: two jobs at once, S1). Its
    worker is stopped before the others' round starts. After the heal h0 joins them."""
    conf = "keep_alive_interval=1,keep_alive_max_attempt=8,last_call_timeout=0.5,join_timeout=60"
    addresses = [bridge.add_host(host) for host in ("h0", "h1", "h2")]
    endpoint = f"{addresses[0]}:29400"
    stop = tmp_path / "stop"
    agents = []
    for index in range(3):
        agents.append(
            run_agentd(
                *agent_args(endpoint, "1:3", conf=conf),
                *member_job(stop),
                env={"AGENTD_STORE_TOKEN": TOKEN},
                prefix=tuple(bridge.run_in(f"h{index}")),
            )
        )
        if index == 0:
            wait_until(lambda: "now serving" in agents[0].stderr(), what="h0 to serve")
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    host, others = agents[0], agents[1:]
    wait_until(
        lambda: all("Standing by as store candidate" in a.stderr() for a in others),
        what="both to stand by",
    )
    [worker] = [int(m["PID"]) for m in members(host, latest_attempt(host))]
    before = {a.pid: latest_attempt(a) for a in agents}
    bridge.cut("h0")
    wait_until(
        lambda: "stepping down (cut off" in host.stderr(), timeout=30, what="h0 to step down"
    )
    wait_until(lambda: not pid_alive(worker), timeout=30, what="the cut-off host's worker")
    died = time.time()
    wait_until(lambda: one_round(others, 2, after=before), timeout=60, what="a job of two")
    successors = [m for a in others for m in members(a, latest_attempt(a))]
    assert died <= min(float(m["STARTED"]) for m in successors) + 0.5  # polling: S1
    assert latest_attempt(host) == before[host.pid]  # no round formed on h0's side
    shrunk = {a.pid: latest_attempt(a) for a in agents}
    bridge.heal("h0")
    wait_until(lambda: one_round(agents, 3, after=shrunk), timeout=60, what="a job of three")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]


def test_an_agent_cut_off_from_etcd_stops_its_workers_in_time_and_rejoins(
    run_agentd, tmp_path, bridge
):
    """The first test's partition where the agents meet through etcd (one member on the
    bridge): the lease the cut-off agent can no longer renew is etcd's, its watches are
    etcd's streams."""
    require_etcd()
    stop = tmp_path / "stop"
    with EtcdCluster(tmp_path / "etcd", host=bridge.address) as etcd:
        agents = [
            run_agentd(
                *etcd_args(etcd.endpoints, "2:3", "--local-addr", bridge.add_host(host)),
                *member_job(stop),
                prefix=tuple(bridge.run_in(host)),
            )
            for host in ("h0", "h1", "h2")
        ]
        cut_rank_0s_agent_off_and_heal(agents, bridge)
        stop.touch()
        assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]
