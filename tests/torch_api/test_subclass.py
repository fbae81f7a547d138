"""A torch-style subclass of SimpleElasticAgent with plain (sync) step methods."""

from __future__ import annotations

from tests.conftest import free_port
from tests.torch_api.conftest import RUNS_SCRIPTS, run_script

pytestmark = RUNS_SCRIPTS


def test_sync_overrides_run_and_the_monitor_is_paced_by_monitor_interval(impl):
    out = run_script(impl, "subclass.py", "ok", str(free_port()))
    assert out["state"] == "SUCCEEDED" and out["values"] == {"0": "done", "1": "done"}
    assert out["calls"] == 5, out  # not a busy loop: one call per monitor_interval
    assert out["span"] >= 4 * 0.1 * 0.9
    assert out["ids"] == [1000, 1001] and out["shutdowns"] == 1


def test_a_bug_in_an_override_surfaces_with_its_own_traceback(impl):
    out = run_script(impl, "subclass.py", "raise", str(free_port()))
    assert out["error"] == "ValueError: a bug in _monitor_workers"
    assert "in _monitor_workers" in out["traceback"]
    assert "awaitable" not in out["traceback"] and out["shutdowns"] == 1


def test_a_plain_override_calls_up_to_the_agents_own_step(impl):
    """``super()._start_workers(group)`` from a plain override returns the ids, as
    torch's synchronous method does (agentd runs its async step on the agent's loop)."""
    out = run_script(impl, "calls_super.py", str(free_port()))
    assert out["state"] == "SUCCEEDED" and out["started"] == [[0, 1]]
