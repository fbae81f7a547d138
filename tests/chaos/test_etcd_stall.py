"""An etcd member that stalls (SIGSTOP: a disk that stalls, a paused VM): it takes
connections and answers nothing, while the other members hold quorum."""

from __future__ import annotations

import time

from tests.conftest import wait_until
from tests.helpers.etcd_server import EtcdCluster, require_etcd
from tests.helpers.jobs import FAST, latest_attempt, member_job, world_sizes
from tests.integration.test_etcd import etcd_args


def test_a_stalled_etcd_member_is_left_for_another_within_the_lease(run_agentd, tmp_path):
    """The member every agent talks to stalls (SIGSTOP: a disk that stalls, a paused VM)
    for a heartbeat TTL (6 s); the other two hold quorum. The agents' requests to it waited
    for ``read_timeout`` (10 s), past their lease: every agent lost its membership and the
    job restarted. With other members to move to, a request waits a third of the TTL, as
    on agentd's own store with candidates: the job goes on in its first round."""
    require_etcd()
    conf = FAST.replace("keep_alive_max_attempt=4", "keep_alive_max_attempt=12")  # TTL 6 s
    with EtcdCluster(tmp_path / "cluster", size=3) as cluster:
        stop = tmp_path / "stop"
        flags = etcd_args(cluster.endpoints, "2", conf=conf)
        agents = [run_agentd(*flags, *member_job(stop)) for _ in "ab"]
        for agent in agents:
            wait_until(lambda a=agent: world_sizes(a, 0) == {2}, what="a job of two")
        stalled = cluster.members[0]
        with cluster.stalled(0):
            for agent in agents:
                wait_until(
                    lambda a=agent: f"etcd member {stalled.url} failed" in a.stderr(),
                    what="the agents to move on",
                )
            time.sleep(6.0)  # the TTL: the stall is the scenario
        assert [latest_attempt(a) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
        stop.touch()
        assert [a.wait(40) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
