"""etcd losing quorum mid-job: the agents wait it out and the job finishes (issue 23)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_until
from tests.helpers.etcd_server import EtcdCluster, require_etcd
from tests.helpers.jobs import latest_attempt, member_job, one_round
from tests.integration.test_etcd import etcd_args


@pytest.fixture(autouse=True)
def _needs_etcd() -> None:
    require_etcd()


def test_the_job_survives_etcd_losing_quorum_for_20s(run_agentd, tmp_path):
    """Issue 23: the leader dies, then a second member (no quorum for 20 s), then both come
    back. etcd's first answers after the outage ("context deadline exceeded", "leader
    changed", ...) are transient: the agents wait them out and the job ends at world 3."""
    with EtcdCluster(tmp_path / "cluster", size=3) as cluster:
        leader = cluster.leader()
        order = [leader] + [i for i in range(3) if i != leader]
        endpoints = ",".join(cluster.members[i].endpoint for i in order)
        stop = tmp_path / "stop"
        conf = "keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60"
        agents = [
            run_agentd(*etcd_args(endpoints, "2:3", conf=conf), *member_job(stop)) for _ in range(3)
        ]
        wait_until(lambda: one_round(agents, 3), what="a job of three", timeout=40)
        before = {a.pid: latest_attempt(a) for a in agents}
        cluster.kill(leader)
        dead = cluster.members[leader].url
        for agent in agents:  # each has moved to a surviving member
            wait_until(
                lambda a=agent: f"etcd member {dead} failed" in a.stderr(),
                what="every agent to fail over",
            )
        second = order[1]
        cluster.kill(second)
        lost_quorum = time.monotonic()
        for agent in agents:  # the leases lapse: the workers stop, the agents wait for etcd
            wait_until(
                lambda a=agent: "no longer a member" in a.stderr(),
                timeout=30,
                what="every agent to lose its membership",
            )
        # The outage itself, as the operator saw it: 20 s without quorum.
        time.sleep(max(0.0, lost_quorum + 20 - time.monotonic()))
        assert all(a.proc.poll() is None for a in agents), [a.stderr()[-2000:] for a in agents]
        cluster.restart(leader, second)
        wait_until(lambda: one_round(agents, 3, before), what="a job of three again", timeout=60)
        stop.touch()
        codes = [a.wait(40) for a in agents]
        assert codes == [0, 0, 0], [a.stderr()[-3000:] for a in agents]
        assert all("Traceback" not in a.stderr() for a in agents)
