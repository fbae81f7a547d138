"""The store's host killed and started again at once, with a new node arriving: the new
store is empty, and the two used to seal a round in it while a member of the old round
still ran its worker (rank given twice; seed 162 of ``bench/simulate.py --failover
--kinds ...,restart``). The host now keeps its last round on disk, and the first round
of its new store waits until that round's workers cannot run
(agentd/rendezvous/host_memory.py).
"""

from __future__ import annotations

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


def test_a_restarted_store_host_seals_no_round_beside_the_old_rounds_workers(run_agentd, tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    stop = tmp_path / "stop"
    host_logs = tmp_path / "host_logs"  # the host's own folder, kept across its restart
    env = {"AGENTD_STORE_TOKEN": TOKEN}

    def host():
        args = agent_args(endpoint, "2:2", "--log-dir", str(host_logs), conf=SLOW)
        return run_agentd(*args, *member_job(stop), env=env, log_dir=False)

    def other():
        args = agent_args(endpoint, "2:2", conf=SLOW + ",is_host=0,standby=0")
        return run_agentd(*args, *member_job(stop), env=env)

    first = host()
    wait_until(lambda: "Hosting the rendezvous store" in first.stderr(), what="the host")
    member = other()
    wait_until(lambda: one_round([first, member], 2), what="a job of two")
    [worker] = [int(m["PID"]) for m in members(member, latest_attempt(member))]

    # the member cannot notice (frozen): its worker runs on until its guardian's kill
    os.kill(member.pid, signal.SIGSTOP)
    try:
        first.proc.kill()
        first.proc.wait()
        back, new = host(), other()
        wait_until(lambda: not pid_alive(worker), timeout=15, what="the frozen member's worker")
        died = time.time()
        wait_until(lambda: one_round([back, new], 2), timeout=30, what="the new round")
    finally:
        os.kill(member.pid, signal.SIGCONT)
    started = [float(m["STARTED"]) for a in (back, new) for m in members(a, latest_attempt(a))]
    assert min(started) > died, "a rank of the new round started beside the old worker"
    assert "this host served the store until it restarted" in back.stderr()
    stop.touch()
    assert [a.wait(30) for a in (back, new)] == [0, 0], [a.stderr()[-2000:] for a in (back, new)]
    # a job closed for good leaves no record to fence a later run with
    assert list(host_logs.glob("*/store_round_*.json")) == []


def test_a_job_stopped_whole_leaves_no_record_to_hold_its_next_start(run_agentd, tmp_path):
    """SIGTERM to every agent at once (Ctrl-C in the terminal that started them): no lease
    of the host's store is left, so a start of the job again must not wait for one.
    Before, the host's record stayed, and a job started within a lease waited the whole
    fence at its first round."""
    endpoint = f"127.0.0.1:{free_port()}"
    stop = tmp_path / "stop"
    host_logs = tmp_path / "host_logs"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    host = run_agentd(
        *agent_args(endpoint, "2:2", "--log-dir", str(host_logs), conf=FAST),
        *member_job(stop),
        env=env,
        log_dir=False,
    )
    wait_until(lambda: "Hosting the rendezvous store" in host.stderr(), what="the host")
    member = run_agentd(*agent_args(endpoint, "2:2"), *member_job(stop), env=env)
    wait_until(lambda: one_round([host, member], 2), what="a job of two")
    assert list(host_logs.glob("*/store_round_*.json")), "the host keeps no record"
    for agent in (host, member):
        agent.proc.send_signal(signal.SIGTERM)
    for agent in (host, member):
        agent.wait(30)
    # none that holds a lease's fence: the host found the other gone (deleted), or, where
    # the other's leave lost the race to its hand-over, one that holds 3 s at most
    for record in host_logs.glob("*/store_round_*.json"):
        until = json.loads(record.read_text())["until"]
        assert until <= time.monotonic(), host.stderr()[-2000:]
