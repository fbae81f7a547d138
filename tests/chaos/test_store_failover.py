"""The store's host is lost and the job goes on: candidate stores (``--rdzv-endpoint
a,b,...``) on loopback addresses of this machine (127.0.0.2, 127.0.0.3 bind like hosts).

Before: the agent serving the store was a single point of failure: SIGKILL it and every
other agent lost the job (exit 3 after the join timeout), as torchrun's do.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from tests.conftest import TESTS, free_port, pid_alive, wait_until
from tests.helpers.jobs import TOKEN, agent_args, latest_attempt, member_job, members, one_round

FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"
TTL = 2.0
ENV = {"AGENTD_STORE_TOKEN": TOKEN}


def candidates(count: int) -> tuple[str, list[str]]:
    port = free_port()
    endpoints = [f"127.0.0.{i + 1}:{port}" for i in range(count)]
    return ",".join(endpoints), endpoints


def status(agent) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.health}/status", timeout=5) as response:
        return json.load(response)


def start_job(run_agentd, tmp_path, endpoint_list, count=3, nnodes="2:3", conf=FAST, **kw):
    stop = tmp_path / "stop"
    agents = []
    for index in range(count):  # one at a time: the first takes candidate 0, the next 1
        health = free_port()
        agent = run_agentd(
            *agent_args(endpoint_list, nnodes, conf=conf, **kw),
            "--health-port",
            str(health),
            *member_job(stop),
            env=ENV,
        )
        agent.health = health
        agents.append(agent)
        if index < 2:
            wait_until(
                lambda a=agent: "Standing as store candidate" in a.stderr(),
                what="the agent to stand as a candidate",
            )
    return agents, stop


def serving_agent(agents):
    for agent in agents:
        if "now serving" in agent.stderr():
            return agent
    raise AssertionError("no agent serves the store")


def test_the_job_survives_a_sigkill_of_the_store_host(run_agentd, tmp_path):
    endpoint_list, endpoints = candidates(2)
    agents, stop = start_job(run_agentd, tmp_path, endpoint_list)
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    host = serving_agent(agents)
    assert host is agents[0]  # the lowest-index candidate serves
    first_generation = status(agents[1])["generation"]
    [worker] = [int(m["PID"]) for m in members(host, latest_attempt(host))]
    survivors = [a for a in agents if a is not host]
    before = {a.pid: latest_attempt(a) for a in survivors}
    host.proc.kill()
    host.proc.wait()
    killed = time.monotonic()
    wait_until(lambda: one_round(survivors, 2, after=before), timeout=30, what="a job of two")
    assert time.monotonic() - killed <= TTL + 2.0 + 1.0  # the target, plus this test's polling
    wait_until(lambda: not pid_alive(worker), timeout=10, what="the lost host's worker")
    failover = [a for a in survivors if "Store failover" in a.stderr()]
    assert failover, [a.stderr()[-2000:] for a in survivors]
    assert all("now using " + endpoints[1] in a.stderr() for a in survivors)
    for agent in survivors:  # each restarted its workers once
        assert latest_attempt(agent) == before[agent.pid] + 1
    generations = {status(a)["generation"] for a in survivors}
    assert len(generations) == 1 and generations.pop() > first_generation  # never backwards
    shown = status(survivors[0])["store"]
    assert shown["serving"] == endpoints[1]
    assert endpoints[0] in shown["failed"]
    stop.touch()
    assert [a.wait(30) for a in survivors] == [0, 0], [a.stderr()[-2000:] for a in survivors]


def test_both_candidates_lost_is_a_clear_exit_3_naming_them(run_agentd, tmp_path):
    endpoint_list, endpoints = candidates(2)
    conf = FAST.replace("join_timeout=60", "join_timeout=8")
    agents, _ = start_job(run_agentd, tmp_path, endpoint_list, conf=conf)
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    for agent in agents[:2]:
        agent.proc.kill()
        agent.proc.wait()
    last = agents[2]
    assert last.wait(60) == 3, last.stderr()[-3000:]
    text = last.stderr()
    assert "no store candidate serves" in text
    assert all(endpoint in text for endpoint in endpoints)


def test_a_frozen_store_host_is_replaced_and_steps_down_when_it_resumes(run_agentd, tmp_path):
    endpoint_list, endpoints = candidates(2)
    agents, stop = start_job(run_agentd, tmp_path, endpoint_list)
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    frozen = agents[0]
    others = agents[1:]
    before = {a.pid: latest_attempt(a) for a in others}
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: one_round(others, 2, after=before),
            timeout=40,
            what="the others to go on at two",
        )
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait_until(
        lambda: "stepping down" in frozen.stderr(),
        timeout=30,
        what="the resumed store to step down",
    )
    # the resumed agent joins the job on the new server: one round of three again
    wait_until(lambda: one_round(agents, 3, after=before), timeout=60, what="a job of three")
    assert status(frozen)["store"]["serving"] == endpoints[1]
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]


def test_lists_in_another_order_are_refused_with_a_clear_error(run_agentd, tmp_path):
    endpoint_list, endpoints = candidates(2)
    _, stop = start_job(run_agentd, tmp_path, endpoint_list, count=2, nnodes="3")
    other = run_agentd(
        *agent_args(",".join(reversed(endpoints)), "3", conf=FAST + ",is_host=0"),
        *member_job(stop),
        env=ENV,
    )
    assert other.wait(60) == 2, other.stderr()[-2000:]
    assert "another list (or order) than this client's" in other.stderr()


def test_standalone_store_candidates_take_over(run_agentd, run_store, tmp_path):
    port = free_port()
    endpoints = [f"127.0.0.{i + 1}:{port}" for i in range(2)]
    stores = [
        run_store(host=f"127.0.0.{i + 1}", port=port, peers=",".join(endpoints)) for i in range(2)
    ]
    stop = tmp_path / "stop"
    agents = [
        run_agentd(
            *agent_args(",".join(endpoints), "2", conf=FAST + ",is_host=0"),
            *member_job(stop),
            env=ENV,
        )
        for _ in range(2)
    ]
    wait_until(lambda: one_round(agents, 2), what="a job of two")
    before = {a.pid: latest_attempt(a) for a in agents}
    stores[0].proc.kill()
    stores[0].proc.wait()
    wait_until(lambda: one_round(agents, 2, after=before), timeout=30, what="a new round")
    assert "now serving (candidate 1 of 2, term 2)" in stores[1].err.read_text()
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]


@pytest.mark.torch
def test_examples_train_survives_a_kill_of_the_store_host(run_agentd, tmp_path):
    pytest.importorskip("torch")
    endpoint_list, endpoints = candidates(2)
    train = str(TESTS.parent / "examples" / "train.py")
    agents = []
    for index in range(3):
        agents.append(
            run_agentd(
                *agent_args(endpoint_list, "2:3", "--max-restarts", "3", conf=FAST),
                train,
                "--steps",
                "1000",  # long enough to be killed mid-run, then trained again at world 2
                env={**ENV, "OMP_NUM_THREADS": "1"},
            )
        )
        if index < 2:
            wait_until(
                lambda a=agents[-1]: "Standing as store candidate" in a.stderr(),
                what="the agent to stand as a candidate",
            )
    wait_until(
        lambda: any("(world 3," in a.stdout() for a in agents),
        timeout=120,
        what="training at world 3",
    )
    agents[0].proc.kill()
    agents[0].proc.wait()
    survivors = agents[1:]
    assert [a.wait(180) for a in survivors] == [0, 0], [a.stderr()[-3000:] for a in survivors]
    out = "".join(a.stdout() for a in survivors)
    assert "(world 2," in out
    assert "learned weight [2.0, -3.0]" in out
    assert all("now using " + endpoints[1] in a.stderr() for a in survivors)
