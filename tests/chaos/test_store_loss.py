"""The store is lost while a job runs: noticed within the heartbeat TTL, a failure meanwhile
is not lost, success is success, and result.json tells what really happened.

Before: the loss was noticed after ~30 s; a node whose worker failed meanwhile exited 3
("Could not tell the other nodes to restart"), the others exited 3 at 102 s although their
workers had succeeded, and an abnormal exit wrote result.json with state INIT and no root
cause.
"""

from __future__ import annotations

import json
import time

from tests.conftest import wait_until
from tests.helpers.jobs import TOKEN, agent_args, latest_attempt, member_job, members, one_round

FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5"
ENV = {"AGENTD_STORE_TOKEN": TOKEN}


def test_a_failure_while_the_store_is_down_restarts_everyone_when_it_returns(
    run_agentd, run_store, tmp_path
):
    store = run_store()
    stop, go = tmp_path / "stop", tmp_path / "go"
    conf = FAST + ",join_timeout=60,is_host=0"
    job = member_job(stop, "--crash-group", "1", "--go-file", str(go))
    agents = [
        run_agentd(
            *agent_args(store.endpoint, "2", "--max-restarts", "1", conf=conf), *job, env=ENV
        )
        for _ in range(2)
    ]
    wait_until(lambda: one_round(agents, 2), what="a job of two")
    before = {a.pid: latest_attempt(a) for a in agents}
    store.proc.kill()
    store.proc.wait()
    lost = time.time()
    go.touch()  # group rank 1's worker fails while nobody can be told
    healthy = next(a for a in agents if members(a, 0)[0]["GROUP_RANK"] == "0")
    wait_until(
        lambda: "no longer a member" in healthy.stderr(),
        timeout=10,
        what="the healthy node to notice",
    )
    noticed = time.time()
    assert noticed - lost <= 2.0 + 1.0  # within the heartbeat TTL (plus this test's polling)
    time.sleep(3)  # the store stays away a little longer
    run_store(port=store.port)
    wait_until(lambda: one_round(agents, 2, after=before), timeout=30, what="a new round")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
    assert healthy.stderr().count("no longer a member") == 1  # reported once
    failing = next(a for a in agents if a is not healthy)
    restarts = {
        a.pid: {m["TORCHELASTIC_RESTART_COUNT"] for m in members(a, latest_attempt(a))}
        for a in agents
    }
    assert restarts == {healthy.pid: {"0"}, failing.pid: {"1"}}  # only the failure paid


def test_workers_that_succeed_while_the_store_is_gone_exit_0(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    conf = FAST + ",join_timeout=60,is_host=0"
    agents = [
        run_agentd(*agent_args(store.endpoint, "2", conf=conf), *member_job(stop), env=ENV)
        for _ in range(2)
    ]
    wait_until(lambda: one_round(agents, 2), what="a job of two")
    store.proc.kill()
    store.proc.wait()
    stop.touch()  # the workers succeed at once: before the agents lose their leases
    assert [a.wait(30) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
    for agent in agents:
        assert "our workers succeeded, so the job is done here (exit 0)" in agent.stderr()
        result = json.loads((agent.log_dir / "job" / "result.json").read_text())
        assert (result["state"], result["outcome"], result["exit_code"]) == (
            "SUCCEEDED",
            "succeeded",
            0,
        )


def test_an_abnormal_exit_records_the_crash_it_followed(run_agentd, run_store, tmp_path):
    store = run_store()
    go = tmp_path / "go"
    conf = FAST + ",join_timeout=3,is_host=0"
    job = member_job(tmp_path / "never", "--crash-group", "0", "--go-file", str(go), "--code", "9")
    agent = run_agentd(
        *agent_args(store.endpoint, "1", "--max-restarts", "1", conf=conf), *job, env=ENV
    )
    wait_until(lambda: one_round([agent], 1), what="a job of one")
    store.proc.kill()
    store.proc.wait()
    go.touch()  # the worker crashes; the agent restarts into a store that never returns
    assert agent.wait(30) == 3, agent.stderr()[-2000:]
    assert "the store could not be reached" in agent.stderr()
    result = json.loads((agent.log_dir / "job" / "result.json").read_text())
    assert result["state"] == "FAILED" and result["exit_code"] == 3
    assert "the store could not be reached" in result["error"]
    assert result["root_cause"]["exitcode"] == 9  # the crash is not lost
