"""The result service: ``result.json`` (reserved at start, the outcome at the end) and the
failure report printed for people. See :mod:`agentd.reports.result_file` for the file itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.reports.result_file import ResultFile, outcome

if TYPE_CHECKING:
    from agentd.view import AgentView


class ResultFileService:
    """``result.json`` of ``agent``'s run. Stopped last, so it records how everything
    else ended."""

    def __init__(self, agent: AgentView) -> None:
        self._agent = agent
        self.file = ResultFile(agent.run_dir / "result.json")
        self.written = False
        """Whether the outcome reached the file (not on a full disk without a reservation)."""

    async def start(self) -> None:
        agent = self._agent
        self.file.reserve({"run_id": agent.run_id, "state": "INIT", "outcome": "running"})

    async def stop(self) -> None:
        agent = self._agent
        group = agent.get_worker_group()
        facts = {
            "run_id": agent.run_id,
            "role": group.spec.role,
            "state": group.state.value,
            "restarts": agent.restart_count,
            "attempts": agent.attempt + 1,
            "host": agent.hostname,
        }
        doc = outcome(
            facts, agent.last_result, agent.last_failure, agent.exit_error, agent.lost_peer
        )
        if agent.run_dir.is_dir():
            self.written = self.file.write(doc)

    def failure_report(self) -> str:
        """The text report of the run's failure (empty when it did not fail)."""
        agent = self._agent
        result = agent.last_result
        if result is None or not result.is_failed():
            return ""
        from agentd.reports.failure import format_failure_report

        spec = agent.get_worker_group().spec
        logs = str(agent.run_dir) if spec.keeps_log_files else None
        if logs and agent.logs_specs is not None:
            from agentd.workers.logs_specs import overrides_reify

            if overrides_reify(agent.logs_specs):  # the files are where the user's put them
                logs = None
        return format_failure_report(
            result, agent.run_id, spec.get_entrypoint_name(), agent.lost_peer, logs
        )
