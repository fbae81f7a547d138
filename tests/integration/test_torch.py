"""Interop with real PyTorch (CPU): skipped cleanly where torch is not installed."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TESTS

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_gloo_all_reduce(run_agentd):
    script = str(TESTS / "workers" / "torch_gloo.py")
    agent = run_agentd("--standalone", "--nproc-per-node", "2", script)
    assert agent.wait(timeout=120) == 0, agent.stderr()
    # both workers share the console unbuffered: their lines may interleave, not change
    out = agent.stdout()
    assert "rank 0/2 all_reduce=3" in out and "rank 1/2 all_reduce=3" in out


def test_torch_record_message_in_report(run_agentd):
    agent = run_agentd(str(TESTS / "workers" / "torch_record.py"))
    assert agent.wait(timeout=120) == 1
    err = agent.stderr()
    assert "message   : RuntimeError: torch-recorded failure: loss is NaN" in err
    assert "torch_record.py" in err
    [result] = agent.log_dir.glob("*/result.json")
    root = json.loads(result.read_text())["root_cause"]
    assert root["message"] == "RuntimeError: torch-recorded failure: loss is NaN"
    assert "in main" in root["traceback"]
