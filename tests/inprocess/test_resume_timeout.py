"""A rank that kept its process through an in-process restart and hangs before its first
heartbeat of the attempt is caught by the resume timeout, not the initial one (600 s),
with a real agent and processes (no torch). The learned rule (never under 30 s) is
unit-tested in tests/heartbeats/; here the flag sets it, so the test stays short.

``bench/bench_chaos.py --stragglers --inprocess`` seed 5 (2026-12-04): a worker was
stopped as the kept ranks resumed; its peers waited for it in ``init_process_group``,
held to the initial timeout like new processes, and the job stood still until a node's
join or leave ended the round (once, past the bench's 216 s)."""

from __future__ import annotations

import importlib
import json

from tests.conftest import TESTS, wait_until

JOB = str(TESTS / "workers" / "inprocess_steps.py")


def test_a_resumed_rank_that_never_heartbeats_is_held_to_the_resume_timeout(
    run_agentd, tmp_path, monkeypatch
):
    out = tmp_path / "job"
    out.mkdir()
    agent = run_agentd(
        *("--standalone", "--nproc-per-node", "2", "--max-restarts", "1"),
        *("--resume-heartbeat-timeout", "2", "--heartbeat-timeout", "30"),
        *(JOB, str(out), "--hang-on-resume"),
    )
    wait_until(lambda: (out / "resumed_0").exists(), 60, what="rank 0 resumed in process")
    kept = json.loads((out / "resumed_0").read_text())["pid"]
    assert kept == json.loads((out / "step5_0_0").read_text())["pid"]
    # the hang is the second failure: with no restart left the agent ends, well before 600 s
    assert agent.wait(60) == 1, agent.stderr()[-3000:]
    err = agent.stderr()
    assert "hang: rank 0 stopped first (sent no heartbeat since it resumed in process" in err
    assert "within their timeout (resume 2.00s explicit)" in err
    # its process registered its dump signal in attempt 0, and still answers it
    assert "in process; timeout 2.00s explicit); it was at train (" in err
    # bench/bench_chaos.py counts the hangs of resumed ranks from this line
    monkeypatch.syspath_prepend(str(TESTS.parent / "bench"))
    chaos = importlib.import_module("bench_chaos")
    assert chaos.HANG.findall(err) == ["sent no heartbeat since it resumed in process"]
