"""Several real ``agentd`` processes form one job on 127.0.0.1 through the rendezvous store."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.conftest import (
    DEADLINE,
    TESTS,
    WORKER,
    AgentProc,
    StoreProc,
    free_port,
    lose_host,
    processes_of_agent,
    wait_until,
)
from tests.helpers.jobs import (
    ALL_AT_ONCE,
    STEADY,
    STEADY_MEMBER,
    TOKEN,
    agent_args,
    latest_attempt,
    member_job,
    members,
    one_round,
    one_works_on,
    world_sizes,
)


def test_two_agents_form_one_job_with_torch_env(run_agentd, tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"  # the first agent to bind it serves the store
    stop = tmp_path / "stop"
    agents = [
        run_agentd(
            *agent_args(endpoint, "2", "--nproc-per-node", "2", conf=STEADY), *member_job(stop)
        )
        for _ in range(2)
    ]
    for agent in agents:
        wait_until(lambda a=agent: len(members(a, 0)) == 2, what="workers to report")
    places = [m for agent in agents for m in members(agent, 0)]
    assert sorted(int(m["RANK"]) for m in places) == [0, 1, 2, 3]
    assert {m["WORLD_SIZE"] for m in places} == {"4"} and {
        m["GROUP_WORLD_SIZE"] for m in places
    } == {"2"}
    assert len({(m["MASTER_ADDR"], m["MASTER_PORT"]) for m in places}) == 1
    assert {m["MASTER_ADDR"] for m in places} == {"127.0.0.1"}
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
    hosts = [a for a in agents if "Hosting the rendezvous store" in a.stderr()]
    assert len(hosts) == 1


@pytest.mark.torch
def test_gloo_all_reduce_across_two_agents(run_agentd):
    pytest.importorskip("torch")
    endpoint = f"127.0.0.1:{free_port()}"
    script = str(TESTS / "workers" / "torch_gloo.py")
    agents = [
        run_agentd(*agent_args(endpoint, "2", "--nproc-per-node", "2", conf=STEADY), script)
        for _ in range(2)
    ]
    assert [a.wait(180) for a in agents] == [0, 0], [a.stderr()[-3000:] for a in agents]
    out = "".join(a.stdout() for a in agents)
    for rank in range(4):  # 1 + 2 + 3 + 4
        assert f"rank {rank}/4 all_reduce=10" in out


@pytest.mark.torch
def test_init_process_group_with_8_ranks_across_2_agents_meets_in_the_agents_store(run_agentd):
    pytest.importorskip("torch")
    endpoint = f"127.0.0.1:{free_port()}"
    script = str(TESTS / "workers" / "torch_store.py")
    agents = [
        run_agentd(*agent_args(endpoint, "2", "--nproc-per-node", "4", conf=STEADY), script, "late")
        for _ in range(2)
    ]
    assert [a.wait(180) for a in agents] == [0, 0], [a.stderr()[-3000:] for a in agents]
    out = "".join(a.stdout() for a in agents)
    assert out.count("all_reduce=36") == 8  # 1 + 2 + ... + 8
    assert out.count("used the store after rank 0 left") == 7
    servers = [a for a in agents if "Serving the workers' store" in a.stderr()]
    assert len(servers) == 1, "group rank 0's agent alone serves the store"


@pytest.mark.torch
def test_a_restarted_attempt_meets_in_a_new_store_and_the_old_one_is_gone(run_agentd):
    pytest.importorskip("torch")
    endpoint = f"127.0.0.1:{free_port()}"
    script = str(TESTS / "workers" / "torch_store.py")
    agents = [
        run_agentd(
            *agent_args(endpoint, "2", "--nproc-per-node", "2", "--max-restarts", "1", conf=STEADY),
            script,
            "restart",
        )
        for _ in range(2)
    ]
    assert [a.wait(180) for a in agents] == [0, 0], [a.stderr()[-3000:] for a in agents]
    out = "".join(a.stdout() for a in agents)
    assert out.count("the old store is gone") == 4, out


@pytest.mark.parametrize("nnodes", ["2:3", "2:4"])
def test_a_third_agent_joins_a_running_job(run_agentd, run_store, tmp_path, nnodes):
    """Below MAX (``2:4``) the third node's place is not the round's last one: it waited
    for its own last call (60 s here) before it learned it came after the seal."""
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    conf = STEADY_MEMBER  # a lease lapsed under load re-forms the round once more
    first = [
        run_agentd(*agent_args(store.endpoint, nnodes, conf=conf), *member_job(stop), env=env)
        for _ in range(2)
    ]
    for agent in first:
        wait_until(lambda a=agent: world_sizes(a, 0) == {2}, what="a job of two")
    late = conf.replace("last_call_timeout=0.5", "last_call_timeout=60")
    third_args = agent_args(store.endpoint, nnodes, conf=late)
    third = run_agentd(*third_args, *member_job(stop), env=env)
    wait_until(lambda: world_sizes(third, 0) == {3}, what="the third agent to be admitted")
    for agent in first:  # scale-up restarted them without spending a restart
        wait_until(lambda a=agent: world_sizes(a, 1) == {3}, what="the first two to restart")
        assert {m["TORCHELASTIC_RESTART_COUNT"] for m in members(agent, 1)} == {"0"}
    stop.touch()
    assert [a.wait(30) for a in (*first, third)] == [0, 0, 0]


def serves(address: tuple[str, int]) -> bool:
    """Whether a server accepts connections at ``address``."""
    try:
        socket.create_connection(address, timeout=5).close()
    except OSError:
        return False
    return True


def test_a_round_over_while_a_node_waits_for_its_zygote_starts_none_of_its_workers(
    run_agentd, run_store, tmp_path
):
    """Node B's zygote preloads a module that takes until the test lets it go; meanwhile a
    third node joins and round 0 ends. B starts no worker for the round that is over: it
    joins the next, and its first workers run in the job of three. Before, it started
    them in round 0 and stopped them at once (in-process restarts then waited 10 s for
    ranks that had not reached their training function: the chaos bench's seed 20).

    B, group rank 0, serves round 0's workers' store from the round's start, while its
    zygote preloads, and closes it as the round ends. Before, it opened it once its
    zygote was ready: A's workers were refused, and torch's client retries that in native
    code, where an in-process park cannot reach it (a rank resumed in process then waits
    out the park timeout, stuck in ``init_process_group``)."""
    store = run_store()
    stop = tmp_path / "stop"
    gate = tmp_path / "gate"
    site = tmp_path / "site"
    site.mkdir()
    (site / "slow_preload.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.02)\n"
    )
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    flags = agent_args(store.endpoint, "2:3", conf=STEADY_MEMBER)
    slow_env = {**env, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    slow = run_agentd(*flags, "--preload", "slow_preload", *member_job(stop), env=slow_env)
    wait_until(lambda: "joined round 0 as node 0" in slow.stderr(), what="B first in round 0")
    first = run_agentd(*flags, *member_job(stop), env=env)
    wait_until(lambda: world_sizes(first, 0) == {2}, what="node A's workers of round 0")
    [place, *_] = members(first, 0)
    workers_store = (place["MASTER_ADDR"], int(place["MASTER_PORT"]))
    assert "group_rank=0/2" in slow.stderr(), slow.stderr()[-3000:]
    assert serves(workers_store), slow.stderr()[-3000:]  # while B's zygote preloads
    third = run_agentd(*flags, *member_job(stop), env=env)
    wait_until(lambda: "generation 0 ended" in first.stderr(), what="round 0 to end")
    wait_until(lambda: not serves(workers_store), what="B to close round 0's workers' store")
    gate.touch()
    for agent in (first, slow, third):
        wait_until(lambda a=agent: world_sizes(a, latest_attempt(a)) == {3}, what="three")
    stop.touch()
    assert [a.wait(30) for a in (first, slow, third)] == [0, 0, 0]
    assert world_sizes(slow, 0) == {3}, slow.stderr()[-3000:]  # none started for round 0
    assert "Rendezvous round over before the workers started" in slow.stderr()


def test_a_job_without_a_run_id_at_a_store_that_outlived_the_last_one_says_why_it_ends(
    run_agentd, run_store
):
    """Without ``--rdzv-id`` every job is torchrun's run ``none``: at a store that outlives
    its jobs, the next one finds that run closed and ends at once (as under torchrun),
    saying why and what to give."""
    store = run_store()
    args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", store.endpoint, "--nnodes", "1"]
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    first = run_agentd(*args, WORKER, "ok", env=env)
    assert first.wait() == 0, first.stderr()
    assert first.stdout() == "hello from rank 0\n"
    second = run_agentd(*args, WORKER, "ok", env=env)
    assert second.wait() == 0, second.stderr()
    assert second.stdout() == "" and list(second.out_dir.glob("pid_*")) == []  # none ran
    assert "rendezvous 'none' is closed: the job succeeded" in second.stderr()
    assert "needs each job to have an --rdzv-id of its own" in second.stderr()


def test_a_second_job_at_the_same_endpoint_waits_as_a_spare_and_says_why(run_agentd):
    """Two one-node jobs at one endpoint without ``--rdzv-id`` are one run to the store,
    as under torchrun: the second waits beside the first, and says what to give."""
    args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    first = run_agentd(*args, "--nnodes", "1", WORKER, "sleep")
    first.wait_ready(1)
    second = run_agentd(*args, "--nnodes", "1", WORKER, "ok")
    said = wait_until(
        lambda: "round 0 is full; waiting for the next" in second.stderr() and second.stderr(),
        what="the second job to wait",
    )
    assert "the run id is torchrun's default: if another job runs at this endpoint" in said
    for agent in (second, first):
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 143


def test_a_sigkilled_agent_leaves_a_smaller_job(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    agents = [
        run_agentd(*agent_args(store.endpoint, "2:3"), *member_job(stop), env=env) for _ in range(3)
    ]
    # one slow to start arrives after a round of two: then the three meet in the next
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    before = {a.pid: latest_attempt(a) for a in agents}
    victim = agents.pop()
    workers = processes_of_agent(victim.pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait()
    # its heartbeat expires: the others re-form without it
    wait_until(lambda: one_round(agents, 2, after=before), what="a job of two")
    wait_until(
        lambda: not any(p in processes_of_agent(victim.pid) for p in workers),
        what="the killed agent's workers to be gone",
    )
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]


def test_a_worker_crash_on_one_node_restarts_every_node(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = member_job(stop, "--crash-group", "1", "--after", "0.3", "--until-attempt", "1")
    agents = [
        run_agentd(
            *agent_args(store.endpoint, "2", "--max-restarts", "1", conf=STEADY_MEMBER),
            *job,
            env=env,
        )
        for _ in range(2)
    ]
    for agent in agents:
        wait_until(lambda a=agent: len(members(a, 1)) == 1, what="every node to restart")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]
    logs = "".join(a.stderr() for a in agents)
    assert "Rendezvous round over (generation 0 ended)" in logs  # the healthy node followed
    assert "restart 1 of 1" in logs  # the failed node spent its restart


def test_a_node_failing_for_good_ends_the_job_everywhere(run_agentd, run_store, tmp_path):
    store = run_store()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = member_job(tmp_path / "never", "--crash-group", "0", "--code", "7")
    agents = [
        run_agentd(*agent_args(store.endpoint, "2", conf=STEADY_MEMBER), *job, env=env)
        for _ in range(2)
    ]
    codes = [a.wait(30) for a in agents]
    assert codes == [1, 1], [a.stderr()[-2000:] for a in agents]
    logs = "".join(a.stderr() for a in agents)
    assert "is closed: node" in logs and "failed with exit code 7" in logs


def test_a_local_addr_that_is_not_ours_is_a_clear_error(run_agentd, run_store):
    store = run_store()
    agent = run_agentd(
        *agent_args(store.endpoint, "1"),
        "--local-addr",
        "192.0.2.1",
        WORKER,
        "ok",
        env={"AGENTD_STORE_TOKEN": TOKEN},
    )
    assert agent.wait(30) == 3
    assert "--local-addr: '192.0.2.1' is not an address of this host" in agent.stderr()


def test_a_wrong_store_token_is_refused(run_agentd, run_store):
    store = run_store()
    agent = run_agentd(
        *agent_args(store.endpoint, "2"), WORKER, "ok", env={"AGENTD_STORE_TOKEN": "wrong"}
    )
    assert agent.wait(30) == 3
    assert "refused our token" in agent.stderr()


async def disconnected(port: int) -> None:
    """Wait until this process holds no TCP connection to ``port``.

    aiohttp closes a connection whose request body the server refused mid-send (the 413)
    but does not wait for it: the socket still has bytes to flush, and ``asyncio.run()``
    could close the loop first. That socket then stayed open, and the garbage collector
    reported it as a ResourceWarning inside whichever later test it ran in."""
    me = psutil.Process()
    async with asyncio.timeout(DEADLINE):
        while any(c.raddr and c.raddr.port == port for c in me.net_connections("tcp")):
            await asyncio.sleep(0.01)


def test_bad_requests_to_the_store_leave_the_job_alone(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    health = free_port()
    rdzv = agent_args(store.endpoint, "2", conf=STEADY_MEMBER)  # a lapse fails 2:2
    agents = [
        run_agentd(*rdzv, *extra, *member_job(stop), env=env)
        for extra in ((), ("--health-port", str(health)))
    ]
    for agent in agents:
        wait_until(lambda a=agent: world_sizes(a, 0) == {2}, what="a job of two")

    async def abuse() -> list[int]:
        url = f"http://{store.endpoint}/v1"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        bodies = [
            (f"{url}/set", b"{not json"),
            (f"{url}/set", b'{"key": 5}'),
            (f"{url}/compare_set", b'{"key": "agentd/job/ctl/gen", "desired": "!!"}'),
            (f"{url}/watch", b'{"prefix": "", "after_revision": "x"}'),
            (f"{url}/set", b"x" * (8 << 20)),
        ]
        async with aiohttp.ClientSession(headers=auth) as http:
            statuses = []
            for target, body in bodies:
                async with http.post(target, data=io.BytesIO(body)) as response:
                    statuses.append(response.status)
        await disconnected(store.port)
        return statuses

    statuses = asyncio.run(abuse())
    assert all(400 <= s < 500 for s in statuses), statuses
    assert 413 in statuses

    async def scrape(path: str) -> str:
        url = f"http://127.0.0.1:{health}{path}"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            return await response.text()

    assert json.loads(asyncio.run(scrape("/status")))["rendezvous"] == "agentd"
    metrics = asyncio.run(scrape("/metrics"))  # the agent timed its store requests
    assert re.search(r'agentd_store_request_seconds_count\{op="add"\} [1-9]', metrics), metrics
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]
    assert store.proc.poll() is None


def test_a_store_restarting_mid_rendezvous_is_retried(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    first = run_agentd(*agent_args(store.endpoint, "2"), *member_job(stop), env=env)
    wait_until(lambda: "joined round 0" in first.stderr(), what="the first agent to join")
    store.proc.send_signal(signal.SIGTERM)  # everything the store knew is lost
    store.proc.wait(20)
    again = run_store(port=store.port)
    second = run_agentd(*agent_args(again.endpoint, "2"), *member_job(stop), env=env)
    for agent in (first, second):  # in some attempt: the restart may cost a round or two
        wait_until(
            lambda a=agent: {2} in (world_sizes(a, n) for n in range(20)), what="the job to form"
        )
    stop.touch()
    assert [a.wait(30) for a in (first, second)] == [0, 0]


def test_static_rendezvous_of_two_nodes(run_agentd, tmp_path):
    port = str(free_port())
    stop = tmp_path / "stop"
    stop.touch()
    agents = [
        run_agentd(
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--nproc-per-node",
            "2",
            "--master-port",
            port,
            *member_job(stop),
        )
        for rank in (0, 1)
    ]
    assert [a.wait(30) for a in agents] == [0, 0]
    assert sorted(int(m["RANK"]) for m in members(agents[1], 0)) == [2, 3]
    assert {m["MASTER_PORT"] for a in agents for m in members(a, 0)} == {port}


def test_a_node_done_first_does_not_restart_one_still_working(run_agentd, tmp_path):
    """Node 0's worker succeeds at once and its agent leaves (no exit barrier wait); node
    1's worker needs 3 s more. Its departure after success is no membership change: node
    1 runs on and succeeds, as under torch (it once restarted into a closed rendezvous)."""
    script = tmp_path / "staggered.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "time.sleep(3 if os.environ['GROUP_RANK'] == '1' else 0)\n"
        "pathlib.Path(sys.argv[1], 'done-' + os.environ['RANK']).touch()\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        run_agentd(
            *agent_args(
                endpoint, "2", "--node-rank", str(rank), "--exit-barrier-timeout", "0", conf=STEADY
            ),
            str(script),
            str(tmp_path),
        )
        for rank in (0, 1)
    ]
    assert [a.wait(60) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0", "done-1"]
    assert not any("Restarting" in a.stderr() or "without spending" in a.stderr() for a in agents)


@pytest.mark.parametrize(
    ("nnodes", "sig"),
    [("2", signal.SIGTERM), ("1:2", signal.SIGTERM), ("2", signal.SIGKILL)],
    ids=["2-SIGTERM", "1:2-SIGTERM", "2-SIGKILL"],
)
def test_a_node_stopped_in_its_exit_barrier_leaves_its_peers_workers_running(
    run_agentd, run_store, tmp_path, nnodes, sig
):
    """Node A's worker succeeded and its agent waits in the exit barrier when it is stopped
    (a spot node reclaimed, a pod deleted while rank 0 still saves the final model). Its
    leave ended the round: node B's healthy workers were stopped in the middle of their
    work, and B then waited for a round it could not form (``2``: the join timeout, exit
    3) or re-formed alone and ran its workers again from the start (``1:2``). torchrun's
    node B finishes. Now A's leave is no membership change: B's workers finish, and B
    exits 0."""
    store = run_store()
    stop = tmp_path / "stop"
    script = tmp_path / "one_works_on.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "attempt, node = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['GROUP_RANK']\n"
        "pathlib.Path(sys.argv[1], f'started-{attempt}-{node}').touch()\n"
        "if node == '1':\n"
        f"    while not pathlib.Path({str(stop)!r}).exists():\n"
        "        time.sleep(0.05)\n"
    )
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    agents = [
        run_agentd(
            *agent_args(store.endpoint, nnodes, conf=ALL_AT_ONCE),
            str(script),
            str(tmp_path),
            env=env,
        )
        for _ in range(2)
    ]
    done = wait_until(
        lambda: [a for a in agents if "waiting for those of the other 1" in a.stderr()],
        what="a node in its exit barrier",
    )[0]
    working = agents[1 - agents.index(done)]
    wait_until(lambda: (tmp_path / "started-0-1").exists(), what="the working node's worker")
    done.proc.send_signal(sig)  # SIGKILL: its guardian releases its membership
    assert done.wait(30) in (128 + sig, -sig), done.stderr()[-2000:]
    wait_until(  # its heartbeat is gone: the round would have ended by now
        lambda: "left after its workers succeeded; the round goes on" in working.stderr(),
        what="the working node to see the other leave",
    )
    stop.touch()
    assert working.wait(60) == 0, working.stderr()[-3000:]
    logs = [a.stderr()[-3000:] for a in (done, working)]
    assert not list(tmp_path.glob("started-1-*")), logs  # no second attempt
    assert "round over" not in working.stderr(), logs


def works_until(folder: Path) -> tuple[list[str], Path]:
    """A job whose worker on a node started with ``WORKS_ON`` works until the returned stop
    file exists, and exits at once (success) elsewhere; each worker touches
    ``started-<attempt>-<1 if it works on, else 0>`` in ``folder`` as it starts."""
    stop = folder / "stop"
    script = folder / "works_until.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "attempt, works_on = os.environ['TORCHELASTIC_RESTART_COUNT'], 'WORKS_ON' in os.environ\n"
        "pathlib.Path(sys.argv[1], f'started-{attempt}-{int(works_on)}').touch()\n"
        "if works_on:\n"
        f"    while not pathlib.Path({str(stop)!r}).exists():\n"
        "        time.sleep(0.05)\n"
    )
    return [str(script), str(folder)], stop


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "host-lost"])
def test_a_store_host_lost_in_its_exit_barrier_costs_its_peers_round_nothing(
    run_agentd, tmp_path, how
):
    """The store's host (the first agent at a single endpoint) waits in its exit barrier,
    its worker done, while the other node's worker works on (rank 0's final save), and is
    SIGKILLed (its guardian releases it), or its host is lost whole (agent, guardian and
    workers frozen, then killed). The store went with it: the other candidate started
    empty, the round went with the old state, and the working node's worker was stopped
    mid-work; with ``--nnodes 2`` it then waited for a round of two until the join
    timeout. Now the host hands the store, state and all, to the working node's candidate
    as it enters its barrier: its loss is that of a member whose workers succeeded, and
    the working node's worker runs on. A SIGTERM leaves at once (it kept the store up for
    the others until they closed the run, ``close_timeout`` at most)."""
    job, stop = works_until(tmp_path)
    conf = STEADY.replace("last_call_timeout=0.5", "last_call_timeout=20")
    flags = agent_args(f"127.0.0.1:{free_port()}", "2", conf=conf)
    host = run_agentd(*flags, *job)
    wait_until(lambda: "Hosting the rendezvous store" in host.stderr(), what="the store's host")
    working = run_agentd(*flags, *job, env={"WORKS_ON": "1"})
    wait_until(lambda: (tmp_path / "started-0-1").exists(), what="the working node's worker")
    wait_until(
        lambda: "handed the store it served" in host.stderr(),
        what="the host to hand the store down in its barrier",
    )
    logs = lambda: [a.stderr()[-3000:] for a in (host, working)]  # noqa: E731
    if how == "SIGTERM":
        host.proc.send_signal(signal.SIGTERM)
        assert host.wait(15) == 128 + signal.SIGTERM, logs()
        assert "keeps the store up" not in host.stderr(), logs()
    elif how == "SIGKILL":
        host.proc.kill()
    else:
        lose_host(host.pid)
    wait_until(  # the host's heartbeat is gone: with the store, the round would be too
        lambda: "left after its workers succeeded; the round goes on" in working.stderr(),
        what="the working node to see the host leave",
    )
    stop.touch()
    assert working.wait(60) == 0, logs()
    assert not list(tmp_path.glob("started-1-*")), logs()  # no second attempt
    assert "round over" not in working.stderr(), logs()


@pytest.mark.parametrize(
    ("nnodes", "twice"), [("2", False), ("1:2", False), ("2", True)], ids=["2", "1:2", "2-twice"]
)
def test_a_store_host_stopped_in_its_exit_barrier_keeps_the_store_until_its_peer_finishes(
    run_agentd, tmp_path, nnodes, twice
):
    """As above, SIGTERMed, where no node at work stands by to be handed the store (the
    working node's agent runs with ``standby=0``): the host keeps the store up until the
    working node has finished and closed the run, then leaves with SIGTERM's exit code.
    Without that, the store went as the host left, and the working node's worker was
    stopped mid-work (``2``: it then waited for a round of two until the join timeout;
    ``1:2``: it ran its worker again from the start). A second SIGTERM (``twice``) ends
    that wait at once (the host then waits, ``close_timeout`` at most, for its peer to
    leave, as a host whose store nobody can take over does)."""
    job, stop = works_until(tmp_path)
    # a last call long enough for the second agent to join round 0 on a loaded machine
    # (``1:2`` once sealed it with the host alone); the round seals as soon as both are in
    conf = STEADY.replace("last_call_timeout=0.5", "last_call_timeout=20")
    endpoint = f"127.0.0.1:{free_port()}"
    alone = agent_args(endpoint, nnodes, conf=f"{conf},standby=0")
    if twice:  # the host then waits for its peer to leave, as one whose store nobody can take
        conf += ",close_timeout=5"
    host = run_agentd(*agent_args(endpoint, nnodes, conf=conf), *job)
    wait_until(lambda: "Hosting the rendezvous store" in host.stderr(), what="the store's host")
    working = run_agentd(*alone, *job, env={"WORKS_ON": "1"})
    wait_until(lambda: "waiting for those of the other 1" in host.stderr(), what="the barrier")
    wait_until(lambda: (tmp_path / "started-0-1").exists(), what="the working node's worker")
    host.proc.send_signal(signal.SIGTERM)
    wait_until(
        lambda: "keeps the store up until the other nodes' workers are done" in host.stderr(),
        what="the host to keep the store up",
    )
    logs = lambda: [a.stderr()[-3000:] for a in (host, working)]  # noqa: E731
    if twice:
        host.proc.send_signal(signal.SIGTERM)
        assert host.wait(20) == 128 + signal.SIGTERM, logs()
        assert "this node leaves the store: a second stop request" in host.stderr(), logs()
        return
    stop.touch()
    assert working.wait(60) == 0, logs()
    assert host.wait(30) == 128 + signal.SIGTERM, logs()
    assert "this node leaves the store: the run was closed" in host.stderr(), logs()
    assert not list(tmp_path.glob("started-1-*")), logs()  # no second attempt
    assert "round over" not in working.stderr(), logs()


def test_a_peer_killed_before_its_workers_finish_ends_the_exit_barrier(run_agentd, tmp_path):
    """The store's host waits in its exit barrier; the other node is SIGKILLed while its
    worker still works. Its guardian marks it gone: nobody will write its ``done`` key,
    and nobody is at a next round, so the host leaves (exit 0, as after the barrier
    timeout) at once. It used to wait out the whole ``--exit-barrier-timeout``. (The
    working node stands by nowhere, so the store stays with the host: handed down to the
    working node, it would go with it.)"""
    job = one_works_on(tmp_path)
    conf = STEADY.replace("last_call_timeout=0.5", "last_call_timeout=20")
    endpoint = f"127.0.0.1:{free_port()}"
    flags = agent_args(endpoint, "2", "--exit-barrier-timeout", "120", conf=conf)
    host = run_agentd(*flags, *job)
    wait_until(lambda: "Hosting the rendezvous store" in host.stderr(), what="the store's host")
    alone = agent_args(endpoint, "2", "--exit-barrier-timeout", "120", conf=f"{conf},standby=0")
    working = run_agentd(*alone, *job, env={"WORKS_ON": "1"})
    wait_until(lambda: "waiting for those of the other 1" in host.stderr(), what="the barrier")
    wait_until(lambda: (tmp_path / "working").exists(), what="the working node's worker")
    working.proc.kill()
    working.wait()
    logs = lambda: host.stderr()[-3000:]  # noqa: E731
    assert host.wait(30) == 0, logs()
    said = "1 node(s) of round 0 left or were lost before their workers finished"
    assert said in host.stderr(), logs()


def test_a_barrier_ends_once_the_round_its_peer_re_formed_in_is_left_too(
    run_agentd, run_store, tmp_path
):
    """Node A's worker succeeds and its agent waits in the exit barrier; node B's worker
    fails, B re-forms alone in round 1 (``--nnodes 1:2``), and is then SIGTERMed (a
    preemption) while its new worker works. Nobody is left to finish the job: A leaves
    (exit 0, as after the barrier timeout) within seconds. It judged its own round alone,
    whose next round B had joined, and waited out the whole ``--exit-barrier-timeout``
    (simulation seeds 2967 and 5404 reached it through a store restarted empty)."""
    script = tmp_path / "b_fails_then_works.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "folder = pathlib.Path(sys.argv[1])\n"
        "if 'WORKS_ON' in os.environ:\n"
        "    if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "        while not (folder / 'fail').exists():\n"
        "            time.sleep(0.05)\n"
        "        sys.exit(3)\n"
        "    (folder / 'working').touch()\n"
        "    time.sleep(120)\n"
    )
    store = run_store()
    conf = STEADY.replace("last_call_timeout=0.5", "last_call_timeout=3") + ",is_host=0"
    flags = agent_args(store.endpoint, "1:2", "--exit-barrier-timeout", "120", conf=conf)
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    done = run_agentd(*flags, str(script), str(tmp_path), env=env)
    failing = run_agentd(
        *flags, "--max-restarts", "1", str(script), str(tmp_path), env={**env, "WORKS_ON": "1"}
    )
    wait_until(lambda: "waiting for those of the other 1" in done.stderr(), 60, what="A's barrier")
    (tmp_path / "fail").touch()
    wait_until(lambda: (tmp_path / "working").exists(), 60, what="B's worker of round 1")
    failing.proc.send_signal(signal.SIGTERM)
    assert failing.wait(30) == 128 + signal.SIGTERM, failing.stderr()[-3000:]
    assert done.wait(30) == 0, done.stderr()[-3000:]  # not at the barrier timeout (120 s)
    said = "round 0 ended, the others went on to round 1 and left it or were lost there"
    assert said in done.stderr(), done.stderr()[-3000:]


def one_in_its_barrier(
    run_agentd: Callable[..., AgentProc], store: StoreProc, tmp_path: Path
) -> tuple[AgentProc, AgentProc]:
    """Agents A and B (``--nnodes 2:2``, a 10 s lease, which outlasts a restart of the
    store on a loaded machine) on the standalone ``store``, once A's worker succeeded and
    A waits in its exit barrier while B's works."""
    flags = agent_args(store.endpoint, "2", "--exit-barrier-timeout", "120", conf=STEADY_MEMBER)
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = one_works_on(tmp_path)
    done = run_agentd(*flags, *job, env=env)
    working = run_agentd(*flags, *job, env={**env, "WORKS_ON": "1"})
    wait_until(lambda: "waiting for those of the other 1" in done.stderr(), 60, what="A's barrier")
    wait_until(lambda: (tmp_path / "working").exists(), what="B's worker")
    return done, working


def restart_empty(run_store: Callable[..., StoreProc], store: StoreProc) -> None:
    """SIGKILL the standalone ``store`` and start another on its port: everything the
    store knew is lost."""
    store.proc.kill()
    store.proc.wait(20)
    run_store(port=store.port)


def test_a_barrier_ends_once_the_peer_back_at_a_round_only_it_could_fill_is_killed(
    run_agentd, run_store, tmp_path
):
    """``--nnodes 2:2`` on a standalone store. A's worker succeeds and its agent waits in
    the exit barrier; the store restarts empty, so B's round is gone: B stops its worker
    and waits at round 1 for a second node, which only A (done) could be. B is then
    SIGKILLed there: between rounds, it left its guardian no will, and the round never
    seals. A leaves (exit 0, as after its barrier timeout) a heartbeat TTL later; it
    waited out the whole ``--exit-barrier-timeout`` before (simulation seed 4113)."""
    store = run_store()
    done, working = one_in_its_barrier(run_agentd, store, tmp_path)
    restart_empty(run_store, store)
    wait_until(lambda: "joined round 1" in working.stderr(), 60, what="B back at round 1")
    working.proc.kill()
    working.wait()
    assert done.wait(60) == 0, done.stderr()[-3000:]  # not at the barrier timeout (120 s)
    said = "round 0 ended, the others went on to round 1 and left it or were lost there"
    assert said in done.stderr(), done.stderr()[-3000:]


def test_a_barrier_counts_a_peer_lost_with_the_stores_memory_gone(run_agentd, run_store, tmp_path):
    """``--nnodes 2:2`` on a standalone store. A's worker succeeds and its agent waits in
    the exit barrier; B's host is lost whole while its worker works (nothing marks B
    gone), and the store restarts empty before B's lease lapsed there. The new store holds
    neither round 0's entries nor B's lease, and nobody comes to round 1: A counts B gone
    once B's heartbeat has been missing from the new store for a heartbeat TTL, and leaves
    (exit 0). It waited out the whole ``--exit-barrier-timeout`` before (simulation seed
    7989)."""
    store = run_store()
    done, working = one_in_its_barrier(run_agentd, store, tmp_path)
    lose_host(working.pid)
    working.wait()
    restart_empty(run_store, store)  # B's lease goes with it
    assert done.wait(60) == 0, done.stderr()[-3000:]  # not at the barrier timeout (120 s)
    said = done.stderr()
    forgot, gone = said.find("forgot round 0"), said.find("of round 0 is gone (its lease is not")
    assert 0 <= forgot < gone, said[-3000:]  # counted gone in the new store
    assert "1 node(s) of round 0 left or were lost before their workers" in said, said[-3000:]


def test_a_barrier_counts_a_member_that_never_came_back_to_a_store_that_forgot_the_round(
    run_agentd, run_store, tmp_path
):
    """``--nnodes 3:3`` on a standalone store. A's worker succeeds and its agent waits in
    the exit barrier; C's host is lost whole while its worker works, and the store
    restarts empty: no store holds anything of C. B, back at round 1, is SIGTERMed there.
    B's arrival at round 1 kept A's barrier from C's lease (a next round's first member
    counts the lapsed, which it cannot in a store that forgot them), and A waited out its
    ``--exit-barrier-timeout``. A member not back within a heartbeat TTL of the store's
    forgetting is counted lost now, and A leaves (exit 0; simulation seed 60963)."""
    store = run_store()
    flags = agent_args(store.endpoint, "3", "--exit-barrier-timeout", "120", conf=STEADY_MEMBER)
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = one_works_on(tmp_path)
    done = run_agentd(*flags, *job, env=env)
    back, lost = (run_agentd(*flags, *job, env={**env, "WORKS_ON": "1"}) for _ in range(2))
    wait_until(lambda: "waiting for those of the other 2" in done.stderr(), 60, what="A's barrier")
    wait_until(lambda: (tmp_path / "working").exists(), what="the others' workers")
    lose_host(lost.pid)
    lost.wait()
    restart_empty(run_store, store)
    wait_until(lambda: "joined round 1" in back.stderr(), 60, what="B back at round 1")
    back.proc.send_signal(signal.SIGTERM)
    back.wait()
    assert done.wait(60) == 0, done.stderr()[-3000:]  # not at the barrier timeout (120 s)
    assert "the others went on to round" in done.stderr(), done.stderr()[-3000:]


def node_args(backend: str, endpoint: str, nnodes: str, rank: int, *extra: str) -> list[str]:
    """Node ``rank``'s flags in a job of ``nnodes`` on agentd's rendezvous (``c10d``) or
    torchrun's static one, which meets at node 0's store on the endpoint's port."""
    if backend == "static":
        port = endpoint.rpartition(":")[2]
        return ["--nnodes", nnodes, "--node-rank", str(rank), "--master-port", port, *extra]
    return agent_args(endpoint, nnodes, "--node-rank", str(rank), *extra, conf=STEADY)


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_a_node_failing_for_good_ends_its_peers_exit_barrier(run_agentd, tmp_path, backend):
    """Node 0's worker succeeds at once and its agent waits in the exit barrier; node 1's
    fails for good. Its done key will never come: node 0 leaves when node 1 closes the
    rendezvous, not after the barrier's 300 s (256 agents on 2 cores, some starved out of
    their lease, kept the rest waiting for all of it; the static barrier waited all of it
    until 2026-12-01)."""
    script = tmp_path / "one_fails.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['GROUP_RANK'] == '1':\n"
        "    time.sleep(1)\n"
        "    sys.exit(7)\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [run_agentd(*node_args(backend, endpoint, "2", rank), str(script)) for rank in (0, 1)]
    codes = [a.wait(60) for a in agents]  # within a minute, not after the 300 s barrier
    assert sorted(codes) == [0, 1], [a.stderr()[-2000:] for a in agents]
    waiting = agents[codes.index(0)]  # its workers succeeded: exit 0, as under torch
    said = "another node ended the job" if backend == "static" else "closed the rendezvous"
    assert said in waiting.stderr(), waiting.stderr()[-2000:]
    assert "failed with exit code 7" in waiting.stderr()


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_a_node_failing_after_its_peers_succeeded_gives_up_instead_of_restarting(
    run_agentd, tmp_path, backend
):
    """Node 1's worker fails (in a final save, say) after node 0's succeeded. A restart
    could form no round of 2 (node 0 runs no more: it waits in its exit barrier), so node 1
    gives up at once, closing the rendezvous, which ends node 0's wait. It used to restart
    and wait for node 0, while node 0 waited for it until the barrier's 300 s."""
    go = tmp_path / "go"
    script = tmp_path / "fails_last.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "if os.environ['GROUP_RANK'] == '1':\n"
        f"    while not pathlib.Path({str(go)!r}).exists():\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(7)\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        run_agentd(*node_args(backend, endpoint, "2", rank, "--max-restarts", "3"), str(script))
        for rank in (0, 1)
    ]
    wait_until(
        lambda: any("waiting for those of the other 1 node(s)" in a.stderr() for a in agents),
        what="a node in its exit barrier",
    )
    go.touch()
    codes = [a.wait(60) for a in agents]  # within a minute, not after the 300 s barrier
    assert sorted(codes) == [0, 1], [a.stderr()[-2000:] for a in agents]
    failed, waiting = agents[codes.index(1)], agents[codes.index(0)]
    assert (
        "failed with exit code 7; not restarting: the workers of group rank(s) 0 have "
        "succeeded" in failed.stderr()
    ), failed.stderr()[-2000:]
    assert "Restarting" not in failed.stderr()
    said = "another node ended the job" if backend == "static" else "closed the rendezvous"
    assert said in waiting.stderr(), waiting.stderr()[-2000:]


def test_a_node_failing_after_one_peer_succeeded_restarts_where_a_round_can_form(
    run_agentd, tmp_path
):
    """The same failure in a job of 2:3 nodes, whose third node still works: the two that
    are left can form a round, so the failed node restarts, as before, and they finish
    the job there; node 0 leaves its exit barrier once they close the run. (Workers in a
    world of 2 wait for the failure first: a round sealed before the third node arrived
    re-forms once it does.)"""
    go = tmp_path / "go"
    script = tmp_path / "fails_last.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "world, group = os.environ['GROUP_WORLD_SIZE'], os.environ['GROUP_RANK']\n"
        "if world == '3' and group == '0':\n"
        "    sys.exit(0)\n"
        f"while not pathlib.Path({str(go)!r}).exists():\n"
        "    time.sleep(0.05)\n"
        "if world == '3' and group == '1':\n"
        "    sys.exit(7)\n"
        "if world == '3':\n"
        "    time.sleep(600)  # node 2 works on, until the round ends\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        run_agentd(*node_args("c10d", endpoint, "2:3", rank, "--max-restarts", "3"), str(script))
        for rank in (0, 1, 2)
    ]
    wait_until(
        lambda: any("waiting for those of the other 2 node(s)" in a.stderr() for a in agents),
        what="a node in its exit barrier",
    )
    go.touch()
    assert [a.wait(60) for a in agents] == [0, 0, 0], [a.stderr()[-2000:] for a in agents]
    logs = "".join(a.stderr() for a in agents)
    assert "failed with exit code 7; restarting the group (restart 1 of 3)" in logs
    assert "not restarting" not in logs
