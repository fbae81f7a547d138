"""Real ``agentd`` processes form jobs through real etcd clusters on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import os
import signal
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentd.store.etcd.gateway import prefix_end
from tests.conftest import TESTS, WORKER, free_port, lose_host, processes_of_agent, wait_until
from tests.helpers import jobs
from tests.helpers.etcd_server import EtcdCluster, etcd_call, make_tls, require_etcd
from tests.helpers.jobs import FAST, latest_attempt, member_job, members, one_round, world_sizes


@pytest.fixture(autouse=True)
def _needs_etcd() -> None:
    require_etcd()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory) -> Iterator[EtcdCluster]:
    """One etcd member the module's tests share; each test runs its own rdzv id."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


def etcd_args(
    endpoints: str, nnodes: str, *extra: str, conf: str = FAST, run_id: str = "job"
) -> list[str]:
    return [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        endpoints,
        "--rdzv-id",
        run_id,
        "--nnodes",
        nnodes,
        "--rdzv-conf",
        conf,
        *extra,
    ]


def run_keys(url: str, prefix: str) -> list[str]:
    """Every key etcd holds under ``prefix``."""
    body = {
        "key": _b64(prefix.encode()),
        "range_end": _b64(prefix_end(prefix.encode())),
        "keys_only": True,
    }
    doc = etcd_call(url, "/v3/kv/range", body)
    return [base64.b64decode(kv["key"]).decode() for kv in doc.get("kvs", [])]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.torch
def test_gloo_all_reduce_across_two_agents_through_etcd(run_agentd, etcd):
    pytest.importorskip("torch")
    script = str(TESTS / "workers" / "torch_gloo.py")
    run_id = f"gloo-{uuid.uuid4().hex[:8]}"
    agents = [
        run_agentd(*etcd_args(etcd.endpoints, "2", "--nproc-per-node", "2", run_id=run_id), script)
        for _ in range(2)
    ]
    assert [a.wait(180) for a in agents] == [0, 0], [a.stderr()[-3000:] for a in agents]
    out = "".join(a.stdout() for a in agents)
    for rank in range(4):  # 1 + 2 + 3 + 4
        assert f"rank {rank}/4 all_reduce=10" in out
    keys = run_keys(etcd.urls[0], f"agentd/{run_id}/")  # one prefix holds the whole run
    assert f"agentd/{run_id}/ctl/closed" in keys
    assert all(k.startswith(f"agentd/{run_id}/") for k in keys)


def test_two_runs_on_one_etcd_never_collide(run_agentd, etcd, tmp_path):
    stop = tmp_path / "stop"
    runs = [f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"]
    agents = [
        run_agentd(*etcd_args(etcd.endpoints, "1", run_id=r), *member_job(stop)) for r in runs
    ]
    for agent in agents:
        wait_until(lambda a=agent: world_sizes(a, 0) == {1}, what="two jobs of one")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]


LONG_LEASE = FAST.replace("keep_alive_max_attempt=4", "keep_alive_max_attempt=60")
"""A 30 s heartbeat lease: the others re-form well within half of it only by the release."""


@pytest.mark.parametrize("auth", [False, True])
def test_a_sigkilled_agents_guardian_releases_it_so_the_others_go_on_at_once(
    run_agentd, request, tmp_path, auth
):
    """The guardian of a SIGKILLed agent kills its workers, then carries out its will on
    etcd as on agentd's own store (the cluster's members, prefix and credentials): the
    others re-form without it at once. They waited for its lease (15 s by default) before
    2026-12-02."""
    stop = tmp_path / "stop"
    run_id = f"shrink-{uuid.uuid4().hex[:8]}"
    cluster = request.getfixturevalue("etcd_with_auth" if auth else "etcd")
    conf = LONG_LEASE + ",username=root" if auth else LONG_LEASE  # its password from the env
    env = {"AGENTD_ETCD_PASSWORD": "rootpw"} if auth else None
    flags = etcd_args(cluster.endpoints, "2:3", conf=conf, run_id=run_id)
    agents = [run_agentd(*flags, *member_job(stop), env=env) for _ in range(3)]
    # one slow to start arrives after a round of two: then the three meet in the next
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    before = {a.pid: latest_attempt(a) for a in agents}
    victim = agents.pop()
    wait_until(lambda: "Started 1 worker(s)" in victim.stderr(), what="the victim's guardian")
    workers = processes_of_agent(victim.pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait()
    wait_until(lambda: one_round(agents, 2, after=before), 15, what="a job of two within the lease")
    wait_until(lambda: "released node" in victim.stderr(), 10, what="the guardian's line")
    assert not any(p in processes_of_agent(victim.pid) for p in workers)
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]


def test_a_peer_whose_host_is_lost_before_its_workers_finish_ends_the_exit_barrier(
    run_agentd, etcd, tmp_path
):
    """Node A waits in its exit barrier (its worker is done); node B's host is lost while
    its worker works (agent, guardian and workers SIGKILLed: nothing marks B gone, its
    lease lapses and nothing else). A counts B gone once B's lease lapsed and leaves (exit
    0, as after the barrier timeout): it used to wait out the whole
    ``--exit-barrier-timeout``, and so it did after every SIGKILL on etcd, where a killed
    agent's guardian released nothing before 2026-12-02."""
    job = jobs.one_works_on(tmp_path)
    run_id = f"barrier-{uuid.uuid4().hex[:8]}"
    conf = FAST.replace("keep_alive_max_attempt=4", "keep_alive_max_attempt=8")  # a 4 s lease
    barrier = ("--exit-barrier-timeout", "120")
    flags = etcd_args(etcd.endpoints, "2", *barrier, conf=conf, run_id=run_id)
    done = run_agentd(*flags, *job)
    working = run_agentd(*flags, *job, env={"WORKS_ON": "1"})
    wait_until(lambda: "waiting for those of the other 1" in done.stderr(), what="the barrier")
    wait_until(lambda: (tmp_path / "working").exists(), what="the working node's worker")
    lose_host(working.pid)
    working.wait()
    logs = lambda: done.stderr()[-3000:]  # noqa: E731
    assert done.wait(60) == 0, logs()
    assert "of round 0 is gone (its lease is not held)" in done.stderr(), logs()
    assert "1 node(s) of round 0 left or were lost before their workers" in done.stderr(), logs()


def test_a_worker_crash_on_one_node_restarts_every_node(run_agentd, etcd, tmp_path):
    stop = tmp_path / "stop"
    run_id = f"crash-{uuid.uuid4().hex[:8]}"
    job = member_job(stop, "--crash-group", "1", "--after", "0.3", "--until-attempt", "1")
    agents = [
        run_agentd(*etcd_args(etcd.endpoints, "2", "--max-restarts", "1", run_id=run_id), *job)
        for _ in range(2)
    ]
    for agent in agents:
        wait_until(lambda a=agent: len(members(a, 1)) == 1, what="every node to restart")
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]
    assert "Rendezvous round over (generation 0 ended)" in "".join(a.stderr() for a in agents)


def test_the_job_survives_losing_the_etcd_leader(run_agentd, tmp_path):
    """A 3-member cluster loses its leader, the member every agent talks to, mid-run; the
    agents fail over, a third agent joins through the survivors, and the job completes."""
    with EtcdCluster(tmp_path / "cluster", size=3) as cluster:
        leader = cluster.leader()
        order = [leader] + [i for i in range(3) if i != leader]
        endpoints = ",".join(cluster.members[i].endpoint for i in order)
        stop = tmp_path / "stop"
        first = [run_agentd(*etcd_args(endpoints, "2:3"), *member_job(stop)) for _ in range(2)]
        for agent in first:
            wait_until(lambda a=agent: world_sizes(a, 0) == {2}, what="a job of two")
        cluster.kill(leader)
        third = run_agentd(*etcd_args(endpoints, "2:3"), *member_job(stop))
        wait_until(lambda: world_sizes(third, 0) == {3}, what="a job of three", timeout=40)
        for agent in first:  # they saw the new round through a surviving member (attempt
            # 1, or 2 where the election outlasted a 2 s lease on a loaded machine: a round
            # of two between, as in a clean CI run of 2026-12-02)
            wait_until(
                lambda a=agent: world_sizes(a, latest_attempt(a)) == {3},
                what="the first two to follow",
            )
        stop.touch()
        codes = [a.wait(40) for a in (*first, third)]
        assert codes == [0, 0, 0], [a.stderr()[-2000:] for a in (*first, third)]
        dead = cluster.members[leader].url
        assert all(f"etcd member {dead} failed" in a.stderr() for a in first)


def test_an_unreachable_etcd_is_exit_3_naming_it(run_agentd):
    endpoint = f"127.0.0.1:{free_port()}"
    agent = run_agentd(*etcd_args(endpoint, "1", conf="join_timeout=1"), WORKER, "ok")
    assert agent.wait(30) == 3
    err = agent.stderr()
    assert f"etcd at http://{endpoint} is unavailable" in err, err[-2000:]
    assert "Traceback" not in err


def test_etcd_without_quorum_is_exit_3_saying_so(run_agentd, tmp_path):
    with EtcdCluster(tmp_path / "cluster", size=3) as cluster:
        cluster.kill(1)
        cluster.kill(2)
        agent = run_agentd(
            *etcd_args(cluster.members[0].endpoint, "1", conf="join_timeout=3"), WORKER, "ok"
        )
        assert agent.wait(40) == 3
        err = agent.stderr()
        assert "no quorum" in err, err[-2000:]
        assert "Traceback" not in err


@pytest.fixture
def etcd_with_auth(tmp_path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path / "auth") as cluster:
        url = cluster.urls[0]
        etcd_call(url, "/v3/auth/role/add", {"name": "root"})
        etcd_call(url, "/v3/auth/user/add", {"name": "root", "password": "rootpw"})
        etcd_call(url, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        # A user who may read every key and write none: rendezvous is denied its writes.
        etcd_call(url, "/v3/auth/role/add", {"name": "reader"})
        everything = {"permType": "READ", "key": _b64(b"\0"), "range_end": _b64(b"\0")}
        etcd_call(url, "/v3/auth/role/grant", {"name": "reader", "perm": everything})
        etcd_call(url, "/v3/auth/user/add", {"name": "reader", "password": "readerpw"})
        etcd_call(url, "/v3/auth/user/grant", {"user": "reader", "role": "reader"})
        etcd_call(url, "/v3/auth/enable", {})
        yield cluster


def test_etcd_auth_with_a_password_from_the_environment(run_agentd, etcd_with_auth, tmp_path):
    stop = tmp_path / "stop"
    stop.touch()
    conf = FAST + ",username=root"
    agent = run_agentd(
        *etcd_args(etcd_with_auth.endpoints, "1", conf=conf),
        *member_job(stop),
        env={"AGENTD_ETCD_PASSWORD": "rootpw"},
    )
    assert agent.wait(30) == 0, agent.stderr()[-2000:]
    assert world_sizes(agent, 0) == {1}


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        (",username=root,password=wrong", "authentication failed"),
        ("", "user name is empty"),
        (",username=reader,password=readerpw", "permission denied"),
    ],
)
def test_etcd_refusing_us_is_exit_3(run_agentd, etcd_with_auth, conf, expected):
    agent = run_agentd(*etcd_args(etcd_with_auth.endpoints, "1", conf=FAST + conf), WORKER, "ok")
    assert agent.wait(30) == 3
    err = agent.stderr()
    assert f"etcd at {etcd_with_auth.urls[0]} refused" in err and expected in err, err[-2000:]
    assert "Traceback" not in err


def test_status_names_the_etcd_backend(run_agentd, etcd, tmp_path):
    stop = tmp_path / "stop"
    health = free_port()
    agent = run_agentd(
        *etcd_args(
            etcd.endpoints,
            "1",
            "--health-port",
            str(health),
            run_id=f"status-{uuid.uuid4().hex[:6]}",
        ),
        *member_job(stop),
    )
    wait_until(lambda: world_sizes(agent, 0) == {1}, what="the job")
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/status", timeout=10) as response:
        assert json.loads(response.read())["rendezvous"] == "etcd"
    stop.touch()
    assert agent.wait(30) == 0


def test_a_job_over_tls_with_client_certificates(run_agentd, tmp_path):
    tls = make_tls(tmp_path / "tls")
    with EtcdCluster(tmp_path / "cluster", tls=tls) as cluster:
        stop = tmp_path / "stop"
        stop.touch()
        conf = f"{FAST},cacert={tls.ca},cert={tls.client_cert},key={tls.client_key}"
        agents = [
            run_agentd(*etcd_args(cluster.endpoints, "2", conf=conf), *member_job(stop))
            for _ in range(2)
        ]
        assert [a.wait(30) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
        assert [world_sizes(a, 0) for a in agents] == [{2}, {2}]
        no_cert = run_agentd(
            *etcd_args(cluster.endpoints, "1", conf=f"cacert={tls.ca}"), WORKER, "ok"
        )
        assert no_cert.wait(30) == 3
        err = no_cert.stderr()
        assert f"etcd at {cluster.urls[0]}: TLS failed" in err and "BAD_CERTIFICATE" in err, err


def test_tls_paths_are_checked_before_anything_starts(run_agentd, tmp_path: Path):
    agent = run_agentd(
        *etcd_args("127.0.0.1:2379", "1", conf=f"cacert={tmp_path}/none.pem"), WORKER, "ok"
    )
    assert agent.wait(30) == 2
    assert f"--rdzv-conf: cacert='{tmp_path}/none.pem' must be a readable file" in agent.stderr()
