"""A kept process its agent calls stale (its node sat a round out as a spare) stays stale
until it holds the job's state again, across a round that re-forms before its sync:
``worker.run`` against an agent's end of the channel, in this process.

``bench/bench_chaos.py --place tls --inprocess --stragglers`` seed 23 (2026-12-04): the
spare's kept workers were told they were stale in round 3, which re-formed 0.1 s later
as the next node came in, before they synced; round 4's plan did not say it again, they
counted as holders of their round-1 state, and the job went on from step 111, 130 steps
behind the furthest."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agentd.inprocess import holders, wire, worker


@pytest.fixture
def agent_end(monkeypatch):
    """The agent's end of a channel whose worker end this process's ``run`` opens."""
    agent, mine = socket.socketpair()
    monkeypatch.setenv(wire.CHANNEL_FD_ENV, str(mine.detach()))
    monkeypatch.setattr(worker, "_channel", None)
    monkeypatch.setattr(worker, "_current", worker.Restart())
    monkeypatch.setattr(worker, "_stale", False)
    yield agent
    agent.close()  # the worker's reader thread sees the end, and ends
    if worker._channel is not None:
        worker._channel._sock.close()


def test_a_stale_process_stays_stale_until_it_holds_the_state_again(agent_end, monkeypatch):
    seen: list[bool] = []
    parked = threading.Event()

    def agent() -> None:
        lines = agent_end.makefile("rb")
        assert wire.decode(lines.readline(), wire.WORKER_OPS)["op"] == "hello"
        for env in ({wire.STALE_ENV: "1"}, {wire.STALE_ENV: ""}):  # round 3, then round 4
            while len(seen) < 1 + (env[wire.STALE_ENV] == ""):
                time.sleep(0.01)
            agent_end.sendall(wire.encode("park"))
            assert wire.decode(lines.readline(), wire.WORKER_OPS)["op"] == "parked"
            parked.set()
            agent_end.sendall(wire.encode("resume", env=env))

    def train() -> str:
        seen.append(worker.stale())
        if len(seen) == 3:
            return "done"
        while True:  # training, until the agent parks it
            time.sleep(0.01)

    monkeypatch.setenv(wire.STALE_ENV, "")
    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    assert worker.run(train) == "done"
    thread.join(10)
    assert seen == [False, True, True]  # round 4 did not say so: still stale
    holders.hold(True)  # a sync of round 4 gave it the job's state
    assert not worker.stale()
