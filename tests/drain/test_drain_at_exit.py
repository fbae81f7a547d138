"""A drain still waiting for checkpoints when the job ends (its workers succeed first, as
at the end of a job whose slow node's swap began late): the job succeeded, and every
agent exits 0, its drain ended without a traceback. The agent that drained leaves the
round and closes its store under its drain (the race a chaos run lost is checked in
``tests/rendezvous/test_dynamic.py::test_the_services_of_an_agent_that_left_find_its_store_closed``)."""

from __future__ import annotations

import signal
import textwrap

from tests.conftest import free_port, wait_until
from tests.helpers.jobs import STEADY, TOKEN, agent_args

NEVER_SAVES = textwrap.dedent(
    """\
    import os, sys, time
    import agentd

    out, stop = sys.argv[1], sys.argv[2]
    step = 0
    while not os.path.exists(stop):  # never calls agentd.checkpoint_saved()
        agentd.heartbeat()
        step += 1
        if step == 5:
            open(os.path.join(out, f"stepping{os.environ['RANK']}"), "w").close()
        time.sleep(0.01)
    """
)


def test_a_drain_open_when_the_workers_succeed_ends_in_a_line(run_agentd, tmp_path):
    script, stop = tmp_path / "never_saves.py", tmp_path / "stop"
    script.write_text(NEVER_SAVES)
    port = free_port()
    rdzv = agent_args(f"127.0.0.1:{port},127.0.0.2:{port}", "2", conf=STEADY)
    job = ("--drain-on", "SIGUSR1", str(script), str(tmp_path), str(stop))
    host = run_agentd(*rdzv, *job, env={"AGENTD_STORE_TOKEN": TOKEN})
    wait_until(lambda: "store candidate" in host.stderr(), 30, what="the store")
    other = run_agentd(*rdzv, *job, env={"AGENTD_STORE_TOKEN": TOKEN})
    # both ranks: a drain that comes while this node's workers start has none to drain,
    # and stops at once (CI: the other node's rank stepped as this node's was spawned)
    stepping = [tmp_path / f"stepping{rank}" for rank in (0, 1)]
    wait_until(lambda: all(p.exists() for p in stepping), 60, what="both ranks' steps")
    host.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: "every rank checkpoints at step" in host.stderr(), 30, what="a step")
    stop.touch()  # the job's workers succeed while the drain waits for their checkpoint
    for agent in (host, other):
        code, err = agent.wait(60), agent.stderr()
        assert "Traceback" not in err and "Could not stop" not in err, err[-3000:]
        assert code == 0, err[-3000:]  # the job succeeded
