"""SIGTERM and SIGINT end the agent in every phase, at once: waiting for peers, starting
workers (the zygote still preloading), running, stopping, and in the exit barrier. Exit
128+N, the workers gone, and the rendezvous membership given back (the peers that come
later form their round without the agent that left)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import TESTS, WORKER, pid_alive, wait_until
from tests.drain.test_drain import health_url
from tests.drain.test_integrations import stepping
from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args

SIGNALS = [signal.SIGTERM, signal.SIGINT]
PROMPT = 2.0
"""Seconds from the signal to the agent's exit (torchrun: 0.36 s waiting for peers)."""


def stopped_within(agent, sig: signal.Signals) -> float:
    """Send ``sig``; the agent's exit status must be 128+sig. Returns the seconds it took."""
    began = time.monotonic()
    agent.proc.send_signal(sig)
    assert agent.wait(timeout=30) == 128 + sig, agent.stderr()
    return time.monotonic() - began


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_waiting_for_peers(run_agentd, run_store, sig):
    store = run_store()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    waiting = run_agentd(
        *agent_args(store.endpoint, "2", conf=STEADY_MEMBER), WORKER, "ok", env=env
    )
    wait_until(lambda: "waiting for 2..2 node(s)" in waiting.stderr(), what="a wait for peers")
    assert stopped_within(waiting, sig) < PROMPT
    # Its membership was given back: two later agents form a round of their own at once
    # (with its lapsed membership counted, one would have waited for the last call).
    later = [
        run_agentd(*agent_args(store.endpoint, "2", conf=STEADY_MEMBER), WORKER, "ok", env=env)
        for _ in "ab"
    ]
    assert [a.wait(timeout=30) for a in later] == [0, 0], later[0].stderr()
    assert all("left (no heartbeat)" not in a.stderr() for a in later)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_starting_workers_while_the_zygote_preloads(run_agentd, sig):
    pytest.importorskip("torch")
    agent = run_agentd("--standalone", "--preload", "torch", WORKER, "sleep")
    wait_until(lambda: "Rendezvous complete" in agent.stderr(), what="the rendezvous")
    assert "Zygote pid" not in agent.stderr(), "the preload finished first: no test"
    assert stopped_within(agent, sig) < PROMPT
    assert not agent.worker_pids(0)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_in_the_exit_barrier(run_agentd, run_store, sig):
    store = run_store()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    quick = run_agentd(
        "--log-level",
        "debug",
        *agent_args(store.endpoint, "2", conf=STEADY_MEMBER),
        WORKER,
        "ok",
        env=env,
    )
    slow = run_agentd(
        *agent_args(store.endpoint, "2", conf=STEADY_MEMBER), WORKER, "sleep", env=env
    )
    [pid] = slow.wait_ready(1)
    wait_until(lambda: "HEALTHY -> SUCCEEDED" in quick.stderr(), what="the exit barrier")
    assert stopped_within(quick, sig) < PROMPT
    slow.proc.send_signal(signal.SIGTERM)
    assert slow.wait() == 128 + signal.SIGTERM
    wait_until(lambda: not pid_alive(pid), timeout=5, what="the slow node's worker gone")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_while_draining(run_agentd, sig):
    """Workers that heartbeat but never confirm a checkpoint keep a drain waiting for
    --drain-timeout (60 s): a stop signal ends it at once."""
    job = str(TESTS / "workers" / "heartbeat_job.py")
    agent = run_agentd(
        "--standalone",
        "--drain-on",
        "SIGUSR1",
        "--health-port",
        "0",
        job,
        "--steps",
        "3000",
        "--step",
        "0.02",
    )
    # Stepping, not just started: a drain that comes while the worker still starts finds
    # no step to coordinate, and the node leaves without a checkpoint (it did, under load).
    url = health_url(agent)
    wait_until(lambda: stepping(url), what="the worker's first heartbeat")
    agent.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: "every rank checkpoints at step" in agent.stderr(), what="the drain")
    assert stopped_within(agent, sig) < PROMPT
