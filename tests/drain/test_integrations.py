"""The Lightning and Hugging Face callbacks save a checkpoint when a drain asks, on every
rank at the same step, and confirm it (real trainers, one agent); a Lightning job stopped
after it (or at any time) stops at once."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest

from agentd.exceptions import DRAINED_UNFINISHED
from tests.conftest import TESTS, installed, wait_until
from tests.drain.test_drain import drain_cli, health_url


def stepping(url: str) -> bool:
    """The workers have heartbeated: training is under way."""
    doc = json.loads(urllib.request.urlopen(url + "/status", timeout=10).read())
    return any(w["steps"] for w in doc["heartbeats"]["workers"])


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_the_lightning_callback_saves_on_a_drain(run_agentd, tmp_path):
    installed("lightning")
    root = tmp_path / "lightning"
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--health-port",
        "0",
        # the checkpoint is what this tests, not the stop after it (the test below)
        "--stop-timeout",
        "5",
        # nor how the workers start: one import of Lightning (5 CPU-seconds) for both
        "--preload",
        "lightning,torch",
        str(TESTS / "workers" / "lightning_ddp.py"),
        str(root),
        "1000",  # the drain ends it, whenever it comes
    )
    url = health_url(agent)
    wait_until(lambda: stepping(url), 180, what="training to start")
    assert drain_cli("--url", url, "--reason", "test").returncode == 0
    assert agent.wait(180) == DRAINED_UNFINISHED, agent.stderr()[-3000:]  # a standalone job
    assert (root / "drain.ckpt").stat().st_size > 0
    assert "the checkpoints of this node's 2 worker(s) are saved" in agent.stderr()


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_the_hugging_face_callback_saves_on_a_drain(run_agentd, tmp_path):
    installed("transformers", "accelerate")
    out = tmp_path / "hf"
    agent = run_agentd(
        "--standalone",
        "--health-port",
        "0",
        str(TESTS / "workers" / "hf_trainer.py"),
        str(out),
        "1000000",  # the drain ends it: 400 steps were over before the drain came (CI)
        "1000000",  # and no scheduled save: a drain at step 200 once made no checkpoint of its own
        env={"TRANSFORMERS_OFFLINE": "1"},
    )
    url = health_url(agent)
    wait_until(lambda: stepping(url), 180, what="training to start")
    assert drain_cli("--url", url).returncode == 0
    assert agent.wait(180) == DRAINED_UNFINISHED, agent.stderr()[-3000:]  # a standalone job
    saved = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    assert len(saved) == 1, saved  # the drain's: the schedule makes none
    assert "the checkpoints of this node's 1 worker(s) are saved" in agent.stderr()


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_lightning_ddp_job_stopped_while_its_ranks_are_apart_stops_at_once(run_agentd, tmp_path):
    """Rank 0 waits in an all-reduce while rank 1 sleeps. Lightning 2.6's SIGTERM handler
    broadcasts from within the handler: rank 1 ran it at once, its broadcast met rank 0's
    all-reduce, and both waited until the stop's timeout killed them (every time; 1 stop
    in 8 of a drained job). The callback's handler makes no collective: Lightning's own
    broadcast at the next batch ends both."""
    installed("lightning")
    out = tmp_path / "apart"
    out.mkdir()
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--stop-timeout",
        "60",
        str(TESTS / "workers" / "lightning_sigterm.py"),
        str(out),
    )
    wait_until(lambda: (out / "0").exists() and (out / "1").exists(), 180, what="ranks apart")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(40) == 128 + signal.SIGTERM, agent.stderr()[-3000:]  # not at 60 s
    assert "still ran" not in agent.stderr()
