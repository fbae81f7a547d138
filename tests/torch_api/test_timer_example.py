"""torch's documented expiration-timer example, run through both implementations."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import RUNS_SCRIPTS, run_script

pytestmark = RUNS_SCRIPTS


def test_the_documented_timer_example_runs_to_success(impl):
    out = run_script(impl, "timer_example.py", "60", "0.1", str(free_port()))
    assert out["state"] == "SUCCEEDED"
    assert out["ranks"] == [0, 1] and len(out["pids"]) == 2


def test_a_trainer_past_its_expiry_is_reaped_by_the_local_timer_server(impl):
    out = run_script(impl, "timer_example.py", "1", "60", str(free_port()))
    assert out["state"] == "FAILED"
    assert -signal.SIGKILL in out["exitcodes"], out


@pytest.mark.parametrize("impl", ["agentd"])
def test_the_example_as_documented_passes_the_start_method_second(impl):
    """``LocalElasticAgent(spec, start_method)``, as the documentation writes it; torch
    2.13 takes a LogsSpecs in that place and fails, agentd accepts both (README)."""
    out = run_script(impl, "timer_example.py", "60", "0.1", str(free_port()), "doc")
    assert out["state"] == "SUCCEEDED"
