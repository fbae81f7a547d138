"""The store's host killed and started again at once, with a new node arriving: the new
store is empty, and the two used to seal a round in it while a member of the old round
still ran its worker (rank given twice; seed 162 of ``bench/simulate.py --failover
--kinds ...,restart``). The host now keeps its last round on disk, and the first round
of its new store waits until that round's workers cannot run
(agentd/rendezvous/host_memory.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from tests.conftest import free_port, pid_alive, wait_until
from tests.helpers.jobs import (
    FAST,
    TOKEN,
    agent_args,
    latest_attempt,
    member_job,
    members,
    one_round,
)

# a lease of 4 s: the frozen member's worker lives ~4.5 s after its last heartbeat, long
# after a restarted host and a new node have met in the empty store
SLOW = "keep_alive_interval=1,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"


class TwoNodeJob:
    """A ``2:2`` job on loopback with ``conf``, whose store host keeps its own
    ``--log-dir`` (``logs``, kept across its restart)."""

    def __init__(self, run_agentd, tmp_path, conf: str) -> None:
        self._run_agentd, self._conf = run_agentd, conf
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.stop = tmp_path / "stop"
        self.logs = tmp_path / "host_logs"
        self._env = {"AGENTD_STORE_TOKEN": TOKEN}

    def host(self):
        args = agent_args(self.endpoint, "2:2", "--log-dir", str(self.logs), conf=self._conf)
        return self._run_agentd(*args, *member_job(self.stop), env=self._env, log_dir=False)

    def member(self, standby: bool = True):
        conf = self._conf + ",is_host=0" + ("" if standby else ",standby=0")
        args = agent_args(self.endpoint, "2:2", conf=conf)
        return self._run_agentd(*args, *member_job(self.stop), env=self._env)

    def start(self, standby: bool = True):
        """The host, then a member, once both run as one round: (host, member)."""
        host = self.host()
        wait_until(lambda: "Hosting the rendezvous store" in host.stderr(), what="the host")
        member = self.member(standby)
        wait_until(lambda: one_round([host, member], 2), what="a job of two")
        return host, member

    def records(self) -> list:
        return list(self.logs.glob("*/store_round_*.json"))


def test_a_restarted_store_host_seals_no_round_beside_the_old_rounds_workers(run_agentd, tmp_path):
    job = TwoNodeJob(run_agentd, tmp_path, SLOW)
    first, member = job.start(standby=False)
    [worker] = [int(m["PID"]) for m in members(member, latest_attempt(member))]

    # the member cannot notice (frozen): its worker runs on until its guardian's kill
    os.kill(member.pid, signal.SIGSTOP)
    try:
        first.proc.kill()
        first.proc.wait()
        back, new = job.host(), job.member(standby=False)
        wait_until(lambda: not pid_alive(worker), timeout=15, what="the frozen member's worker")
        died = time.time()
        wait_until(lambda: one_round([back, new], 2), timeout=30, what="the new round")
    finally:
        os.kill(member.pid, signal.SIGCONT)
    started = [float(m["STARTED"]) for a in (back, new) for m in members(a, latest_attempt(a))]
    assert min(started) > died, "a rank of the new round started beside the old worker"
    assert "this host served the store until it restarted" in back.stderr()
    job.stop.touch()
    assert [a.wait(30) for a in (back, new)] == [0, 0], [a.stderr()[-2000:] for a in (back, new)]
    # a job closed for good leaves no record to fence a later run with
    assert job.records() == []


def test_a_job_stopped_whole_leaves_no_record_to_hold_its_next_start(run_agentd, tmp_path):
    """SIGTERM to every agent at once (Ctrl-C in the terminal that started them): no lease
    of the host's store is left, so a start of the job again must not wait for one.
    Before, the host's record stayed, and a job started within a lease waited the whole
    fence at its first round."""
    job = TwoNodeJob(run_agentd, tmp_path, FAST)
    host, member = job.start()
    assert job.records(), "the host keeps no record"
    for agent in (host, member):
        agent.proc.send_signal(signal.SIGTERM)
    for agent in (host, member):
        agent.wait(30)
    # none that holds a lease's fence: the host found the other gone (deleted), or, where
    # the other's leave lost the race to its hand-over, one that holds 3 s at most
    for record in job.records():
        until = json.loads(record.read_text())["until"]
        assert until <= time.monotonic(), host.stderr()[-2000:]


def test_a_one_node_jobs_host_killed_whole_starts_again_without_waiting_out_its_lease(
    run_agentd, tmp_path
):
    """A one-node job whose agent and guardian are SIGKILLed: the host started again finds
    a record of a round of its own agent alone, with no other candidate, so its first round
    waits for no lease (before: the old lease, 19.6 s with the defaults). Nothing of the old
    round runs: its worker died with its agent (a parent-death signal)."""
    import psutil

    endpoint, stop, logs = f"127.0.0.1:{free_port()}", tmp_path / "stop", tmp_path / "logs"
    args = agent_args(endpoint, "1", "--log-dir", str(logs), conf=SLOW)

    def host():
        env = {"AGENTD_STORE_TOKEN": TOKEN}
        return run_agentd(*args, *member_job(stop), env=env, log_dir=False)

    first = host()
    wait_until(lambda: latest_attempt(first) == 0, what="the first worker")
    [worker] = [int(m["PID"]) for m in members(first, 0)]
    wait_until(lambda: list(logs.glob("*/store_round_*.json")), what="the host's record")
    guardians = [
        p
        for p in psutil.Process(first.pid).children(recursive=True)
        if "guardian_process" in " ".join(p.cmdline())
    ]
    assert guardians, "the agent runs no guardian"
    for process in [psutil.Process(first.pid), *guardians]:
        # a guardian may end on its own in the moment after its agent's SIGKILL (it kills
        # the workers and exits): the host is lost whole either way
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    first.proc.wait()
    wait_until(lambda: not pid_alive(worker), timeout=15, what="the old worker's end")

    back = host()
    wait_until(lambda: latest_attempt(back) == 0, timeout=30, what="the new worker")
    said = back.stderr()
    assert "this host's agent was its only member and no other candidate" in said, said
    assert "may still run workers on its leases" not in said
    stop.touch()
    assert back.wait(30) == 0, back.stderr()[-2000:]
