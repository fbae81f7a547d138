"""Drains with real agents: every rank checkpoints at the same step, the job goes on
without the drained node and resumes at that step, and nobody spends a restart."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.conftest import wait_until
from tests.helpers.jobs import TOKEN, agent_args

TRAIN = str(Path(__file__).with_name("train_steps.py"))


def notes(out: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob(pattern) if p.suffix != ".tmp"]


def starts(out: Path, attempt: int) -> list[dict]:
    return notes(out, f"start_{attempt}_*")


def test_a_drain_checkpoints_every_rank_at_one_step_and_the_job_goes_on(
    run_agentd, run_store, tmp_path
):
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = ["--nproc-per-node", "2", TRAIN, str(out), str(stop)]
    stay = [run_agentd(*agent_args(store.endpoint, "2:3"), *job, env=env) for _ in range(2)]
    leaving = run_agentd(*agent_args(store.endpoint, "2:3"), "--drain-on", "SIGTERM",
                         "--event-log", str(tmp_path / "events.jsonl"), *job, env=env)  # fmt: skip
    wait_until(lambda: len(starts(out, 0)) == 6, what="a job of three nodes, six ranks")

    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.wait(60) == 128 + signal.SIGTERM, leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 6, leaving.stderr()[-3000:]
    assert len({c["step"] for c in ckpts}) == 1, ckpts  # every rank at the same step
    step = ckpts[0]["step"]
    # The others go on at world 4 from that step, without spending a restart.
    wait_until(lambda: len(starts(out, 1)) == 4, what="the job of two nodes")
    assert {s["world"] for s in starts(out, 1)} == {4}
    assert {s["resumed_at"] for s in starts(out, 1)} == {step}
    stop.touch()
    assert [a.wait(30) for a in stay] == [0, 0]
    logs = "".join(a.stderr() for a in stay)
    assert "Drain requested by node" in logs and "restart 1 of" not in logs
    assert f"Drain: every rank checkpoints at step {step}" in leaving.stderr()
    names = [
        json.loads(line)["name"] for line in (tmp_path / "events.jsonl").read_text().splitlines()
    ]
    assert "drain_requested" in names and "drain_done" in names
