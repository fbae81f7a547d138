"""The agent template's torch-facing behaviour, exercised as torch users (and torch's own
tests) do: a ``SimpleElasticAgent`` subclass with fake workers, called synchronously."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import elastic


def make_agent(impl: str, monitor_states: list[str] | None = None, max_restarts: int = 2):
    server = elastic(impl, "agent.server")
    rdzv = elastic(impl, "rendezvous")
    registry = elastic(impl, "rendezvous.registry")
    errors = elastic(impl, "multiprocessing.errors")
    states = [getattr(server.WorkerState, s) for s in monitor_states or []]

    class FakeAgent(server.SimpleElasticAgent):
        def __init__(self, spec):
            super().__init__(spec)
            self.started = self.stopped = 0

        def _start_workers(self, worker_group):
            self.started += 1
            return {w.local_rank: 100 + w.global_rank for w in worker_group.workers}

        def _stop_workers(self, worker_group, is_restart=False):
            self.stopped += 1

        def _monitor_workers(self, worker_group):
            state = states.pop(0) if states else server.WorkerState.SUCCEEDED
            if state == server.WorkerState.SUCCEEDED:
                return server.RunResult(state, {w.global_rank: None for w in worker_group.workers})
            if state == server.WorkerState.FAILED:
                failure = errors.ProcessFailure(0, 100, 1, "")
                return server.RunResult(state, {}, {0: failure})
            return server.RunResult(state)

        def _shutdown(self, death_sig=None, is_restart=False, timeout=None):
            pass

    params = rdzv.RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{free_port()}",
        run_id=uuid.uuid4().hex,
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        entrypoint="true",
        rdzv_handler=registry.get_rendezvous_handler(params),
        max_restarts=max_restarts,
        monitor_interval=0.01,
    )
    return server, FakeAgent(spec)


def test_steps_called_synchronously_run_to_completion(impl):
    server, agent = make_agent(impl)
    group = agent.get_worker_group()
    agent._initialize_workers(group)
    assert group.state == server.WorkerState.HEALTHY
    assert [w.id for w in group.workers] == [100, 101] and group.master_port > 0
    agent._restart_workers(group)
    assert group.state == server.WorkerState.HEALTHY and agent.started == 2 == agent.stopped + 1


def test_an_unknown_group_ends_the_run_without_spending_a_restart(impl):
    server, agent = make_agent(impl, ["UNKNOWN"])
    with pytest.raises(Exception, match="UNKNOWN"):
        agent.run()
    assert agent.get_worker_group().state == server.WorkerState.UNKNOWN
    assert agent._remaining_restarts == 2


def test_a_run_publishes_torchs_metrics_where_torchs_agent_module_has_put_metric(impl):
    _, agent = make_agent(impl, ["FAILED"])
    with mock.patch(f"{elastic(impl, 'agent.server.api').__name__}.put_metric") as put:
        agent.run()
    put.assert_any_call("workers.trainer.remaining_restarts", 1)  # after the restart
    put.assert_any_call("workers.trainer.run_success_with_retries", 1)
    put.assert_any_call("workers.trainer.flakiness", 33)


def test_the_agents_outcome_event_says_what_torchs_launcher_records(impl):
    _, agent = make_agent(impl)
    agent.run()
    event = agent.get_event_succeeded()
    assert (event.name, event.source) == ("torchelastic.worker.status.SUCCEEDED", "AGENT")
    assert event.metadata["rdzv_backend"] == "static" and event.metadata["role"] == "trainer"
    assert event.metadata["agent_restarts"] == 0


@pytest.mark.parametrize("impl", ["agentd"])
def test_a_failing_exit_barrier_does_not_fail_a_job_that_succeeded(impl):
    """torch's tests check this by patching its store barrier (the docs' deviation table);
    agentd's barrier is the rendezvous', made to fail here with a bug of its own."""
    server, agent = make_agent(impl)

    async def broken_barrier() -> None:
        raise RuntimeError("a bug in a backend's barrier")

    agent.rdzv_handler.exit_barrier = broken_barrier
    assert agent.run().state == server.WorkerState.SUCCEEDED
