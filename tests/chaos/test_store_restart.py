"""A store that is killed and comes back empty (5 s and 33 s later: the second outage
outlasts the 30 s for which a store request is retried): every live agent meets in one new
round, with N:N and MIN:MAX alike.

Before, one agent rejoined round 0 of the fresh store while the others still believed in
round 0 of the old one; a later round end moved the generation 0 -> 1 under the rejoined
agent's unsealed round, and it exited 3 after the join timeout ("? node(s) joined").
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import pid_alive, wait_until
from tests.helpers.jobs import TOKEN, agent_args, latest_attempt, member_job, members, one_round

FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=90"


@pytest.mark.parametrize("outage", [5, 33])
def test_every_agent_meets_in_one_round_after_the_store_comes_back(
    run_agentd, run_store, tmp_path, outage
):
    jobs = {}
    for nnodes in ("3", "2:3"):  # both jobs at once, each on its own store
        store = run_store()
        stop = tmp_path / f"stop-{nnodes.replace(':', '-')}"
        agents = [
            run_agentd(
                *agent_args(store.endpoint, nnodes, conf=FAST + ",is_host=0"),
                *member_job(stop),
                env={"AGENTD_STORE_TOKEN": TOKEN},
            )
            for _ in range(3)
        ]
        jobs[nnodes] = (store, stop, agents)
    for _, _, agents in jobs.values():
        wait_until(lambda a=agents: one_round(a, 3), what="a job of three")
    before = {a.pid: latest_attempt(a) for _, _, agents in jobs.values() for a in agents}
    for store, _, _ in jobs.values():
        store.proc.kill()  # everything it knew is lost
        store.proc.wait()
    time.sleep(outage)  # the outage is the scenario: nothing to wait for but the clock
    for nnodes, (store, stop, agents) in jobs.items():
        jobs[nnodes] = (run_store(port=store.port), stop, agents)
    for nnodes, (_, _, agents) in jobs.items():
        wait_until(
            lambda a=agents: one_round(a, 3, after=before),
            timeout=60,
            what=f"--nnodes {nnodes}: one new round of three "
            f"({[a.stderr()[-1500:] for a in agents]})",
        )
    for _, stop, _ in jobs.values():
        stop.touch()
    for _, _, agents in jobs.values():
        assert [a.wait(60) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]


# a lease of 4 s: a frozen member's worker lives ~4.5 s after its last heartbeat, long
# after new nodes have met in the restarted store
SLOW = "keep_alive_interval=1,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"


def test_new_nodes_at_a_store_started_again_wait_for_the_leases_it_granted(
    run_agentd, run_store, tmp_path
):
    """A ``2:2`` job on ``agentd store``; both members are frozen (SIGSTOP: they cannot
    notice anything, and their workers run on until their guardians' kills), the store is
    SIGKILLed and started again on its port, and two new nodes reach it first. They knew
    no round to fence, and sealed one at once beside the old workers (seeds 3096 and 7280
    of ``bench/simulate.py``). The store now tells them that its previous self held leases
    moments ago, and their round starts after the old workers are gone."""
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}

    def agent():
        args = agent_args(store.endpoint, "2", conf=SLOW + ",is_host=0,standby=0")
        return run_agentd(*args, *member_job(stop), env=env)

    old = [agent(), agent()]
    wait_until(lambda: one_round(old, 2), what="a job of two")
    workers = [int(m["PID"]) for a in old for m in members(a, latest_attempt(a))]
    for a in old:
        os.kill(a.pid, signal.SIGSTOP)
    try:
        store.proc.kill()
        store.proc.wait()
        run_store(port=store.port)
        new = [agent(), agent()]
        for pid in workers:
            wait_until(lambda p=pid: not pid_alive(p), timeout=20, what="the old workers' end")
        died = time.time()
        wait_until(lambda: one_round(new, 2), timeout=30, what="the new nodes' round")
    finally:
        for a in old:
            os.kill(a.pid, signal.SIGKILL)
    started = [float(m["STARTED"]) for a in new for m in members(a, latest_attempt(a))]
    assert min(started) > died, "a rank of the new round started beside an old worker"
    said = "".join(a.stderr() for a in new)
    assert "the store says it restarted, forgetting leases it held" in said, said[-3000:]
    stop.touch()
    assert [a.wait(30) for a in new] == [0, 0], [a.stderr()[-2000:] for a in new]
