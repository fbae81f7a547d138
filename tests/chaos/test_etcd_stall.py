"""An etcd member that stalls (SIGSTOP: a disk that stalls, a paused VM): it takes
connections and answers nothing, while the other members hold quorum."""

from __future__ import annotations

import time

from tests.conftest import wait_until
from tests.helpers.etcd_server import EtcdCluster, require_etcd
from tests.helpers.jobs import FAST, latest_attempt, member_job, one_round
from tests.integration.test_etcd import etcd_args


def test_a_stalled_etcd_member_costs_no_restart_and_hides_no_round(run_agentd, tmp_path):
    """The member every agent talks to stalls. Its agents' requests waited for
    ``read_timeout`` (10 s), past their lease (a TTL of 6 s): every agent lost its
    membership and the job restarted. With other members to move to, a request now waits
    a third of the TTL, as on agentd's own store with candidates: the job goes on in its
    round. A node that joins during the stall was not seen by the others, whose watches
    sat on the stalled member for their minute; now a watch moves with the client, and the
    three form a round within seconds."""
    require_etcd()
    conf = FAST.replace("keep_alive_max_attempt=4", "keep_alive_max_attempt=12")  # TTL 6 s
    with EtcdCluster(tmp_path / "cluster", size=3) as cluster:
        stop = tmp_path / "stop"
        flags = etcd_args(cluster.endpoints, "2:3", conf=conf)
        agents = [run_agentd(*flags, *member_job(stop)) for _ in "ab"]
        wait_until(lambda: one_round(agents, 2), what="a job of two")
        before = [latest_attempt(a) for a in agents]
        stalled = cluster.members[0]
        with cluster.stalled(0):
            for agent in agents:
                wait_until(
                    lambda a=agent: f"etcd member {stalled.url} failed" in a.stderr(),
                    what="the agents to move on",
                )
            time.sleep(6.0)  # the TTL: the stall is the scenario
            assert [latest_attempt(a) for a in agents] == before, [
                a.stderr()[-2000:] for a in agents
            ]
            agents.append(run_agentd(*flags, *member_job(stop)))
            wait_until(lambda: one_round(agents, 3), timeout=30, what="a job of three")
        stop.touch()
        assert [a.wait(40) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]
