"""The Lightning and Hugging Face callbacks save a checkpoint when a drain asks, on every
rank at the same step, and confirm it (real trainers, one agent)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from agentd.exceptions import DRAINED_ALONE
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
        # Lightning's SIGTERM handler broadcasts from within the handler: the ranks
        # stopped after the drain may block each other until the stop timeout (1 in 5)
        "--stop-timeout",
        "5",
        str(TESTS / "workers" / "lightning_ddp.py"),
        str(root),
        "1000",  # the drain ends it, whenever it comes
    )
    url = health_url(agent)
    wait_until(lambda: stepping(url), 180, what="training to start")
    assert drain_cli("--url", url, "--reason", "test").returncode == 0
    assert agent.wait(180) == DRAINED_ALONE, agent.stderr()[-3000:]  # a standalone job
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
    assert agent.wait(180) == DRAINED_ALONE, agent.stderr()[-3000:]  # a standalone job
    saved = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    assert len(saved) == 1, saved  # the drain's: the schedule makes none
    assert "the checkpoints of this node's 1 worker(s) are saved" in agent.stderr()
